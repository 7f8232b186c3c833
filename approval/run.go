package approval

// Task is a message from a person that starts or continues a run. Runs are
// keyed by their origin thread: a follow-up in the same thread continues
// the conversation.
type Task struct {
	// EventID is the chat platform's event id (for logs and de-duplication).
	EventID   string `json:"event_id,omitempty"`
	Requester string `json:"requester"`
	Origin    Origin `json:"origin"`
	Text      string `json:"text"`
}

// RunStatus is where a run is.
type RunStatus string

// Run statuses.
const (
	RunActive   RunStatus = "active"  // talking to the model or running tools
	RunWaiting  RunStatus = "waiting" // waiting for one or more decisions
	RunDone     RunStatus = "done"
	RunFailed   RunStatus = "failed"
	RunStopped  RunStatus = "stopped" // stop_on_rejection ended it
	RunMaxSteps RunStatus = "max_steps"
)

// RunResult is what the bot posts when a run (or one turn of it) ends.
type RunResult struct {
	RunID  string    `json:"run_id"`
	Origin Origin    `json:"origin"`
	Status RunStatus `json:"status"`
	// Answer is the model's final text, or a clear message when the run
	// failed or hit max steps.
	Answer   string `json:"answer"`
	AutoRun  int    `json:"auto_run"`
	Approved int    `json:"approved"` // a person approved them (Approve, or Run now in a cancel window)
	// AfterWindow counts calls that ran because their cancel window ended
	// with nobody cancelling them: nobody approved them.
	AfterWindow int `json:"after_window,omitempty"`
	Edited      int `json:"edited"`
	Rejected    int `json:"rejected"`
	Responded   int `json:"responded"`
	Expired     int `json:"expired"`
	Refused     int `json:"refused"` // calls refused before any human saw them (bad tool/args)
	// Preauthorized counts calls run under an approver's grant (reviewed in
	// advance, by PreauthorizedBy); they are not in AutoRun.
	Preauthorized   int      `json:"preauthorized,omitempty"`
	PreauthorizedBy []string `json:"preauthorized_by,omitempty"`
	// Denied counts calls a deny rule refused (not in Refused).
	Denied int `json:"denied,omitempty"`
	// RejectionReasons are "tool: reason (<@approver>)", one per rejection.
	RejectionReasons []string `json:"rejection_reasons,omitempty"`
}
