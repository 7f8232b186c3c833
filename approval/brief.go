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
	if !validJSON(data) {
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
			// name is ASCII: a field's name folds to it only at its length.
			for _, f := range briefFields {
				if len(name) == len(f) && bytes.EqualFold(name, []byte(f)) {
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

// validJSON reports whether s is one JSON value (with spaces around it),
// as json.Valid does at a fraction of its cost; it may say false where
// json.Valid says true (nesting deeper than maxDepth), never the reverse.
func validJSON(s []byte) bool {
	i, ok := validValue(s, skipSpace(s, 0), 0)
	return ok && skipSpace(s, i) == len(s)
}

// maxDepth bounds validJSON's nesting (encoding/json allows 10,000).
const maxDepth = 200

// validValue checks the value at s[i], returning the index past it.
func validValue(s []byte, i, depth int) (int, bool) {
	if i >= len(s) || depth > maxDepth {
		return i, false
	}
	switch c := s[i]; {
	case c == '"':
		return validString(s, i)
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i = skipSpace(s, i+1)
		if i < len(s) && s[i] == end {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i >= len(s) || s[i] != '"' {
					return i, false
				}
				if i, ok = validString(s, i); !ok {
					return i, false
				}
				if i = skipSpace(s, i); i >= len(s) || s[i] != ':' {
					return i, false
				}
				i = skipSpace(s, i+1)
			}
			if i, ok = validValue(s, i, depth+1); !ok {
				return i, false
			}
			if i = skipSpace(s, i); i >= len(s) {
				return i, false
			}
			switch s[i] {
			case ',':
				i = skipSpace(s, i+1)
			case end:
				return i + 1, true
			default:
				return i, false
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		return validNumber(s, i)
	case c == 't':
		return i + 4, bytes.HasPrefix(s[i:], []byte("true"))
	case c == 'f':
		return i + 5, bytes.HasPrefix(s[i:], []byte("false"))
	case c == 'n':
		return i + 4, bytes.HasPrefix(s[i:], []byte("null"))
	}
	return i, false
}

// validString checks the string at s[i] (control characters must be
// escaped; any other byte is accepted, as json.Valid accepts it).
func validString(s []byte, i int) (int, bool) {
	for i++; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			if i++; i >= len(s) {
				return i, false
			}
			switch s[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(s) {
					return i, false
				}
				for _, h := range s[i+1 : i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

// validNumber checks the number at s[i]: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(s []byte, i int) (int, bool) {
	digits := func() bool {
		j := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return i, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return i, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return i, false
		}
	}
	return i, true
}

// Members calls fn with the name and the raw value of each member of the
// JSON object data, in order, reading it once; it returns false, having
// called fn for none, when data is not one valid object or a member name
// has escapes or bytes beyond ASCII (then unmarshal it). A name given
// twice is given twice: json.Unmarshal into a map keeps the last.
func Members(data []byte, fn func(name string, value []byte)) bool {
	if !validJSON(data) {
		return false
	}
	s := bytes.TrimLeft(data, " \t\r\n")
	if len(s) == 0 || s[0] != '{' {
		return false
	}
	type member struct {
		name  []byte
		value []byte
	}
	var buf [16]member
	ms := buf[:0]
	for i := 1; ; {
		i = skipSpace(s, i)
		if s[i] == '}' {
			break
		}
		if s[i] == ',' {
			i = skipSpace(s, i+1)
		}
		end := stringEnd(s, i)
		if !plainString(s[i:end]) {
			return false
		}
		name := s[i+1 : end-1]
		i = skipSpace(s, skipSpace(s, end)+1)
		vend := valueEnd(s, i)
		ms = append(ms, member{name, s[i:vend]})
		i = vend
	}
	for _, m := range ms {
		fn(string(m.name), m.value)
	}
	return true
}
