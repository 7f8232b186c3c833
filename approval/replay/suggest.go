package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// SuggestOptions say where to look for approvals that were always the
// same.
type SuggestOptions struct {
	// Current is the policy in force: a suggestion changes one tool of it.
	Current Policy
	Since   time.Time
	// Until, when set, ends the period: the replay judges the calls first
	// seen before it (Options.Until). The entries handed to Add are the
	// caller's to bound.
	Until time.Time
	// Min is the fewest approvals a suggestion is drawn from.
	Min int
}

// Suggestion is the narrowest rule letting through the calls of one tool,
// by one requester (a person, or an API key), that people approved
// unedited at least Min times and never marked wrong, replayed over the
// same period.
type Suggestion struct {
	Tool      string    `json:"tool"`
	Requester string    `json:"requester"`
	Approvals int       `json:"approvals"`
	First     time.Time `json:"first"`
	Last      time.Time `json:"last"`
	// Match is the CEL condition the approved calls meet (constant fields
	// pinned, numbers bounded by what was approved, strings matched by an
	// anchored pattern over a safe character set, no other field).
	Match string `json:"match"`
	// When is the tool's new when rule (a person looks unless Match, or
	// when the rule it replaces fires and Match does not hold); Reason
	// says it in words.
	When   string `json:"when"`
	Reason string `json:"reason"`
	// Replay is the suggestion replayed over the period: LetThrough is
	// how many past calls it would run without a person that the policy
	// in force asks about, Regressions those of them a person rejected,
	// edited or marked wrong (a suggestion is only made with none), and
	// StillAsked the rejected, edited or marked-wrong calls of the tool
	// that still ask a person under it.
	LetThrough  int `json:"let_through"`
	Regressions int `json:"regressions"`
	StillAsked  int `json:"declined_still_asked"`
	// MinutesSaved are the people-minutes the calls let through took.
	MinutesSaved float64 `json:"people_minutes_saved"`
}

// Suggestions are Suggest's result: what was suggested, and the groups of
// approvals it found but could draw no safe rule for, with why.
type Suggestions struct {
	Since        time.Time    `json:"since"`
	Suggestions  []Suggestion `json:"suggestions"`
	NotSuggested []Declined   `json:"not_suggested"`
}

// Declined is a group of identical approvals no rule is suggested for.
type Declined struct {
	Tool      string `json:"tool"`
	Requester string `json:"requester"`
	Approvals int    `json:"approvals"`
	Why       string `json:"why"`
}

// Suggest reads the period once for the approvals, then once more to
// replay every suggestion (Suggester).
func Suggest(ctx context.Context, r auditreport.Ranger, opts SuggestOptions) (*Suggestions, error) {
	sg, err := NewSuggester(opts)
	if err != nil {
		return nil, err
	}
	if err := Stream(ctx, r, opts.Since, sg.Add); err != nil {
		return nil, err
	}
	return sg.Suggestions(ctx, r)
}

// Suggester drafts suggestions in two passes over a period: the entries
// handed to Add (the period's, oldest first, in the caller's own pass: the
// audit view's load page reads its window once for the load and the
// drafting), then one more pass, in Suggestions, that replays every
// drafted rule at once. Memory holds what each group's approvals had in
// common and the calls still open, never the calls themselves.
type Suggester struct {
	opts SuggestOptions
	cur  *Judge
	c    *collector
}

// NewSuggester compiles the policy in force; the error names its problem.
func NewSuggester(opts SuggestOptions) (*Suggester, error) {
	cur, err := NewJudge(opts.Current)
	if err != nil {
		return nil, fmt.Errorf("the policy in force: %w", err)
	}
	return &Suggester{opts: opts, cur: cur, c: newCollector()}, nil
}

// Add folds in one entry of the period. It never fails; the error is for
// Stream.
func (sg *Suggester) Add(e approval.Entry) error {
	b, _ := approval.DecodeBrief(e)
	sg.c.add(e, b)
	return nil
}

