package approval

import "encoding/json"

// Brief is what the stream's summaries (the approval load, the drafting
// of suggestions, policy replay) read of the two most frequent events with
// data: a request's call and who asked (EventRequested), a decision's
// verdict and how long it took (EventDecided, EventApprovalVote). It
// decodes only those fields: DecodeEvent fills the whole typed struct
// (times, signals, previews), three to four times the work, and a page
// over 100,000 entries decodes each one in every pass.
type Brief struct {
	// EventRequested.
	Args       json.RawMessage `json:"args"`
	Requester  string          `json:"requester"`
	Kind       Kind            `json:"kind"`
	Confidence *float64        `json:"confidence"`
	// EventDecided, EventApprovalVote.
	Verdict    Verdict `json:"verdict"`
	DecisionMS int64   `json:"decision_ms"`
}

// DecodeBrief decodes e's Brief; ok is false for an event without one
// (use DecodeEvent). Data that does not decode in one go is decoded as
// DecodeEvent decodes it (field by field), so both read the same values.
func DecodeBrief(e Entry) (b Brief, ok bool) {
	switch e.Event {
	case EventRequested, EventDecided, EventApprovalVote:
	default:
		return Brief{}, false
	}
	if len(e.Data) == 0 || json.Unmarshal(e.Data, &b) == nil {
		return b, true
	}
	switch d := DecodeEvent(e).(type) {
	case *RequestedEvent:
		return Brief{Args: d.Args, Requester: d.Requester, Kind: d.Kind, Confidence: d.Confidence}, true
	case *DecidedEvent:
		return Brief{Verdict: d.Verdict, DecisionMS: d.DecisionMS}, true
	}
	return Brief{}, true
}
