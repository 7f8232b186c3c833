package approval

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Verdict is what an approver (or the clock) decided about a request.
type Verdict string

// Verdicts. Approve, Edit, Reject and Respond come from people; Expire and
// Cancel come from the system and are always treated as a rejection.
// During a cancel window (ModeAfter) a person may Cancel (the call does not
// run: a rejection) or RunNow; when nobody does, the clock's WindowElapsed
// lets it run.
const (
	VerdictApprove       Verdict = "approve"
	VerdictEdit          Verdict = "edit"
	VerdictReject        Verdict = "reject"
	VerdictRespond       Verdict = "respond"
	VerdictExpire        Verdict = "expire"
	VerdictCancel        Verdict = "cancel"
	VerdictRunNow        Verdict = "run_now"
	VerdictWindowElapsed Verdict = "window_elapsed"
)

// Human reports whether a person can choose v on a card.
func (v Verdict) Human() bool {
	switch v {
	case VerdictApprove, VerdictEdit, VerdictReject, VerdictRespond:
		return true
	}
	return false
}

// Clickable reports whether a person may record v with a click: the
// human verdicts of a card, and Cancel or RunNow during a cancel window.
// Which of them a given request accepts is Request.Allows.
func (v Verdict) Clickable() bool {
	return v.Human() || v == VerdictCancel || v == VerdictRunNow
}

// Runs reports whether a final decision with this verdict lets the tool run.
func (v Verdict) Runs() bool {
	return v == VerdictApprove || v == VerdictEdit || v == VerdictRunNow || v == VerdictWindowElapsed
}

// Mode is when the human looks at a request's call.
type Mode string

// Request modes.
const (
	// ModeBefore: nothing runs until a person approves (the default).
	ModeBefore Mode = ""
	// ModeAfter (review: after): the call runs when its cancel window ends
	// (the request's Deadline) unless an approver cancels it first; an
	// approver may also run it at once.
	ModeAfter Mode = "after"
	// ModeSampled: a call that ran without a human (sample: in the
	// policy), recorded after it ran so an approver can review it. It is
	// never pending.
	ModeSampled Mode = "sampled"
	// ModeSettled: a call the gate settled without a human (auto-approved,
	// or refused by a deny rule), recorded already final only so that a
	// caller who polls by call id (the HumanLayer endpoints) can read the
	// answer. It never has a card and is never pending; Result holds the
	// gate's reason for a refusal.
	ModeSettled Mode = "settled"
)

// Kind is what a request asks of a person.
type Kind string

// Request kinds.
const (
	// KindCall (the zero value) asks to approve a tool call.
	KindCall Kind = ""
	// KindContact asks a question (HumanLayer's contact request, "human as
	// a tool"): Args hold the question ({"msg": …, "subject": …}), the only
	// decision is VerdictRespond (the answer, Decision.Text), and nothing
	// runs.
	KindContact Kind = "contact"
)

// ContactTool is the policy tool that governs contact requests (who may
// answer, the deadline): declared under tools, or else the external rule.
const ContactTool = "contact_human"

// Choice is one option a caller offers the person deciding: a reason to
// pick when rejecting a tool call, or an answer to pick for a contact
// request (HumanLayer's ResponseOption).
type Choice struct {
	// Name is the caller's identifier for it, given back in
	// Decision.Choice.
	Name string `json:"name"`
	// Title is how it reads for people (Name when empty).
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// PromptFill is the text used when the person picks it and writes
	// nothing.
	PromptFill string `json:"prompt_fill,omitempty"`
}

// Label is how c reads for people.
func (c Choice) Label() string {
	if c.Title != "" {
		return c.Title
	}
	return c.Name
}

// Text is what picking c says when the person wrote nothing.
func (c Choice) Text() string {
	if c.PromptFill != "" {
		return c.PromptFill
	}
	return c.Label()
}