// AddBrief is Add for an entry whose data the caller decoded already
// (approval.DecodeBrief), so that a pass feeding the drafting and other
// summaries (the load page's) decodes each entry once.
func (sg *Suggester) AddBrief(e approval.Entry, b approval.Brief) { sg.c.add(e, b) }

// drafted is a suggestion waiting for its replay.
type drafted struct {
	key groupKey
	s   Suggestion
	rp  *Replayer
}

// Suggestions drafts a rule per group of identical approvals and replays
// them all in one pass over r from opts.Since (each through the gate, the
// policy in force against the policy with that rule). A drafted rule that
// lets a declined call through is not suggested (NotSuggested says so).
// The errors are Stream's.
func (sg *Suggester) Suggestions(ctx context.Context, r auditreport.Ranger) (*Suggestions, error) {
	opts, c := sg.opts, sg.c
	out := &Suggestions{Since: opts.Since, Suggestions: []Suggestion{}, NotSuggested: []Declined{}}
	var drafts []*drafted
	for _, key := range slices.SortedFunc(maps.Keys(c.groups), func(a, b groupKey) int {
		return strings.Compare(a.tool+"\x00"+a.requester, b.tool+"\x00"+b.requester)
	}) {
		g := c.groups[key]
		if g.n < max(opts.Min, 2) {
			continue
		}
		decline := func(why string) {
			out.NotSuggested = append(out.NotSuggested, Declined{Tool: key.tool, Requester: key.requester, Approvals: g.n, Why: why})
		}
		pol, ok := opts.Current.Policy.Tools[key.tool]
		if !ok {
			decline("the policy in force does not declare the tool")
			continue
		}
		if why := unsuggestable(sg.cur, key.tool); why != "" {
			decline(why)
			continue
		}
		match, why := g.match(key.requester)
		if why != "" {
			decline(why)
			continue
		}
		s := Suggestion{Tool: key.tool, Requester: key.requester, Approvals: g.n, First: g.first, Last: g.last, Match: match,
			Reason: fmt.Sprintf("a call unlike the %d that %s asked for and people approved unedited", g.n, key.requester)}
		s.When = "!(" + match + ")"
		if pol.Review == approval.ReviewAuto && pol.When != "" {
			s.When = "(" + pol.When + ") && " + s.When
			if pol.WhenReason != "" {
				s.Reason = pol.WhenReason + ", and " + s.Reason
			}
		}
		cand := opts.Current
		cand.Policy.Tools = maps.Clone(opts.Current.Policy.Tools)
		tp := pol.Clone()
		tp.Review, tp.When, tp.WhenReason = approval.ReviewAuto, s.When, s.Reason
		cand.Policy.Tools[key.tool] = tp
		cj, err := NewJudge(cand)
		if err != nil {
			decline(fmt.Sprintf("the drafted rule does not compile (%v)", err))
			continue
		}
		rp := New(sg.cur, cj, Options{Current: opts.Current, Candidate: cand, Since: opts.Since, Until: opts.Until, Tool: key.tool})
		drafts = append(drafts, &drafted{key: key, s: s, rp: rp})
	}
	if len(drafts) == 0 {
		// Nothing to replay, but "no suggestion" holds only for a whole
		// period: the caller's pass did not check.
		if err := whole(ctx, r, opts.Since); err != nil {
			return nil, err
		}
	} else {
		// One pass for every suggestion: each replayer keeps its tool's
		// calls (Options.Tool) and skips the rest before decoding them.
		err := Stream(ctx, r, opts.Since, func(e approval.Entry) error {
			for _, d := range drafts {
				_ = d.rp.Add(e)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("replay the suggestions: %w", err)
		}
	}
	for _, d := range drafts {
		s, rep := d.s, d.rp.Report()
		for _, row := range rep.Tools {
			s.LetThrough += max(row.Candidate.Auto+row.Candidate.Window-row.Now.Auto-row.Now.Window, 0)
			s.MinutesSaved += row.MinutesSaved
		}
		s.Regressions = len(rep.Regressions)
		s.StillAsked = c.declined[d.key.tool] - s.Regressions
		if s.Regressions > 0 {
			out.NotSuggested = append(out.NotSuggested, Declined{Tool: d.key.tool, Requester: d.key.requester, Approvals: s.Approvals,
				Why: fmt.Sprintf("the narrowest rule (%s) would let %d calls a person declined through", s.Match, s.Regressions)})
			continue
		}
		out.Suggestions = append(out.Suggestions, s)
	}
	return out, nil
}

// unsuggestable says why no rule can let calls of tool through without a
// person under the policy in force ("" when one can): review never needs
// none, and a high risk or a sensitive capability always asks.
func unsuggestable(j *Judge, tool string) string {
	pol, _ := j.gate.Policy(tool)
	switch {
	case pol.Review == approval.ReviewNever:
		return "the tool already runs without a person (review never)"
	case pol.Review == approval.ReviewAfter:
		return "the tool runs after a cancel window already (review after)"
	case pol.Risk == approval.RiskHigh:
		return "the tool is high-risk: a person always looks"
	}
	// A sensitive capability is a signal the gate raises whatever the
	// rule: judge an empty call to see the static signals.
	as, err := j.gate.Assess(approval.ToolCall{Tool: tool, Args: json.RawMessage(`{}`), Confidence: ptr(1.0)}, "")
	if err == nil {
		for _, s := range as.Signals {
			if s.Code == approval.SignalSensitiveCapability {
				return "the tool has a sensitive capability: a person always looks"
			}
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// groupKey is one tool asked for by one requester.
type groupKey struct{ tool, requester string }

// collector gathers, per group, what the approved-unedited calls had in
// common (field by field, never the calls themselves), and per tool the
// calls people declined.
type collector struct {
	open     map[string]*pending
	groups   map[groupKey]*group
	wrong    map[string]groupKey // settled approvals, until marked wrong
	declined map[string]int      // tool → calls rejected, edited, cancelled, answered or marked wrong
}

// pending is an asked call not yet decided.
type pending struct {
	key  groupKey
	args json.RawMessage
	at   time.Time
}

func newCollector() *collector {
	return &collector{open: map[string]*pending{}, groups: map[groupKey]*group{}, wrong: map[string]groupKey{}, declined: map[string]int{}}
}

// add folds in e, whose Brief (approval.DecodeBrief) is d.
func (c *collector) add(e approval.Entry, d approval.Brief) {
	switch e.Event {
	case approval.EventRequested:
		if d.Kind == approval.KindContact || checkArgs(d.Args) != "" {
			return
		}
		c.open[e.RequestID] = &pending{key: groupKey{tool: e.Tool, requester: d.Requester}, args: d.Args, at: e.Time}
	case approval.EventDecided:
		p, ok := c.open[e.RequestID]
		if !ok {
			return
		}
		delete(c.open, e.RequestID)
		if d.Verdict != approval.VerdictApprove {
			if d.Verdict != approval.VerdictExpire {
				c.declined[p.key.tool]++
			}
			return
		}
		g := c.groups[p.key]
		if g == nil {
			g = &group{fields: map[string]*field{}}
			c.groups[p.key] = g
		}
		if !g.add(p.args, p.at) {
			return
		}
		c.wrong[e.RequestID] = p.key
	case approval.EventCancelled, approval.EventExpired, approval.EventAbandoned, approval.EventLost:
		delete(c.open, e.RequestID)
	case approval.EventMarkedWrong:
		if key, ok := c.wrong[e.RequestID]; ok {
			// Marked wrong after its approval: the group's approvals were
			// not always right, so it makes no suggestion.
			c.groups[key].wrong = true
			c.declined[key.tool]++
		}
	}
}

// group is what a group's approved calls had in common.
type group struct {
	n           int
	first, last time.Time
	fields      map[string]*field
	wrong       bool
	odd         string // why the calls cannot be described ("" when they can)
}

// field is what one argument held across a group's calls.
type field struct {
	seen     int
	kind     string          // string, number, bool, other; "mixed" once two differ
	constant json.RawMessage // the first value, while every value equals it
	same     bool
	lo, hi   float64 // numbers
	prefix   string  // strings: the common prefix
	minLen   int
	maxLen   int
	chars    [128]bool // strings: the characters used
	unsafe   bool      // a string held a character outside safeChars
	values   []string  // up to maxValues distinct strings
}

// maxValues is how many distinct values of a field a rule lists instead
// of a pattern (when a value has a character no pattern may allow).
const maxValues = 5

// safeChars are the characters a suggested pattern may allow besides
// letters and digits: none of the shell's, quoting or escaping ones.
const safeChars = " -_./:@=+,%"

func (g *group) add(args json.RawMessage, at time.Time) bool {
	names, values, ok := members(args)
	if !ok {
		return false
	}
	g.n++
	if g.first.IsZero() {
		g.first = at
	}
	g.last = at
	for i, k := range names {
		raw := values[i]
		f := g.fields[k]
		if f == nil {
			f = &field{constant: slices.Clone(raw), same: true, lo: math.Inf(1), hi: math.Inf(-1), minLen: math.MaxInt}
			g.fields[k] = f
		}
		f.add(raw)
	}
	return true
}

// members are the arguments' names and values, as json.Unmarshal into a
// map reads them, walked once (approval.Members) when no name repeats.
func members(args json.RawMessage) (names []string, values []json.RawMessage, ok bool) {
	dup := false
	ok = approval.Members(args, func(k string, v []byte) {
		dup = dup || slices.Contains(names, k)
		names, values = append(names, k), append(values, v)
	})
	if ok && !dup {
		return names, values, true
	}
	var all map[string]json.RawMessage
	if json.Unmarshal(args, &all) != nil {
		return nil, nil, false
	}
	names, values = names[:0], values[:0]
	for k, v := range all {
		names, values = append(names, k), append(values, v)
	}
	return names, values, true
}

func (f *field) add(raw json.RawMessage) {
	f.seen++
	kind := "other"
	var s string
	var n float64
	switch {
	case len(raw) > 1 && raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw):
		// A string without escapes, valid UTF-8: what json.Unmarshal reads.
		kind, s = "string", string(raw[1:len(raw)-1])
	case len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil:
		kind = "string"
	case len(raw) > 0 && (raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9') && json.Unmarshal(raw, &n) == nil:
		kind = "number"
	case bytes.Equal(raw, []byte("true")) || bytes.Equal(raw, []byte("false")):
		kind = "bool"
	}
	switch {
	case f.kind == "":
		f.kind = kind
	case f.kind != kind:
		f.kind = "mixed"
	}
	if f.same && !jsonEqual(f.constant, raw) {
		f.same = false
	}
	switch kind {
	case "number":
		f.lo, f.hi = min(f.lo, n), max(f.hi, n)
	case "string":
		// chars are those of the values past the common prefix: when the
		// prefix shrinks, what it loses joins every earlier value's rest.
		rest := s
		if f.seen == 1 {
			f.prefix, rest = s, ""
		} else {
			p := commonPrefix(f.prefix, s)
			f.note(f.prefix[len(p):])
			f.prefix, rest = p, s[len(p):]
		}
		f.note(rest)
		f.minLen, f.maxLen = min(f.minLen, len(s)), max(f.maxLen, len(s))
		for _, r := range s {
			if r >= 128 || !(isAlnum(byte(r)) || strings.ContainsRune(safeChars, r)) {
				f.unsafe = true
			}
		}
		if len(f.values) <= maxValues && !slices.Contains(f.values, s) {
			f.values = append(f.values, s)
		}
	}
}

// note adds the characters of s to the pattern's class.
func (f *field) note(s string) {
	for i := range len(s) {
		if s[i] < 128 {
			f.chars[s[i]] = true
		}
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true // the usual case, without compacting both
	}
	x, errA := approval.Compact(a)
	y, errB := approval.Compact(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

func commonPrefix(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return a[:i]
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// match is the CEL condition every call of g meets, and no call with
// another field, another requester, or a value outside what was approved;
// why says why there is none.
func (g *group) match(requester string) (string, string) {
	switch {
	case g.wrong:
		return "", "an approval of the group was marked wrong afterwards"
	case requester == "":
		return "", "the audit does not name the requester"
	}
	keys := slices.Sorted(maps.Keys(g.fields))
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = strconv.Quote(k)
	}
	conds := []string{"requester == " + strconv.Quote(requester),
		"args.all(k, k in [" + strings.Join(quoted, ", ") + "])"}
	for _, k := range keys {
		f := g.fields[k]
		ref := "args[" + strconv.Quote(k) + "]"
		c, why := f.cond(ref)
		if why != "" {
			return "", fmt.Sprintf("argument %s: %s", k, why)
		}
		if f.seen < g.n {
			c = "(!(" + strconv.Quote(k) + " in args) || " + c + ")"
		}
		conds = append(conds, c)
	}
	return strings.Join(conds, " && "), ""
}

// cond is the narrowest condition on ref that every value of f meets.
func (f *field) cond(ref string) (string, string) {
	if f.same {
		lit, ok := celLiteral(f.constant)
		if !ok {
			return "", "a value no rule can pin"
		}
		return ref + " == " + lit, ""
	}
	switch f.kind {
	case "number":
		return fmt.Sprintf("%s >= %s && %s <= %s", ref, double(f.lo), ref, double(f.hi)), ""
	case "bool":
		return "type(" + ref + ") == bool", ""
	case "string":
		if !f.unsafe {
			return ref + `.matches(r"` + f.pattern() + `")`, ""
		}
		if len(f.values) <= maxValues {
			lits := make([]string, len(f.values))
			for i, v := range f.values {
				lits[i] = strconv.Quote(v)
			}
			return ref + " in [" + strings.Join(lits, ", ") + "]", ""
		}
		return "", fmt.Sprintf("its values hold characters outside letters, digits and %q, and more than %d differ", safeChars, maxValues)
	}
	return "", "its values differ in shape (objects, lists or mixed types)"
}

// pattern is an anchored RE2 pattern: the common prefix, then the
// characters used, as many as were approved.
func (f *field) pattern() string {
	var class strings.Builder
	has := func(lo, hi byte) bool {
		for c := lo; c <= hi; c++ {
			if f.chars[c] {
				return true
			}
		}
		return false
	}
	for _, r := range [][2]byte{{'a', 'z'}, {'A', 'Z'}, {'0', '9'}} {
		if has(r[0], r[1]) {
			class.WriteString(string(r[0]) + "-" + string(r[1]))
		}
	}
	dash := false
	for _, c := range []byte(safeChars) {
		switch {
		case !f.chars[c]:
		case c == '-':
			dash = true
		default:
			class.WriteByte(c)
		}
	}
	if dash {
		class.WriteByte('-') // last in a class, a dash is itself
	}
	lo, hi := f.minLen-len(f.prefix), f.maxLen-len(f.prefix)
	p := "^" + escapeRE(f.prefix)
	if hi > 0 {
		p += fmt.Sprintf("[%s]{%d,%d}", class.String(), lo, hi)
	}
	return p + "$"
}

// escapeRE escapes the regexp metacharacters of s, which holds only
// letters, digits and safeChars.
func escapeRE(s string) string {
	var b strings.Builder
	for i := range len(s) {
		if strings.IndexByte(`.+`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// double writes v as a CEL double literal (JSON numbers are doubles).
func double(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

// celLiteral writes a JSON value as the CEL literal it decodes to (numbers
// as doubles); false for a value that has none.
func celLiteral(raw json.RawMessage) (string, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	return literal(v)
}

func literal(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "null", true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return "", false
		}
		return double(x), true
	case string:
		return strconv.Quote(x), true
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			l, ok := literal(e)
			if !ok {
				return "", false
			}
			parts[i] = l
		}
		return "[" + strings.Join(parts, ", ") + "]", true
	case map[string]any:
		parts := make([]string, 0, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			l, ok := literal(x[k])
			if !ok {
				return "", false
			}
			parts = append(parts, strconv.Quote(k)+": "+l)
		}
		return "{" + strings.Join(parts, ", ") + "}", true
	}
	return "", false
}
