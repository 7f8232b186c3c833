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
	// Requesters are everyone who counts as having asked (Request.Requesters:
	// every author in the task thread since the run began), when more than
	// the requester.
	Requesters []string `json:"requesters,omitempty"`
	// Kind is "contact" for a question (Args hold it); empty for a call.
	Kind Kind `json:"kind,omitempty"`
	// Choices are the caller's options offered to the person deciding.
	Choices []Choice `json:"choices,omitempty"`
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
	// Choice names the caller's option the person picked, if any.
	Choice string `json:"choice,omitempty"`
	// Reason is the approver's reason where older entries kept it (Text
	// holds it since).
	Reason string `json:"reason,omitempty"`
	// An edit's arguments, the ones it replaced, and their new digest.
	Args         json.RawMessage `json:"args,omitempty"`
	OriginalArgs json.RawMessage `json:"original_args,omitempty"`
	NewDigest    string          `json:"new_digest,omitempty"`
	// Signals are what fired for an edit's arguments, judged as a new
	// proposal (Quorum is then the request's quorum after the edit).
	Signals []Signal `json:"signals,omitempty"`
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

// AbandonedEvent is the data of EventAbandoned: the request was approved
// (by Approver, at ApprovedAt) but its outside caller never claimed it
// within ClaimWindowMS, so nothing ran and nothing may.
type AbandonedEvent struct {
	Approver      string    `json:"approver,omitempty"`
	ApprovedAt    time.Time `json:"approved_at"`
	ClaimWindowMS int64     `json:"claim_window_ms"`
	Caller        string    `json:"caller,omitempty"`
	Created       time.Time `json:"created"`
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

// ExecutedEvent is the data of EventExecuted and of EventFailed for a call
// that ran: its result (or, from older writers, an error text) and how long
// it took.
type ExecutedEvent struct {
	CallID     string `json:"call_id"`
	Result     string `json:"result"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}

// CallEvent is the data of EventOutcomeUnknown.
type CallEvent struct {
	CallID string `json:"call_id"`
}

// RunStartedEvent is the data of EventRunStarted: a task the run took in.
type RunStartedEvent struct {
	Origin   Origin `json:"origin"`
	Text     string `json:"text"`
	EventID  string `json:"event_id"`
	FollowUp bool   `json:"follow_up"`
}

// RunFinishedEvent is the data of EventRunFinished.
type RunFinishedEvent struct {
	Status RunStatus `json:"status"`
	Steps  int       `json:"steps"`
	Result RunResult `json:"result"`
}

// ProposedEvent is the data of EventProposed: the call as the model wrote
// it (its arguments, or their raw text as a JSON string when they did not
// parse) and the model's stated reason and confidence.
type ProposedEvent struct {
	CallID     string          `json:"call_id"`
	Args       json.RawMessage `json:"args"`
	Reason     string          `json:"reason,omitempty"`
	Confidence *float64        `json:"confidence,omitempty"`
}

// AssessedEvent is the data of EventAssessed: what the gate found.
type AssessedEvent struct {
	CallID     string   `json:"call_id"`
	NeedsHuman bool     `json:"needs_human"`
	Signals    []Signal `json:"signals"`
	Quorum     int      `json:"quorum"`
}

// RememberedEvent is the data of EventRemembered: ask-once memory let an
// identical call through.
type RememberedEvent struct {
	CallID    string `json:"call_id"`
	Digest    string `json:"digest"`
	Requester string `json:"requester"`
}

// PreauthorizedEvent is the data of EventPreauthorized: a call ran under a
// grant.
type PreauthorizedEvent struct {
	CallID         string    `json:"call_id"`
	GrantID        string    `json:"grant_id"`
	GrantedBy      string    `json:"granted_by"`
	GrantRequestID string    `json:"grant_request_id"`
	Expires        time.Time `json:"expires"`
	Signals        []Signal  `json:"signals"`
	// Uses and Spent are the grant's count and total after this call;
	// Amount is this call's share of a budgeted total.
	Uses   int     `json:"uses,omitempty"`
	Spent  float64 `json:"spent,omitempty"`
	Amount float64 `json:"amount,omitempty"`
}

// CallErrorEvent is the data of EventCallRefused, and of EventFailed when
// a call was stopped before it ran: why, the deny rule that refused it if
// one did, and the arguments refused.
type CallErrorEvent struct {
	CallID   string          `json:"call_id"`
	Error    string          `json:"error"`
	DenyRule string          `json:"deny_rule,omitempty"`
	Args     json.RawMessage `json:"args,omitempty"`
}

// ReopenedEvent is the data of EventReopened: the approvals the policy in
// force asks of the request's arguments at its claim, how many it had,
// why in words, and its new deadline.
type ReopenedEvent struct {
	Need     int       `json:"need"`
	Have     int       `json:"have"`
	Reason   string    `json:"reason"`
	Deadline time.Time `json:"deadline,omitzero"`
}

// CardPostedEvent is the data of EventCardPosted: where the card is.
type CardPostedEvent struct {
	Channel string `json:"channel"`
	TS      string `json:"ts"`
}

// RefusalEvent is the data of EventDecisionRefuse: a click or submission
// that changed nothing. Reason is a short code (not_approver,
// already_decided, foreign_team, …); Team names the other workspace of a
// foreign_team refusal.
type RefusalEvent struct {
	Verdict Verdict `json:"verdict,omitempty"`
	Reason  string  `json:"reason"`
	Team    string  `json:"team,omitempty"`
	// Code is the short code where older entries kept it apart from a
	// Reason in words.
	Code string `json:"code,omitempty"`
}

// StepUpEvent is the data of the step-up events (EventStepUpOffered,
// EventStepUpVerified, EventStepUpRefused): the vote, the methods offered or
// the one used, the credential that confirmed, and for a refusal why as a
// short code (link_used_or_expired, passkey_not_verified, digest_changed, …).
type StepUpEvent struct {
	Verdict    Verdict        `json:"verdict,omitempty"`
	Methods    []StepUpMethod `json:"methods,omitempty"`
	Credential string         `json:"passkey_id,omitempty"`
	Digest     string         `json:"digest,omitempty"`
	Allow      bool           `json:"allow,omitempty"`
	Reason     string         `json:"reason,omitempty"`
}

// PasskeyEvent is the data of the passkey enrollment events: whose
// passkey, its id, who vouched for the enrollment (four-eyes) or the
// identity provider's email that did, and for a refusal why.
type PasskeyEvent struct {
	User       string `json:"user"`
	Credential string `json:"passkey_id,omitempty"`
	VouchedBy  string `json:"vouched_by,omitempty"`
	Email      string `json:"email,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// GrantRevokedEvent is the data of EventGrantRevoked.
type GrantRevokedEvent struct {
	GrantID   string `json:"grant_id"`
	GrantedBy string `json:"granted_by"`
	RevokedBy string `json:"revoked_by"`
}

// RemindedEvent is the data of EventReminded: the n-th reminder.
type RemindedEvent struct {
	N            int       `json:"n"`
	WaitingSince time.Time `json:"waiting_since"`
	Deadline     time.Time `json:"deadline"`
}

// EscalatedEvent is the data of EventEscalated.
type EscalatedEvent struct {
	To        Approvers `json:"to"`
	Widened   bool      `json:"widened"`
	Approvers Approvers `json:"approvers"`
}

// APIRefusedEvent is the data of EventAPIRefused: an HTTP API call that
// changed nothing. Key is the API key's name ("" when no valid key was
// given, never the key itself); Status the HTTP status answered; Code a
// short code (unauthenticated, forbidden_tool, invalid_field,
// body_too_large, rate_limited, …); Field the offending JSON field.
type APIRefusedEvent struct {
	Key       string `json:"key,omitempty"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	Status    int    `json:"status"`
	Code      string `json:"code"`
	Field     string `json:"field,omitempty"`
	Message   string `json:"message"`
	HTTPReqID string `json:"http_request_id,omitempty"`
	// Source is where a refusal without a valid key came from: the remote
	// address and a fingerprint of the key presented ("no key", or the
	// first bytes of its SHA-256: never the key). Refusals are written
	// at most once a minute per source — without a valid key per Source,
	// of a valid key per Key and Code — the entry standing for Count
	// refusals: this one and those held since Since.
	Source string    `json:"source,omitempty"`
	Count  int       `json:"count,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// WebhookEvent is the data of EventWebhookSent and EventWebhookFailed:
// one delivery attempt of a final decision to an endpoint (Endpoint is its
// name or host, never its secret). GaveUp marks the last failed attempt.
type WebhookEvent struct {
	DeliveryID string `json:"delivery_id"`
	Endpoint   string `json:"endpoint"`
	Attempt    int    `json:"attempt"`
	HTTPStatus int    `json:"http_status,omitempty"`
	Error      string `json:"error,omitempty"`
	GaveUp     bool   `json:"gave_up,omitempty"`
}

// DecodeEvent decodes e's data into the typed struct its event writes and
// returns a pointer to it (*RequestedEvent for EventRequested, …); nil for
// an event without data. Readers switch on the type. Data of another
// shape decodes field by field, so one odd field of an old or foreign
// entry keeps the rest.
func DecodeEvent(e Entry) any {
	mk, ok := eventData[e.Event]
	if !ok {
		return nil
	}
	v := mk(e.Data)
	decodeLenient(e.Data, v)
	return v
}

// eventData makes, for each event with data, the typed struct its data
// decodes into (DecodeEvent). An event whose data had two shapes picks by
// the data.
var eventData = map[Event]func(data json.RawMessage) any{
	EventRunStarted:      newEvent[RunStartedEvent],
	EventRunFinished:     newEvent[RunFinishedEvent],
	EventProposed:        newEvent[ProposedEvent],
	EventAssessed:        newEvent[AssessedEvent],
	EventAutoApproved:    newEvent[CallEvent],
	EventOutcomeUnknown:  newEvent[CallEvent],
	EventRemembered:      newEvent[RememberedEvent],
	EventPreauthorized:   newEvent[PreauthorizedEvent],
	EventGranted:         newEvent[GrantedEvent],
	EventGrantRevoked:    newEvent[GrantRevokedEvent],
	EventRequested:       newEvent[RequestedEvent],
	EventCardPosted:      newEvent[CardPostedEvent],
	EventApprovalVote:    newEvent[DecidedEvent],
	EventDecided:         newEvent[DecidedEvent],
	EventDecisionRefuse:  newEvent[RefusalEvent],
	EventExpired:         newEvent[ExpiredEvent],
	EventLost:            newEvent[ReasonEvent],
	EventAbandoned:       newEvent[AbandonedEvent],
	EventReopened:        newEvent[ReopenedEvent],
	EventScheduled:       newEvent[ScheduledEvent],
	EventRunNow:          newEvent[WindowDecisionEvent],
	EventWindowElapsed:   newEvent[WindowElapsedEvent],
	EventSampled:         newEvent[SampledEvent],
	EventSampleReviewed:  newEvent[FeedbackEvent],
	EventMarkedWrong:     newEvent[FeedbackEvent],
	EventReminded:        newEvent[RemindedEvent],
	EventEscalated:       newEvent[EscalatedEvent],
	EventExecuting:       newEvent[ExecutingEvent],
	EventExecuted:        newEvent[ExecutedEvent],
	EventCallRefused:     newEvent[CallErrorEvent],
	EventAPIRefused:      newEvent[APIRefusedEvent],
	EventWebhookSent:     newEvent[WebhookEvent],
	EventWebhookFailed:   newEvent[WebhookEvent],
	EventStepUpOffered:   newEvent[StepUpEvent],
	EventStepUpVerified:  newEvent[StepUpEvent],
	EventStepUpRefused:   newEvent[StepUpEvent],
	EventPasskeyOffered:  newEvent[PasskeyEvent],
	EventPasskeyEnrolled: newEvent[PasskeyEvent],
	EventPasskeyRefused:  newEvent[PasskeyEvent],
	EventPasskeyRevoked:  newEvent[PasskeyEvent],
	// A call that ran and failed has a duration; a call stopped before it
	// ran has none.
	EventFailed: eitherEvent[ExecutedEvent, CallErrorEvent](func(data json.RawMessage) bool {
		var probe struct {
			DurationMS json.RawMessage `json:"duration_ms"`
			Result     json.RawMessage `json:"result"`
		}
		return json.Unmarshal(data, &probe) == nil && (probe.DurationMS != nil || probe.Result != nil)
	}),
	// An approver's cancel in a cancel window carries its verdict; a
	// cancel by the system only why.
	EventCancelled: eitherEvent[WindowDecisionEvent, ReasonEvent](func(data json.RawMessage) bool {
		var probe struct {
			Verdict *string `json:"verdict"`
		}
		return json.Unmarshal(data, &probe) == nil && probe.Verdict != nil
	}),
}

// newEvent makes an empty T, for events whose data has one shape.
func newEvent[T any](json.RawMessage) any { return new(T) }

// eitherEvent is for an event whose data had two shapes: an empty A when
// isA says the data is A's, else an empty B.
func eitherEvent[A, B any](isA func(data json.RawMessage) bool) func(json.RawMessage) any {
	return func(data json.RawMessage) any {
		if isA(data) {
			return new(A)
		}
		return new(B)
	}
}

// decodeLenient fills v from raw, field by field when the whole does not
// decode.
func decodeLenient(raw json.RawMessage, v any) {
	if len(raw) == 0 || json.Unmarshal(raw, v) == nil {
		return
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return
	}
	for k, f := range fields {
		one, err := json.Marshal(map[string]json.RawMessage{k: f})
		if err == nil {
			_ = json.Unmarshal(one, v)
		}
	}
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