// Status is where a request is in its life.
//
//	pending → approved | rejected | responded | expired | cancelled
//	approved → executing → executed | failed | unknown
//	approved → abandoned (nobody claimed it within the claim window)
//	approved → refused (judged at its claim: the policy in force refuses it)
//	approved → pending (judged at its claim: the policy in force asks more
//	           approvals of its arguments than it has; Request.Reopened)
type Status string

// Request statuses.
const (
	StatusPending   Status = "pending"
	StatusApproved  Status = "approved"
	StatusRejected  Status = "rejected"
	StatusResponded Status = "responded"
	StatusExpired   Status = "expired"
	StatusCancelled Status = "cancelled"
	StatusExecuting Status = "executing"
	StatusExecuted  Status = "executed"
	StatusFailed    Status = "failed"
	// StatusUnknown marks a request whose execution was claimed by a process
	// that stopped before recording the outcome: the tool may or may not
	// have run, so it is never run again blindly.
	StatusUnknown Status = "unknown"
	// StatusAbandoned marks an approved request that nobody claimed
	// within its claim window (the caller had gone: an MCP client that
	// timed out, an abandoned long poll). Nothing ran, and a later claim
	// is refused.
	StatusAbandoned Status = "abandoned"
	// StatusRefused marks an approved request that the judgement at its
	// claim refused to run (Lifecycle.Claim): its arguments are not the
	// ones approved, do not match the tool's schema, a deny rule in
	// force refuses them, or its caller's key may no longer ask for the
	// tool. Nothing ran, and nothing will; Result says why.
	StatusRefused Status = "refused"
	// StatusLost is never stored: it is how a card shows a request whose
	// record vanished from the store (Redis lost its data) while a run
	// waited on it. Nothing ran.
	StatusLost Status = "lost"
)

// Decided reports whether s is past pending (a final decision exists).
func (s Status) Decided() bool { return s != StatusPending && s != "" }

// Risk is a tool's declared risk level.
type Risk string

// Risk levels.
const (
	RiskLow    Risk = "low"
	RiskMedium Risk = "medium"
	RiskHigh   Risk = "high"
)

// ToolCall is one tool call proposed by the model.
type ToolCall struct {
	// ID is the model's tool_call_id.
	ID   string          `json:"id"`
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args"`
	// Reason is the model's stated reason, unverified.
	Reason string `json:"reason,omitempty"`
	// Confidence is the model's self-reported confidence in [0,1], nil when
	// the model gave none.
	Confidence *float64 `json:"confidence,omitempty"`
	// Annotations are the tool's own hints (an MCP tool's annotations);
	// only a tool the policy does not declare is judged by them, and never
	// less strictly than the external rule (Gate.AssessExternal).
	Annotations *ToolAnnotations `json:"annotations,omitempty"`
}

// ToolAnnotations are a tool's hints about itself, as MCP defines them. A
// nil field is unknown and takes MCP's default: not read-only, destructive,
// open-world.
type ToolAnnotations struct {
	ReadOnly    *bool `json:"read_only,omitempty"`
	Destructive *bool `json:"destructive,omitempty"`
	OpenWorld   *bool `json:"open_world,omitempty"`
}

// Rule returns the review and risk the hints call for: read-only → never,
// low; destructive (the default) → always, high; otherwise auto, medium
// for an open-world tool (the default) and low for a closed one.
func (h ToolAnnotations) Rule() (Review, Risk) {
	is := func(b *bool, def bool) bool {
		if b == nil {
			return def
		}
		return *b
	}
	switch {
	case is(h.ReadOnly, false):
		return ReviewNever, RiskLow
	case is(h.Destructive, true):
		return ReviewAlways, RiskHigh
	case is(h.OpenWorld, true):
		return ReviewAuto, RiskMedium
	default:
		return ReviewAuto, RiskLow
	}
}

