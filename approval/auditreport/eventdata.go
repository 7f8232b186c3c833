package auditreport

import (
	"encoding/json"
	"time"

	"github.com/countersign/countersign/approval"
)

// OutcomeOf names a human verdict as a request outcome.
func OutcomeOf(v approval.Verdict) string {
	switch v {
	case approval.VerdictApprove:
		return "approved"
	case approval.VerdictEdit:
		return "edited"
	case approval.VerdictReject:
		return "rejected"
	case approval.VerdictRespond:
		return "responded"
	case approval.VerdictExpire:
		return "expired"
	case approval.VerdictCancel:
		return "cancelled"
	case approval.VerdictRunNow:
		return "run_now"
	case approval.VerdictWindowElapsed:
		return "window_elapsed"
	}
	return "other"
}

// EventData is the readers' flat view of an entry's data: the fields the
// reports rely on, whichever event carries them. It is filled from the
// typed event approval.DecodeEvent returns, never decoded from JSON on its
// own, so the audit's schema lives in one place (approval/events.go).
type EventData struct {
	// requested
	Args         json.RawMessage
	Digest       string
	Preview      *approval.Preview
	Signals      []approval.Signal
	Decisions    []string
	Quorum       int
	Deadline     string // RFC 3339
	Reason       string // model's reason (requested, proposed), why (cancelled, lost, decision_refused)
	Requester    string
	Confidence   *float64
	PreviewError string

	// decided, decision_refused
	Verdict      string
	Text         string
	OriginalArgs json.RawMessage
	Created      string // RFC 3339
	DecisionMS   *float64
	Code         string

	// executed, failed, run_finished
	Result     json.RawMessage
	Error      string
	DurationMS *float64

	// marked_wrong, sample_reviewed, sampled
	Status    string
	DecidedBy string
	Sampled   bool

	// card_posted, grant_created
	Channel string
	TS      string

	// grant_created, grant_revoked, preauthorized
	GrantID   string
	GrantedBy string
	Expires   string // RFC 3339
}

// ParseEventData is the flat view of e's data. Data of another shape gives
// what could be decoded of it, so one odd entry never stops a reader.
func ParseEventData(e approval.Entry) EventData {
	var d EventData
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	switch v := approval.DecodeEvent(e).(type) {
	case *approval.RequestedEvent:
		d.Args, d.Digest, d.Signals, d.Quorum = v.Args, v.Digest, v.Signals, v.Quorum
		if v.Preview.Summary != "" || len(v.Preview.Facts) > 0 || v.Preview.Source != "" || v.Preview.Error != "" {
			d.Preview = &v.Preview
		}
		for _, dv := range v.Decisions {
			d.Decisions = append(d.Decisions, string(dv))
		}
		d.Deadline, d.Created = stamp(v.Deadline), stamp(v.Created)
		d.Reason, d.Requester, d.Confidence, d.PreviewError = v.Reason, v.Requester, v.Confidence, v.PreviewError
	case *approval.ProposedEvent:
		d.Args, d.Reason, d.Confidence = v.Args, v.Reason, v.Confidence
	case *approval.AssessedEvent:
		d.Signals, d.Quorum = v.Signals, v.Quorum
	case *approval.RememberedEvent:
		d.Digest, d.Requester = v.Digest, v.Requester
	case *approval.PreauthorizedEvent:
		d.GrantID, d.GrantedBy, d.Expires, d.Signals = v.GrantID, v.GrantedBy, stamp(v.Expires), v.Signals
	case *approval.GrantedEvent:
		d.GrantID, d.Requester, d.Channel, d.Expires = v.GrantID, v.Requester, v.Channel, stamp(v.Expires)
	case *approval.GrantRevokedEvent:
		d.GrantID, d.GrantedBy = v.GrantID, v.GrantedBy
	case *approval.CardPostedEvent:
		d.Channel, d.TS = v.Channel, v.TS
	case *approval.DecidedEvent:
		d.Verdict, d.Digest, d.Text, d.Reason, d.Quorum = string(v.Verdict), v.Digest, v.Text, v.Reason, v.Quorum
		d.Args, d.OriginalArgs, d.Created = v.Args, v.OriginalArgs, stamp(v.Created)
		if v.DecisionMS != 0 {
			ms := float64(v.DecisionMS)
			d.DecisionMS = &ms
		}
	case *approval.RefusalEvent:
		d.Verdict, d.Reason, d.Code = string(v.Verdict), v.Reason, v.Code
	case *approval.ExpiredEvent:
		d.Deadline, d.Created = stamp(v.Deadline), stamp(v.Created)
	case *approval.ReasonEvent:
		d.Reason = v.Reason
	case *approval.RemindedEvent:
		d.Deadline = stamp(v.Deadline)
	case *approval.ExecutingEvent:
		d.Args = v.Args
	case *approval.ExecutedEvent:
		d.Result, _ = json.Marshal(v.Result)
		d.Error = v.Error
		if v.DurationMS != 0 { // 0: not measured (older entries); readers time executing → executed
			ms := float64(v.DurationMS)
			d.DurationMS = &ms
		}
	case *approval.CallErrorEvent:
		d.Error, d.Args = v.Error, v.Args
	case *approval.WindowDecisionEvent:
		d.Verdict, d.Reason, d.Digest, d.Created = string(v.Verdict), v.Reason, v.Digest, stamp(v.Created)
		if v.DecisionMS != 0 {
			ms := float64(v.DecisionMS)
			d.DecisionMS = &ms
		}
	case *approval.WindowElapsedEvent:
		d.Created = stamp(v.Created)
	case *approval.ScheduledEvent:
		d.Deadline = stamp(v.RunAt)
	case *approval.SampledEvent:
		d.Args, d.Digest, d.Status, d.Created, d.Requester, d.Sampled = v.Args, v.Digest, string(v.Status), stamp(v.Created), v.Requester, true
		d.Result, _ = json.Marshal(v.Result)
		if v.Preview.Summary != "" || len(v.Preview.Facts) > 0 || v.Preview.Source != "" || v.Preview.Error != "" {
			d.Preview = &v.Preview
		}
	case *approval.FeedbackEvent:
		d.Reason, d.Status, d.Verdict, d.DecidedBy, d.Sampled, d.Created = v.Reason, string(v.Status), string(v.Verdict), v.DecidedBy, v.Sampled, stamp(v.Created)
	case *approval.RunFinishedEvent:
		d.Result, _ = json.Marshal(v.Result)
	}
	return d
}

// DecisionTime is the time from the request to this decision: decision_ms
// when given, else the decision entry's time minus created.
func (d EventData) DecisionTime(at time.Time) (time.Duration, bool) {
	if d.DecisionMS != nil && *d.DecisionMS >= 0 {
		return time.Duration(*d.DecisionMS * float64(time.Millisecond)), true
	}
	if d.Created != "" {
		if c, err := time.Parse(time.RFC3339Nano, d.Created); err == nil && !at.Before(c) {
			return at.Sub(c), true
		}
	}
	return 0, false
}

// ReasonText is the approver's reason or response text.
func (d EventData) ReasonText() string {
	if d.Reason != "" {
		return d.Reason
	}
	return d.Text
}
