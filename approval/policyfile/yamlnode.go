package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/countersign/countersign/approval/duration"
)

// decoder walks the YAML node tree by hand so that every problem — unknown
// key, wrong type, bad value — is reported with its key path and line, and
// decoding carries on to find the rest.
type decoder struct {
	errs ErrorList
	// lines remembers where each decoded key path is, for problems found
	// after decoding (validation).
	lines map[string]int
	// remindSet says the defaults set remind_after: a tool that sets neither
	// it nor its own gets DefaultRemindAfterFor its timeout.
	remindSet bool
	// refs are the Slack ids the file gives, as decoded (SlackRefs);
	// badIDs counts those reported for not being ids.
	refs   []SlackRef
	badIDs int
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &Error{Path: path, Line: line, Message: fmt.Sprintf(format, args...)})
}

// errAt reports a problem at a path decoded earlier.
func (d *decoder) errAt(path, format string, args ...any) {
	d.errs = append(d.errs, &Error{Path: path, Line: d.line(path), Message: fmt.Sprintf(format, args...)})
}

// line is where path (or its nearest decoded parent) is in the file.
func (d *decoder) line(path string) int {
	for p := path; p != ""; {
		if l, ok := d.lines[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

func (d *decoder) seen(n *yaml.Node, path string) {
	if d.lines == nil {
		d.lines = map[string]int{}
	}
	d.lines[path] = n.Line
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

type handlers map[string]func(n *yaml.Node, path string)

// mapping decodes a YAML mapping, calling the handler of each known key and
// reporting unknown and duplicate keys. A null value counts as absent.
func (d *decoder) mapping(n *yaml.Node, path string, h handlers) bool {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "must be a mapping, got %s", describe(n))
		return false
	}
	first := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		p := join(path, k.Value)
		if at, dup := first[k.Value]; dup {
			d.errorf(k, p, "duplicate key (first at line %d)", at)
			continue
		}
		first[k.Value] = k.Line
		fn, ok := h[k.Value]
		if !ok && path == "" && strings.HasPrefix(k.Value, "x-") {
			continue // top-level extension key, e.g. a home for YAML anchors
		}
		if !ok {
			d.errorf(k, p, "unknown key%s", suggest(k.Value, h))
			continue
		}
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue
		}
		d.seen(v, p)
		fn(v, p)
	}
	return true
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "nothing"
}

// suggest proposes the known key closest to a misspelt one.
func suggest(key string, h handlers) string {
	best := closest(key, slices.Sorted(maps.Keys(h)))
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// didYouMean is "; did you mean <prefix><name>?" for the candidate
// closest to word, or "" when none is close.
func didYouMean(prefix, word string, candidates []string) string {
	best := closest(word, candidates)
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s%s?", prefix, best)
}

// closest is the candidate a misspelt or shortened word most likely
// means: the nearest within two edits (the first of equals in sorted
// order), else the same word in another case or without underscores
// (user_groups for usergroups), else one that starts or ends with the
// word (env for environment, groups for usergroups), "" when none does.
func closest(word string, candidates []string) string {
	sorted := slices.Sorted(slices.Values(candidates))
	best, bestDist := "", 3
	for _, c := range sorted {
		if dist := editDistance(word, c); dist < bestDist && dist < len(word) {
			best, bestDist = c, dist
		}
	}
	if best != "" {
		return best
	}
	bare := strings.ToLower(strings.ReplaceAll(word, "_", ""))
	for _, c := range sorted {
		if bare == strings.ToLower(strings.ReplaceAll(c, "_", "")) {
			return c
		}
	}
	if len(word) < 3 {
		return ""
	}
	for _, c := range sorted {
		if strings.HasPrefix(c, word) || strings.HasSuffix(c, word) {
			return c
		}
	}
	return ""
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (d *decoder) str(n *yaml.Node, path string) *string {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, path, "must be a string, got %s", describe(n))
		return nil
	}
	return &n.Value
}

func (d *decoder) int(n *yaml.Node, path string) *int {
	var v int
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		d.errorf(n, path, "must be an integer, got %s", describe(n))
		return nil
	}
	return &v
}

func (d *decoder) float(n *yaml.Node, path string) *float64 {
	var v float64
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&v) != nil {
		d.errorf(n, path, "must be a number, got %s", describe(n))
		return nil
	}
	return &v
}

func (d *decoder) bool(n *yaml.Node, path string) *bool {
	var v bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&v) != nil {
		d.errorf(n, path, "must be true or false, got %s", describe(n))
		return nil
	}
	return &v
}

func (d *decoder) duration(n *yaml.Node, path string) *time.Duration {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, path, "must be a duration such as 90s, 24h or 7d, got %s", describe(n))
		return nil
	}
	v, err := duration.Parse(n.Value)
	if err != nil {
		d.errorf(n, path, "invalid duration %q (use e.g. 90s, 30m, 24h, 7d)", n.Value)
		return nil
	}
	if v < 0 {
		d.errorf(n, path, "must not be negative, got %s", n.Value)
		return nil
	}
	return &v
}

// strings decodes a list of strings. An explicit empty list gives a
// non-nil empty slice, so callers can tell it from an absent key.
func (d *decoder) strings(n *yaml.Node, path string) []string {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, path, "must be a list, got %s", describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		item = resolve(item)
		p := index(path, i)
		if s := d.str(item, p); s != nil {
			if strings.TrimSpace(*s) == "" {
				d.errorf(item, p, "must not be empty")
				continue
			}
			if slices.Contains(out, *s) {
				d.errorf(item, p, "%q is listed twice", *s)
				continue
			}
			out = append(out, *s)
		}
	}
	return out
}

// argv decodes a command line: a list of strings kept in order, repeats
// and empty arguments included (a wrapper such as
// [node, tap.mjs, log, --, node, server.js] names a program twice).
func (d *decoder) argv(n *yaml.Node, path string) []string {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, path, "must be a list, got %s", describe(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		if s := d.str(resolve(item), index(path, i)); s != nil {
			out = append(out, *s)
		}
	}
	return out
}

func (d *decoder) stringMap(n *yaml.Node, path string) map[string]string {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "must be a mapping, got %s", describe(n))
		return nil
	}
	out := map[string]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		p := join(path, k.Value)
		if _, dup := out[k.Value]; dup {
			d.errorf(k, p, "duplicate key")
			continue
		}
		d.seen(v, p)
		if s := d.str(v, p); s != nil {
			out[k.Value] = *s
		}
	}
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// nodeJSON converts a YAML value to JSON, keeping mapping keys in file
// order (the order of schema properties is the order of fields in the
// edit form).
func nodeJSON(n *yaml.Node) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := writeJSON(&b, n, 0); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeJSON(b *bytes.Buffer, n *yaml.Node, depth int) error {
	if depth > 100 {
		return errors.New("nested too deeply")
	}
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(resolve(n.Content[i]).Value)
			b.Write(k)
			b.WriteByte(':')
			if err := writeJSON(b, n.Content[i+1], depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, item, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		out, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b.Write(out)
	default:
		return fmt.Errorf("line %d: unsupported YAML value", n.Line)
	}
	return nil
}