// Fact is one labelled value from a system of record, shown on a card.
type Fact struct {
	Label string `json:"label"`
	Value string `json:"value"`
}

// Preview is what will happen, from the system of record. When the source
// could not be read, Error says so plainly (status, what was asked) and
// Facts may be empty; model text never stands in for system data.
type Preview struct {
	Summary string `json:"summary,omitempty"`
	Facts   []Fact `json:"facts,omitempty"`
	Source  string `json:"source,omitempty"`
	Error   string `json:"error,omitempty"`
	// CallerFacts are facts the caller of the HTTP API sent with its
	// request: shown on the card apart from the system-of-record facts,
	// labelled as supplied by the caller (unverified).
	CallerFacts []Fact `json:"caller_facts,omitempty"`
}

// Signal is one policy signal that fired, in plain words.
type Signal struct {
	// Code is stable for machines: risk_high, sensitive_capability,
	// low_confidence, when_rule, review_always.
	Code string `json:"code"`
	// Text explains it to people, e.g. "it can spend money (a sensitive
	// capability)".
	Text string `json:"text"`
}

// Approvers says who may decide a request. An empty value means members of
// the approvals channel.
type Approvers struct {
	Users      []string `json:"users,omitempty"`
	Usergroups []string `json:"usergroups,omitempty"`
	// ChannelMembers admits members of the approvals channel.
	ChannelMembers bool `json:"channel_members,omitempty"`
	// AllowSelf lets the requester decide their own request (four-eyes off).
	AllowSelf bool `json:"allow_self,omitempty"`
}

// Origin is where the task came from.
type Origin struct {
	Team      string `json:"team,omitempty"`
	Channel   string `json:"channel,omitempty"`
	ThreadTS  string `json:"thread_ts,omitempty"`
	Permalink string `json:"permalink,omitempty"`
}

// Caller names who created a request from outside Countersign's own agent
// loop: an HTTP API key today. Such a request has no task thread (its
// Origin is empty): its card says who asked, and nothing is posted in a
// thread for it.
type Caller struct {
	// Kind is the surface: CallerAPI or CallerHumanLayer.
	Kind string `json:"kind,omitempty"`
	// Name is the API key's name from the policy file.
	Name string `json:"name,omitempty"`
	// Upstream names the MCP upstream server a call came from through
	// the MCP gateway (its name in the policy file), "" otherwise.
	Upstream string `json:"upstream,omitempty"`
	// Gateway names the gateway that checked the call on the caller's
	// behalf (GatewayExtAuthz), "" when none.
	Gateway string `json:"gateway,omitempty"`
	// Route is the gateway's route the call came by, as the gateway names
	// it, "" when not given.
	Route string `json:"route,omitempty"`
}

// GatewayExtAuthz is Caller.Gateway of a call checked by Envoy's external
// authorization (ext_authz): the gateway can let the request through or
// deny it, never change it.
const GatewayExtAuthz = "ext_authz"

// AppliesEdits reports whether c can run a call with arguments an
// approver edited. HumanLayer's SDKs run the function with the arguments
// they sent whenever approved is true, and have no field for changed
// ones; an ext_authz gateway can only allow or deny the request it holds.
// An edit is not offered on their requests (Lifecycle.Propose).
func (c Caller) AppliesEdits() bool {
	return c.Kind != CallerHumanLayer && c.Gateway != GatewayExtAuthz
}

// Caller kinds: the native HTTP API (/v1) and its HumanLayer-compatible
// endpoints (/humanlayer/v1).
const (
	CallerAPI        = "api"
	CallerHumanLayer = "humanlayer"
)

// External reports whether c names an outside caller.
func (c Caller) External() bool { return c.Kind != "" }

// PendingRef is an entry of the pending index: a request's id and when it
// was created.
type PendingRef struct {
	ID      string
	Created time.Time
}

// CardRef locates the approval card in Slack.
type CardRef struct {
	Channel string `json:"channel,omitempty"`
	TS      string `json:"ts,omitempty"`
}

