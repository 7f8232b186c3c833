package approval

import (
	"encoding/json"

	"github.com/countersign/countersign/approval/clip"
)

// MaxDataField is how many bytes of one string in an audit entry's data
// (a value or an object key, at any depth) reach the stream; BoundData
// cuts the rest (clip.Bytes, its marker included). The data comes from outside —
// arguments a model or a caller wrote, a refused request's path, a
// result — so without a bound one request could grow the stream, which
// is kept for ever, by what its body or URL holds. The call's digest
// still names its whole arguments, and the request record keeps them for
// its retention.
const MaxDataField = 8 << 10

// BoundData returns data (JSON, as Redact returns it) with every string
// longer than MaxDataField cut by clip.Bytes, keys included. Data that is not
// valid JSON is returned as one clipped JSON string. It is the one place
// the audit bounds typed event data: the store's Append runs it on every
// entry, after Redact.
func BoundData(data json.RawMessage) json.RawMessage {
	if len(data) <= MaxDataField {
		return data // no string in it can be longer
	}
	v, ok := decodeJSON(data)
	if !ok {
		return encodeJSON(clip.Bytes(string(data), MaxDataField))
	}
	return encodeJSON(bound(v))
}

// bound clips the strings of a decoded JSON value.
func bound(v any) any {
	switch x := v.(type) {
	case string:
		return clip.Bytes(x, MaxDataField)
	case []any:
		for i, e := range x {
			x[i] = bound(e)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[clip.Bytes(k, MaxDataField)] = bound(e)
		}
		return out
	}
	return v // numbers (json.Number), booleans, null
}
