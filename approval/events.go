package approval

import (
	"encoding/json"
	"time"
)

// Typed data of the audit events a request's lifecycle writes. Each is the
// Data of a Record; the JSON keys are the audit stream's (docs/operations.md)
// and what approval/auditreport reads.

// RequestedEvent is the data of EventRequested: what the approver will be
// shown.
type RequestedEvent struct {
	CallID       string          `json:"call_id"`
	Args         json.RawMessage `json:"args"`
	Digest       string          `json:"digest"`
	Deadline     time.Time       `json:"deadline"`
	Quorum       int             `json:"quorum"`
	Signals      []Signal        `json:"signals"`
	Preview      Preview         `json:"preview"`
	PreviewError string          `json:"preview_error"`
	Decisions    []Verdict       `json:"decisions"`
	Created      time.Time       `json:"created"`
	Reason       string          `json:"reason"`
	Confidence   *float64        `json:"confidence"`
	Requester    string          `json:"requester"`
}

// DecidedEvent is the data of EventDecided and EventApprovalVote (a vote
// short of the quorum: Approvals and Quorum set).
type DecidedEvent struct {
	Verdict    Verdict   `json:"verdict"`
	Digest     string    `json:"digest"`
	Status     Status    `json:"status"`
	Created    time.Time `json:"created"`
	DecisionMS int64     `json:"decision_ms"`
	Approvals  int       `json:"approvals,omitempty"`
	Quorum     int       `json:"quorum,omitempty"`
	Text       string    `json:"text,omitempty"`
	// An edit's arguments, the ones it replaced, and their new digest.
	Args         json.RawMessage `json:"args,omitempty"`
	OriginalArgs json.RawMessage `json:"original_args,omitempty"`
	NewDigest    string          `json:"new_digest,omitempty"`
}

// GrantedEvent is the data of EventGranted.
type GrantedEvent struct {
	GrantID   string    `json:"grant_id"`
	Requester string    `json:"requester"`
	Channel   string    `json:"channel"`
	ThreadTS  string    `json:"thread_ts"`
	Expires   time.Time `json:"expires"`
}

// ExpiredEvent is the data of EventExpired.
type ExpiredEvent struct {
	Deadline time.Time `json:"deadline"`
	Created  time.Time `json:"created"`
}

// ReasonEvent is the data of EventCancelled and EventLost.
type ReasonEvent struct {
	Reason string `json:"reason"`
}

// ExecutingEvent is the data of EventExecuting.
type ExecutingEvent struct {
	CallID string          `json:"call_id"`
	Args   json.RawMessage `json:"args"`
	Gated  bool            `json:"gated"`
	Retry  bool            `json:"retry"`
}

// ExecutedEvent is the data of EventExecuted and EventFailed.
type ExecutedEvent struct {
	CallID     string `json:"call_id"`
	Result     string `json:"result"`
	DurationMS int64  `json:"duration_ms"`
}

// CallEvent is the data of EventOutcomeUnknown.
type CallEvent struct {
	CallID string `json:"call_id"`
}

// ScheduledEvent is the data of EventScheduled: the call of a review-after
// request runs at RunAt unless an approver cancels it first.
type ScheduledEvent struct {
	RunAt    time.Time `json:"run_at"`
	WindowMS int64     `json:"window_ms"`
}

// WindowDecisionEvent is the data of EventRunNow, and of EventCancelled
// when an approver cancelled a call in its cancel window (Verdict cancel;
// a cancel by the system has ReasonEvent data).
type WindowDecisionEvent struct {
	Verdict    Verdict   `json:"verdict"`
	Reason     string    `json:"reason,omitempty"`
	Digest     string    `json:"digest"`
	RunAt      time.Time `json:"run_at"`
	Created    time.Time `json:"created"`
	DecisionMS int64     `json:"decision_ms"`
}

// WindowElapsedEvent is the data of EventWindowElapsed.
type WindowElapsedEvent struct {
	RunAt   time.Time `json:"run_at"`
	Created time.Time `json:"created"`
}

// SampledEvent is the data of EventSampled: a call that ran without a
// human, as its review card shows it.
type SampledEvent struct {
	CallID    string          `json:"call_id"`
	Args      json.RawMessage `json:"args"`
	Digest    string          `json:"digest"`
	Preview   Preview         `json:"preview"`
	Status    Status          `json:"status"`
	Result    string          `json:"result"`
	Rate      float64         `json:"rate"`
	Created   time.Time       `json:"created"`
	Requester string          `json:"requester"`
}

// FeedbackEvent is the data of EventMarkedWrong and EventSampleReviewed:
// who judged what. Verdict and DecidedBy are the decision judged (empty
// for a sampled call, which nobody decided), Status where the request
// ended.
type FeedbackEvent struct {
	Reason    string    `json:"reason,omitempty"`
	Status    Status    `json:"status"`
	Verdict   Verdict   `json:"verdict,omitempty"`
	DecidedBy string    `json:"decided_by,omitempty"`
	Sampled   bool      `json:"sampled,omitempty"`
	Created   time.Time `json:"created"`
}