// Bound reports whether c names a posted message.
func (c CardRef) Bound() bool { return c.Channel != "" && c.TS != "" }

// Request is one gated tool call waiting for, or past, a human decision. The
// durable copy in the store is the truth.
type Request struct {
	ID        string `json:"id"`
	RunID     string `json:"run_id"`
	CallID    string `json:"call_id,omitempty"`
	Requester string `json:"requester"`
	// Requesters are everyone who counts as having asked for the call
	// (four-eyes: none of them may approve it): Requester and, for the
	// agent's own runs, everyone who posted in the task thread since the
	// run began. Empty means Requester alone.
	Requesters []string `json:"requesters,omitempty"`
	Origin     Origin   `json:"origin"`
	// Caller is set for a request made through the HTTP API (no task
	// thread); zero for the agent's own.
	Caller Caller `json:"caller,omitzero"`
	// Kind is KindContact for a question; KindCall (zero) for a tool call.
	Kind Kind `json:"kind,omitempty"`
	// Choices are the caller's options for the person deciding: reasons
	// to reject a tool call, or answers to a question (KindContact).
	Choices []Choice `json:"choices,omitempty"`
	// CallerState is the caller's own data, given back to it unchanged
	// (HumanLayer's spec.state); never shown, never interpreted.
	CallerState json.RawMessage `json:"caller_state,omitempty"`

	Tool string          `json:"tool"`
	Risk Risk            `json:"risk,omitempty"`
	Args json.RawMessage `json:"args"`
	// InputSchema is the JSON Schema of a tool the policy does not
	// declare, as its caller supplied it (an MCP tool's inputSchema, or
	// the API's input_schema); nil when none was given. A declared tool's
	// schema is the policy's.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// Undeclared says the policy declares no rule of Tool: the call was
	// judged by the policy's external rule (its card says so).
	Undeclared bool `json:"undeclared,omitempty"`
	// Digest is Digest(Args): approvals are bound to it.
	Digest     string   `json:"digest"`
	Reason     string   `json:"reason,omitempty"`
	Confidence *float64 `json:"confidence,omitempty"`
	Preview    Preview  `json:"preview"`
	Signals    []Signal `json:"signals,omitempty"`

	Decisions []Verdict `json:"decisions"`
	Quorum    int       `json:"quorum"`
	Approvers Approvers `json:"approvers"`
	// Preauthorize is how long an approver may allow further calls like
	// this one (ToolPolicy.Preauthorize); zero when not offered.
	Preauthorize time.Duration `json:"preauthorize,omitempty"`
	// PreauthorizeLimits bound that pre-authorisation.
	PreauthorizeLimits GrantLimits `json:"preauthorize_limits,omitzero"`
	// Confirm asks "are you sure?" (Slack's confirm dialog) before an
	// approval counts (ToolPolicy.Confirm).
	Confirm bool `json:"confirm,omitempty"`
	// StepUp, when set, says an approving vote needs a confirmation
	// (passkey, single sign-on): what the card tells, set at proposal
	// from the policy; Decide judges with the policy in force too.
	StepUp *StepUpNeed `json:"step_up,omitempty"`
	// Formats say how arguments read for people (ToolPolicy.Formats).
	Formats map[string]ValueFormat `json:"formats,omitempty"`

	// Mode is ModeAfter for a call that runs unless cancelled in time.
	Mode    Mode      `json:"mode,omitempty"`
	Created time.Time `json:"created"`
	// Deadline is when a pending request expires (fail closed), or under
	// ModeAfter when its cancel window ends and the call runs.
	Deadline time.Time `json:"deadline"`
	Status   Status    `json:"status"`

	// Approvals are the distinct approvals counted toward Quorum so far.
	Approvals []Decision `json:"approvals,omitempty"`
	// Decision is the final decision, nil while pending.
	Decision *Decision `json:"decision,omitempty"`
	// OriginalArgs holds the proposed arguments once an edit replaced Args.
	OriginalArgs json.RawMessage `json:"original_args,omitempty"`

	Card CardRef `json:"card"`
	// Result is the execution outcome (tool output or error), once known.
	Result string `json:"result,omitempty"`
	// Escalated is set once the request was escalated (the tool's
	// EscalateAfter passed while it was pending); nil otherwise.
	Escalated *Escalation `json:"escalated,omitempty"`
	// Grant is the pre-authorisation given with this request's approval,
	// if any (its card shows it and offers to revoke it).
	Grant *Grant `json:"grant,omitempty"`
	// TraceID is the trace of the run that asked (W3C, 32 hex digits), ""
	// when traces are off: every audit entry of the request carries it,
	// also those written by a click or the expiry sweep.
	TraceID string `json:"trace_id,omitempty"`
	// Feedback is an approver's judgement of the request after the fact
	// (Mark as wrong, or a sampled call's review); nil when none.
	Feedback *Feedback `json:"feedback,omitempty"`
	// ClaimWindow is how long after its approval an outside caller's
	// request waits to be claimed (LifecycleOptions.ClaimWindow, set by
	// Create): unclaimed by then it ends StatusAbandoned. Zero for the
	// agent's own requests, whose runs are durable and adopted.
	ClaimWindow time.Duration `json:"claim_window,omitempty"`
	// Reopened is set when the request, once approved, went back to
	// pending at its claim because the policy in force asks more
	// approvals of its arguments than it had (Lifecycle.Claim): the card
	// asks for the rest and says why. Its Deadline is the request's.
	Reopened *Reopening `json:"reopened,omitempty"`
	// ClaimHash is the hex SHA-256 of the claim token the winning claim
	// was given (Lifecycle.ClaimToken); empty when unclaimed or claimed
	// in-process without one. Never the token itself.
	ClaimHash string `json:"-"`
	// Rev is the stored record's revision: every change of what a
	// person is shown or judged (each transition, a card bound, an
	// escalation, a grant, feedback) raises it by one, in the script that
	// makes the change. Zero for a request not read from the store (or
	// stored before revisions). A decision may be conditional on it
	// (Decision.Rev).
	Rev int64 `json:"-"`
}

