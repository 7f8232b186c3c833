package approval

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// Brief is what the stream's summaries (the approval load, the drafting
// of suggestions, policy replay) read of the two most frequent events with
// data: a request's call and who asked (EventRequested), a decision's
// verdict and how long it took (EventDecided, EventApprovalVote). It
// decodes only those fields: DecodeEvent fills the whole typed struct
// (times, signals, previews), several times the work, and the audit
// view's load page decodes every entry of its window in each of its two
// passes.
type Brief struct {
	// EventRequested (a decision's Args are an edit's).
	Args       json.RawMessage `json:"args"`
	Requester  string          `json:"requester"`
	Kind       Kind            `json:"kind"`
	Confidence *float64        `json:"confidence"`
	// EventDecided, EventApprovalVote.
	Verdict    Verdict `json:"verdict"`
	DecisionMS int64   `json:"decision_ms"`
}

// DecodeBrief decodes e's Brief; ok is false for an event without one
// (use DecodeEvent). It reads the same values as DecodeEvent: data that
// does not decode in one go is decoded field by field as DecodeEvent does.
func DecodeBrief(e Entry) (b Brief, ok bool) {
	switch e.Event {
	case EventRequested, EventDecided, EventApprovalVote:
	default:
		return Brief{}, false
	}
	if len(e.Data) == 0 {
		return Brief{}, true
	}
	if b, ok := scanBrief(e.Data); ok {
		return b, true
	}
	if json.Unmarshal(e.Data, &b) == nil {
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

// scanBrief reads a Brief from data the way json.Unmarshal would, walking
// the object's top-level members once instead of through reflection (the
// data the audit holds is compact JSON written by encoding/json). ok is
// false for anything it does not read exactly as json.Unmarshal: data that
// is not one valid object, a member name escaped or matching a field only
// when case is ignored, a value of another type than its field's, a
// string or member name with escapes or bytes beyond ASCII (which
// json.Unmarshal unescapes, rewrites or folds); the caller then
// unmarshals.
func scanBrief(data []byte) (b Brief, ok bool) {
	if !json.Valid(data) {
		return Brief{}, false
	}
	s := bytes.TrimLeft(data, " \t\r\n")
	if len(s) == 0 || s[0] != '{' {
		return Brief{}, false
	}
	i := 1
	for {
		i = skipSpace(s, i)
		if s[i] == '}' {
			return b, true
		}
		if s[i] == ',' {
			i = skipSpace(s, i+1)
		}
		// A member: "name": value.
		end := stringEnd(s, i)
		name := s[i+1 : end-1]
		if !plainString(s[i:end]) {
			return Brief{}, false
		}
		i = skipSpace(s, end)
		i = skipSpace(s, i+1) // the colon
		vend := valueEnd(s, i)
		v := s[i:vend]
		i = vend
		var str *string
		switch string(name) {
		case "args":
			b.Args = append(json.RawMessage(nil), v...)
			continue
		case "requester":
			str = &b.Requester
		case "kind":
			str = (*string)(&b.Kind)
		case "verdict":
			str = (*string)(&b.Verdict)
		case "confidence":
			switch {
			case v[0] == 'n':
				b.Confidence = nil
			case v[0] == '-' || '0' <= v[0] && v[0] <= '9':
				f, err := strconv.ParseFloat(string(v), 64)
				if err != nil {
					return Brief{}, false
				}
				b.Confidence = &f
			default:
				return Brief{}, false
			}
			continue
		case "decision_ms":
			switch {
			case v[0] == 'n':
			case v[0] == '-' || '0' <= v[0] && v[0] <= '9':
				n, err := strconv.ParseInt(string(v), 10, 64)
				if err != nil {
					return Brief{}, false
				}
				b.DecisionMS = n
			default:
				return Brief{}, false
			}
			continue
		default:
			for _, f := range briefFields {
				if strings.EqualFold(string(name), f) {
					return Brief{}, false
				}
			}
			continue
		}
		switch {
		case v[0] == 'n':
		case v[0] == '"' && plainString(v):
			*str = string(v[1 : len(v)-1])
		default:
			return Brief{}, false
		}
	}
}

// briefFields are Brief's member names.
var briefFields = []string{"args", "requester", "kind", "confidence", "verdict", "decision_ms"}

func skipSpace(s []byte, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// stringEnd is the index past the string that starts at s[i] (valid JSON).
func stringEnd(s []byte, i int) int {
	for i++; s[i] != '"'; i++ {
		if s[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd is the index past the value that starts at s[i] (valid JSON).
func valueEnd(s []byte, i int) int {
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch s[i] {
			case '"':
				i = stringEnd(s, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(s) && !strings.ContainsRune(" \t\r\n,}]", rune(s[i])) {
		i++
	}
	return i
}

// plainString reports whether the JSON string v holds neither escapes nor
// bytes beyond ASCII (json.Unmarshal would rewrite invalid UTF-8).
func plainString(v []byte) bool {
	for _, c := range v[1 : len(v)-1] {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}
