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

// EventData is the union of the audit data fields the readers rely on.
// Every field is optional; docs/operations.md lists which event carries
// which.
type EventData struct {
	// requested
	Args         json.RawMessage   `json:"args,omitempty"`
	Digest       string            `json:"digest,omitempty"`
	Preview      *approval.Preview `json:"preview,omitempty"`
	Signals      []approval.Signal `json:"signals,omitempty"`
	Decisions    []string          `json:"decisions,omitempty"`
	Quorum       int               `json:"quorum,omitempty"`
	Deadline     string            `json:"deadline,omitempty"`
	Reason       string            `json:"reason,omitempty"` // model's reason (requested), approver's (decided), why refused (decision_refused)
	Requester    string            `json:"requester,omitempty"`
	Confidence   *float64          `json:"confidence,omitempty"`
	PreviewError string            `json:"preview_error,omitempty"`

	// decided, decision_refused
	Verdict      string          `json:"verdict,omitempty"`
	Text         string          `json:"text,omitempty"`
	OriginalArgs json.RawMessage `json:"original_args,omitempty"`
	Created      string          `json:"created,omitempty"`
	DecisionMS   *float64        `json:"decision_ms,omitempty"`
	Code         string          `json:"code,omitempty"`

	// executed, failed
	Result     json.RawMessage `json:"result,omitempty"`
	Error      string          `json:"error,omitempty"`
	DurationMS *float64        `json:"duration_ms,omitempty"`

	// marked_wrong, sample_reviewed, sampled
	Status    string `json:"status,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	Sampled   bool   `json:"sampled,omitempty"`

	// card_posted
	Channel string `json:"channel,omitempty"`
	TS      string `json:"ts,omitempty"`

	// grant_created, grant_revoked, preauthorized
	GrantID   string `json:"grant_id,omitempty"`
	GrantedBy string `json:"granted_by,omitempty"`
	Expires   string `json:"expires,omitempty"`
}

// ParseEventData decodes what it can of raw; data of another shape gives a
// zero value rather than an error, so one odd entry never stops a reader.
func ParseEventData(raw json.RawMessage) EventData {
	var d EventData
	if len(raw) == 0 {
		return d
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		// Field by field, so one field of an unexpected type keeps the rest.
		var fields map[string]json.RawMessage
		if json.Unmarshal(raw, &fields) != nil {
			return EventData{}
		}
		d = EventData{}
		for k, v := range fields {
			one, _ := json.Marshal(map[string]json.RawMessage{k: v})
			_ = json.Unmarshal(one, &d)
		}
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