// Reopening records that an approved request went back to pending at its
// claim (Request.Reopened): the approvals its arguments need under the
// policy in force, how many it had, why in words, when, and its new
// deadline.
type Reopening struct {
	At       time.Time `json:"at"`
	Need     int       `json:"need"`
	Have     int       `json:"have"`
	Reason   string    `json:"reason"`
	Deadline time.Time `json:"deadline"`
}

// Feedback is an approver's judgement of a final request after the fact:
// Mark as wrong on any final card, or Looks right / Wrong on a sampled
// call's review card. A request is marked wrong at most once; a "looks
// right" may later be overruled by a mark as wrong.
type Feedback struct {
	Wrong  bool      `json:"wrong"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// Markable reports whether r's card offers Mark as wrong: a human (or a
// sample) settled it and nothing more is going to happen to it — it ran,
// or a person rejected it or answered instead — and it is not already
// marked wrong.
func (r *Request) Markable() bool {
	if r.Feedback != nil && r.Feedback.Wrong {
		return false
	}
	switch r.Status {
	case StatusExecuted, StatusFailed, StatusUnknown, StatusRejected, StatusResponded:
		return r.Decision != nil || r.Mode == ModeSampled
	}
	return false
}

// Escalation records that a pending request was escalated: when, to whom,
// and whether they were added to Approvers (WidenOnEscalation).
type Escalation struct {
	At      time.Time `json:"at"`
	To      Approvers `json:"to"`
	Widened bool      `json:"widened,omitempty"`
}

// Allows reports whether v may be chosen on this request. Reject is always
// allowed: nobody can be forced to approve. In a cancel window (ModeAfter)
// only Cancel and RunNow are.
func (r *Request) Allows(v Verdict) bool {
	if r.Mode == ModeAfter {
		return v == VerdictCancel || v == VerdictRunNow
	}
	return v == VerdictReject || slices.Contains(r.Decisions, v)
}

// Decision is one person's (or the clock's) decision on a request.
type Decision struct {
	RequestID string  `json:"request_id"`
	Verdict   Verdict `json:"verdict"`
	// Args are the edited arguments (VerdictEdit only).
	Args json.RawMessage `json:"args,omitempty"`
	// Text is the reason (reject) or the response (respond).
	Text string `json:"text,omitempty"`
	// Choice names the request's Choice the person picked, if any.
	Choice   string    `json:"choice,omitempty"`
	Approver string    `json:"approver"`
	At       time.Time `json:"at"`
	// Digest is the argument digest the approver saw on the card.
	Digest string `json:"digest"`
	// Quorum and Signals are an edit's judgement (VerdictEdit only; set
	// by Lifecycle.Decide, whatever the caller passed): the approvals the
	// edited call needs and the signals that fired for it. The request's
	// quorum is raised to Quorum, never lowered.
	Quorum  int      `json:"quorum,omitempty"`
	Signals []Signal `json:"signals,omitempty"`
	// StepUp is the verified confirmation of this vote (a passkey, a
	// single sign-on), set only by the step-up page (Lifecycle.
	// DecideSteppedUp); Decide refuses a vote that needs one without it.
	StepUp *StepUpProof `json:"step_up,omitempty"`
	// Rev, when above zero, makes the decision conditional: it is
	// recorded only while the stored request is still at that revision
	// (Request.Rev), the copy it was judged on; else ErrMoved. Not
	// stored.
	Rev int64 `json:"-"`
}

// PrepareNew checks a request about to be created and fills in what the
// store would: Status (pending, unless the request is final from the
// start), Digest when empty, Created (now) when zero and Quorum when below
// 1. A sampled request (ModeSampled: a call that already ran) must be
// executed or failed, a settled one (ModeSettled: the gate answered
// without a human) approved or rejected; both are final from the start,
// never pending. It returns ErrInvalidArgs for an empty id, a digest that
// does not match Args, or a status that does not fit the mode. The store
// and its in-memory double both call it, so they accept the same requests.
func PrepareNew(r *Request, now time.Time) error {
	if r.ID == "" {
		return fmt.Errorf("create request: empty id: %w", ErrInvalidArgs)
	}
	digest, err := Digest(r.Args)
	if err != nil {
		return fmt.Errorf("create request %s: %w", r.ID, err)
	}
	if r.Digest == "" {
		r.Digest = digest
	} else if r.Digest != digest {
		return fmt.Errorf("create request %s: digest does not match arguments: %w", r.ID, ErrInvalidArgs)
	}
	final := r.Mode == ModeSampled || r.Mode == ModeSettled
	switch {
	case r.Mode == ModeSampled && r.Status != StatusExecuted && r.Status != StatusFailed:
		return fmt.Errorf("create request %s: sampled with status %q, want executed or failed: %w", r.ID, r.Status, ErrInvalidArgs)
	case r.Mode == ModeSettled && r.Status != StatusApproved && r.Status != StatusRejected:
		return fmt.Errorf("create request %s: settled with status %q, want approved or rejected: %w", r.ID, r.Status, ErrInvalidArgs)
	case !final && r.Status != "" && r.Status != StatusPending:
		return fmt.Errorf("create request %s: status %s, want pending: %w", r.ID, r.Status, ErrInvalidArgs)
	case !final:
		r.Status = StatusPending
	}
	if r.Created.IsZero() {
		r.Created = now
	}
	r.Quorum = max(r.Quorum, 1)
	return nil
}
