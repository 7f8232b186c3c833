package approval

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// ArgChange is one difference between two sets of tool arguments (the
// proposal and an approver's edit).
type ArgChange struct {
	// Path is the JSON path of the changed value, keys joined by dots
	// (a.b); "" when the arguments as a whole differ (they are not objects).
	Path string `json:"path"`
	// Keys are the path's keys, nil for the arguments as a whole.
	Keys   []string        `json:"-"`
	Before json.RawMessage `json:"before,omitempty"` // absent: added by the edit
	After  json.RawMessage `json:"after,omitempty"`  // absent: removed by the edit
}

// DiffArgs lists the changes from before to after, sorted by key. Objects
// are compared key by key, depth levels deep (1: top-level arguments only;
// 0: no limit); anything else is compared as canonical JSON, and Before and
// After are canonical JSON (sorted keys, numbers as written). It is the one
// argument diff: the card, the agent's edit note and the audit reports use it.
func DiffArgs(before, after json.RawMessage, depth int) []ArgChange {
	var out []ArgChange
	diffArgs(nil, before, after, depth, &out)
	return out
}

func diffArgs(keys []string, before, after json.RawMessage, depth int, out *[]ArgChange) {
	b, bok := argObject(before)
	a, aok := argObject(after)
	if bok && aok && (depth <= 0 || len(keys) < depth) {
		names := make([]string, 0, len(a)+len(b))
		for k := range b {
			names = append(names, k)
		}
		for k := range a {
			if _, ok := b[k]; !ok {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		for _, k := range names {
			p := append(slices.Clip(keys), k)
			bv, inB := b[k]
			av, inA := a[k]
			switch {
			case !inA:
				*out = append(*out, ArgChange{Path: strings.Join(p, "."), Keys: p, Before: canonicalValue(bv)})
			case !inB:
				*out = append(*out, ArgChange{Path: strings.Join(p, "."), Keys: p, After: canonicalValue(av)})
			default:
				diffArgs(p, bv, av, depth, out)
			}
		}
		return
	}
	if bc, ac := canonicalValue(before), canonicalValue(after); !bytes.Equal(bc, ac) {
		*out = append(*out, ArgChange{Path: strings.Join(keys, "."), Keys: keys, Before: bc, After: ac})
	}
}

// argObject decodes a JSON object, reporting whether raw was one.
func argObject(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, false
	}
	return m, true
}

// canonicalValue is raw as canonical JSON; raw (compacted when it can be)
// when it is not valid JSON.
func canonicalValue(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage(`null`)
	}
	if c, err := Canonical(raw); err == nil {
		return c
	}
	if c, err := Compact(raw); err == nil {
		return c
	}
	return raw
}
