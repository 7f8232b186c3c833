package approval

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/google/cel-go/cel"
)

// Signal codes, stable for machines (metrics, audit, card rendering).
const (
	// SignalReviewAlways: the tool is configured with review: always.
	SignalReviewAlways = "review_always"
	// SignalRiskHigh: the tool's risk is high.
	SignalRiskHigh = "risk_high"
	// SignalSensitiveCapability: the tool has a capability listed as
	// sensitive (one signal per capability).
	SignalSensitiveCapability = "sensitive_capability"
	// SignalLowConfidence: the model's confidence is below the minimum,
	// invalid, or missing for a tool that is not low risk.
	SignalLowConfidence = "low_confidence"
	// SignalWhenRule: the tool's when rule returned true.
	SignalWhenRule = "when_rule"
	// SignalQuorumRule: one of the tool's quorum_when rules returned true
	// and raised the quorum.
	SignalQuorumRule = "quorum_rule"
	// SignalReviewAfter: the tool is configured with review: after and
	// nothing else fired: the call runs when its cancel window ends.
	SignalReviewAfter = "review_after"
	// SignalWhenError: a when or quorum_when rule could not be evaluated
	// (for example a missing argument); the gate fails closed.
	SignalWhenError = "when_error"
	// SignalOpenWorld: a tool the policy does not declare says it is not
	// destructive but acts on the open world (MCP's openWorldHint, the
	// default): a person looks under review auto.
	SignalOpenWorld = "open_world"
)

// DenyRule refuses the calls its When expression matches, without asking
// anyone; Reason is told to the model and the task thread.
type DenyRule struct {
	// When is a CEL expression over args, tool and requester.
	When   string
	Reason string
}

// DefaultDecisions are the decisions offered when a tool names none.
var DefaultDecisions = []Verdict{VerdictApprove, VerdictReject}

// QuorumRule raises a tool's quorum for the calls its When expression
// matches, e.g. two approvals for refunds above $500. When several rules
// match, the highest quorum wins; a tool's own Quorum is the floor.
type QuorumRule struct {
	// When is a CEL expression over args, tool and requester.
	When   string
	Quorum int
	// Reason says in words why the rule needs more approvals; empty shows
	// the rule in its plainest form.
	Reason string
}

// CheckReviewNever reports why tp may not use review: never or review:
// after, the modes in which a call runs without anyone approving it first:
// a high-risk tool or one with a sensitive capability must always be
// assessable, and under after a quorum above one could never be met by a
// single cancel. It returns nil when the mode is allowed (or not used).
func CheckReviewNever(tp ToolPolicy, sensitive []string) error {
	if tp.Review != ReviewNever && tp.Review != ReviewAfter {
		return nil
	}
	if tp.Risk == RiskHigh {
		return fmt.Errorf(`%q is not allowed for a high-risk tool`, tp.Review)
	}
	for _, c := range tp.Capabilities {
		if slices.Contains(sensitive, c) {
			return fmt.Errorf(`%q is not allowed for a tool with sensitive capability %s`, tp.Review, c)
		}
	}
	if tp.Review == ReviewAfter && tp.Quorum > 1 {
		return fmt.Errorf(`%q is not allowed with quorum %d: nobody approves a call in a cancel window`, tp.Review, tp.Quorum)
	}
	return nil
}

// Gate applies a Policy to proposed tool calls. It is the only place where
// Countersign decides whether a human must look. A Gate is immutable and
// safe for concurrent use.
type Gate struct {
	minConfidence float64
	sensitive     []string
	tools         map[string]*gateTool
	names         []string  // sorted
	external      *gateTool // nil when the policy has no external rule
	passkeyAdmins Approvers // Policy.PasskeyAdmins; zero: the approvals channel's members
}

type gateTool struct {
	policy ToolPolicy
	when   *rule // nil when the tool has no when rule
	quorum []quorumRule
	deny   []denyRule
	hinted []Signal    // facts about an undeclared tool from its annotations
	stepUp *stepUpRule // nil: no step-up (approval/stepup.go)
}

type denyRule struct {
	rule
	reason string
}

type rule struct {
	expr string
	prg  cel.Program
	// fired is the signal's text when the rule fires, built once when the
	// rule is compiled: it depends on the rule alone, and rendering it
	// (PlainRule's regular expressions) for every call cost replay a
	// fifth of its time.
	fired string
}

type quorumRule struct {
	rule
	quorum int
}

// NewGate validates p, fills zero values with defaults (risk medium,
// review auto, quorum 1, decisions approve and reject, min confidence
// DefaultMinConfidence, sensitive capabilities DefaultSensitiveCapabilities
// when nil) and compiles every when and quorum_when rule. All problems are
// returned together, each naming its tool.
func NewGate(p Policy) (*Gate, error) {
	g := &Gate{
		minConfidence: p.MinConfidence,
		passkeyAdmins: ptrOr(p.PasskeyAdmins),
		sensitive:     p.SensitiveCapabilities,
		tools:         make(map[string]*gateTool, len(p.Tools)),
	}
	var errs []error
	g.minConfidence = cmp.Or(g.minConfidence, DefaultMinConfidence)
	if math.IsNaN(g.minConfidence) || g.minConfidence < 0 || g.minConfidence > 1 {
		errs = append(errs, fmt.Errorf("min confidence %v: must be between 0 and 1", p.MinConfidence))
	}
	if g.sensitive == nil {
		g.sensitive = DefaultSensitiveCapabilities
	}
	g.sensitive = slices.Clone(g.sensitive)

	for _, name := range slices.Sorted(maps.Keys(p.Tools)) {
		t, err := g.compileTool(name, p.Tools[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("tool %q: %w", name, err))
			continue
		}
		g.tools[name] = t
		g.names = append(g.names, name)
	}
	if p.External != nil {
		ext := p.External.Clone()
		ext.Name = externalName
		t, err := g.compileTool(externalName, ext)
		if err != nil {
			errs = append(errs, fmt.Errorf("external: %w", err))
		} else {
			g.external = t
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new gate: %w", err)
	}
	return g, nil
}

// StricterRule combines a rule's review and risk with a tool's hints:
// the stricter review (never < after < auto < always) and the higher risk.
func StricterRule(review Review, risk Risk, h ToolAnnotations) (Review, Risk) {
	hr, hk := h.Rule()
	rank := map[Review]int{ReviewNever: 0, ReviewAfter: 1, ReviewAuto: 2, ReviewAlways: 3}
	if rank[hr] > rank[review] {
		review = hr
	}
	level := map[Risk]int{RiskLow: 0, RiskMedium: 1, RiskHigh: 2}
	if level[hk] > level[risk] {
		risk = hk
	}
	return review, risk
}

// externalName is the name the external rule is compiled under.
const externalName = "external"

func (g *Gate) compileTool(name string, tp ToolPolicy) (*gateTool, error) {
	tp = tp.Clone()
	var errs []error
	switch {
	case tp.Name == "":
		tp.Name = name
	case tp.Name != name:
		errs = append(errs, fmt.Errorf("name %q differs from its key", tp.Name))
	}
	switch tp.Risk {
	case "":
		tp.Risk = RiskMedium
	case RiskLow, RiskMedium, RiskHigh:
	default:
		errs = append(errs, fmt.Errorf("risk %q: must be low, medium or high", tp.Risk))
	}
	switch tp.Review {
	case "":
		tp.Review = ReviewAuto
	case ReviewAuto, ReviewAlways, ReviewNever, ReviewAfter:
	default:
		errs = append(errs, fmt.Errorf("review %q: must be auto, always, never or after", tp.Review))
	}
	switch {
	case tp.Review == ReviewAfter && tp.CancelWindow <= 0:
		errs = append(errs, errors.New(`cancel_window: required (positive) under review "after"`))
	case tp.Review != ReviewAfter && tp.CancelWindow != 0:
		errs = append(errs, errors.New(`cancel_window: only used under review "after"`))
	}
	switch {
	case math.IsNaN(tp.Sample) || tp.Sample < 0 || tp.Sample > 1:
		errs = append(errs, fmt.Errorf("sample %v: must be between 0 and 1", tp.Sample))
	case tp.Sample > 0 && (tp.Review == ReviewAlways || tp.Review == ReviewAfter):
		errs = append(errs, fmt.Errorf("sample: has no effect under review %q (a human sees every call)", tp.Review))
	}
	if err := CheckReviewNever(tp, g.sensitive); err != nil {
		errs = append(errs, fmt.Errorf("review: %w", err))
	}
	if tp.Review == ReviewNever && (tp.When != "" || len(tp.QuorumWhen) > 0) {
		errs = append(errs, errors.New(`when and quorum_when have no effect under review "never"`))
	}
	switch {
	case tp.Quorum == 0:
		tp.Quorum = 1
	case tp.Quorum < 0:
		errs = append(errs, fmt.Errorf("quorum %d: must be at least 1", tp.Quorum))
	}
	if len(tp.Decisions) == 0 {
		tp.Decisions = slices.Clone(DefaultDecisions)
	}
	for _, d := range tp.Decisions {
		if !d.Human() {
			errs = append(errs, fmt.Errorf("decision %q: must be approve, edit, reject or respond", d))
		}
	}

	t := &gateTool{}
	if tp.When != "" {
		prg, err := compileWhen(tp.When)
		if err != nil {
			errs = append(errs, fmt.Errorf("when: %w", err))
		} else {
			t.when = &rule{expr: tp.When, prg: prg, fired: ruleText(tp.WhenReason, tp.When)}
		}
	}
	for i, q := range tp.QuorumWhen {
		if q.Quorum < 1 {
			errs = append(errs, fmt.Errorf("quorum_when[%d].quorum %d: must be at least 1", i, q.Quorum))
		}
		prg, err := compileWhen(q.When)
		if err != nil {
			errs = append(errs, fmt.Errorf("quorum_when[%d].when: %w", i, err))
			continue
		}
		fired := fmt.Sprintf("%s: %d approvals needed", ruleText(q.Reason, q.When), q.Quorum)
		t.quorum = append(t.quorum, quorumRule{rule: rule{expr: q.When, prg: prg, fired: fired}, quorum: q.Quorum})
	}
	for i, d := range tp.Deny {
		if strings.TrimSpace(d.Reason) == "" {
			errs = append(errs, fmt.Errorf("deny[%d].reason: required (it is what the model and the requester are told)", i))
		}
		prg, err := compileWhen(d.When)
		if err != nil {
			errs = append(errs, fmt.Errorf("deny[%d].when: %w", i, err))
			continue
		}
		t.deny = append(t.deny, denyRule{rule: rule{expr: d.When, prg: prg}, reason: strings.TrimSpace(d.Reason)})
	}
	if su, err := compileStepUp(tp.StepUp); err != nil {
		errs = append(errs, err)
	} else {
		t.stepUp = su
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t.policy = tp
	return t, nil
}

// Tools returns the names of the tools the gate knows, sorted.
func (g *Gate) Tools() []string { return slices.Clone(g.names) }

// Policy returns the resolved policy of a tool (defaults applied), and
// false when the tool is unknown.
func (g *Gate) Policy(tool string) (ToolPolicy, bool) {
	t, ok := g.tools[tool]
	if !ok {
		return ToolPolicy{}, false
	}
	return t.policy.Clone(), true
}

func ptrOr[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

// PasskeyAdmins are who may vouch for a passkey enrollment
// (Policy.PasskeyAdmins; zero: the approvals channel's members).
func (g *Gate) PasskeyAdmins() Approvers { return g.passkeyAdmins }

// Secret names tool's argument properties audited redacted (its
// policy's secret, defaults applied); nil for a tool the gate does not
// know. The slice is the gate's: read it, never change it.
func (g *Gate) Secret(tool string) []string {
	if t, ok := g.tools[tool]; ok {
		return t.policy.Secret
	}
	return nil
}

// Assess decides whether call needs a human. It is deterministic: the same
// call, requester and policy always give the same Assessment.
//
// It returns an error wrapping ErrUnknownTool for a tool the policy does
// not declare, and ErrInvalidArgs when call.Args is not a JSON object
// (empty arguments count as {}). Both mean the call must not run.
//
// Deny rules come first, whatever the review mode: when one matches, the
// Assessment carries Denied (the rule and its reason) and the call must
// not run; nobody is asked. A deny rule that cannot be evaluated (a
// missing argument) fires when_error, so a human looks; under review
// "never", where nobody would, it denies.
//
// Under review "never" no human is needed and no signal is reported.
// Under "always" a human is needed; Signals starts with review_always and
// lists every other signal that fired. Under "auto" a human is needed when
// any signal fires: risk_high, sensitive_capability (facts about the tool),
// low_confidence, when_rule, quorum_rule or when_error (facts about the
// call). A rule that cannot be evaluated fails closed (when_error). A tool
// that should run unreviewed below some threshold must therefore be
// neither high-risk nor hold a sensitive capability; its when rule then
// says precisely when a human looks.
//
// A missing model confidence fires low_confidence for medium- and
// high-risk tools and is ignored for low-risk ones (and for outside
// callers, AssessExternal). Assessment.Policy.Quorum
// is the effective quorum: the tool's quorum raised by matching
// quorum_when rules (by the highest of them when one cannot be evaluated).
func (g *Gate) Assess(call ToolCall, requester string) (Assessment, error) {
	t, ok := g.tools[call.Tool]
	if !ok {
		return Assessment{}, fmt.Errorf("assess %q: %w", call.Tool, ErrUnknownTool)
	}
	return g.assess(t, call, requester, false)
}

// AssessExternal assesses a call made by an outside agent (the HTTP API):
// a tool the policy declares is assessed by its own rule, exactly as
// Assess does; any other tool by the policy's external rule, with
// Assessment.Policy.Name set to the tool. Without an external rule an
// undeclared tool gives ErrUnknownTool. An undeclared tool whose name
// reads like a declared tool's (Confusable: a look-alike, or a slip of an
// edit or two) is never judged by the external rule: ErrConfusableTool,
// naming the declared tool (Lifecycle.Propose refuses it before, through
// CheckToolName; this keeps every caller of the gate to the same rule).
//
// An undeclared tool's annotations (call.Annotations, ToolAnnotations.Rule)
// tighten the external rule: the stricter review (never < after < auto <
// always) and the higher risk win; they never loosen it. A declared tool
// ignores them.
//
// An outside caller is not our model: a confidence it leaves out is not
// asked for (no low_confidence), while one it gives is judged as Assess
// judges the model's.
func (g *Gate) AssessExternal(call ToolCall, requester string) (Assessment, error) {
	if t, ok := g.tools[call.Tool]; ok {
		return g.assess(t, call, requester, true)
	}
	if d, ok := lookalike(call.Tool, g.names); ok {
		return Assessment{}, fmt.Errorf("assess %q: looks like the declared tool %q but is not it: %w", call.Tool, d, ErrConfusableTool)
	}
	if g.external == nil {
		return Assessment{}, fmt.Errorf("assess %q: %w", call.Tool, ErrUnknownTool)
	}
	ext := g.external
	if call.Annotations != nil {
		review, risk := StricterRule(ext.policy.Review, ext.policy.Risk, *call.Annotations)
		// Not destructive, but acting on the open world: a person looks,
		// for that reason (only our model is asked for a confidence).
		hr, hk := call.Annotations.Rule()
		hinted := hr == ReviewAuto && hk == RiskMedium && review == ReviewAuto
		if review != ext.policy.Review || risk != ext.policy.Risk || hinted {
			t := *ext
			t.policy = ext.policy.Clone()
			t.policy.Review, t.policy.Risk = review, risk
			if hinted {
				t.hinted = []Signal{{Code: SignalOpenWorld, Text: "the tool's hints say it acts on the open world (not read-only, not destructive)"}}
			}
			ext = &t
		}
	}
	a, err := g.assess(ext, call, requester, true)
	a.Policy.Name = call.Tool
	return a, err
}

// assess judges call under t. outside is a caller that is not our model
// (AssessExternal): its missing confidence is not a signal.
func (g *Gate) assess(t *gateTool, call ToolCall, requester string, outside bool) (Assessment, error) {
	// The arguments are parsed only for a rule to read them; a tool
	// without one checks they are one object all the same (policy replay
	// judges every call twice, and the policy in force often has no rule
	// for the tool).
	var vars map[string]any
	if len(t.deny) > 0 || t.when != nil || len(t.quorum) > 0 {
		args, err := decodeArgs(call.Args)
		if err != nil {
			return Assessment{}, fmt.Errorf("assess %s: %w", call.Tool, err)
		}
		vars = map[string]any{"args": args, "tool": call.Tool, "requester": requester}
	} else if !isObject(call.Args) {
		if _, err := decodeArgs(call.Args); err != nil {
			return Assessment{}, fmt.Errorf("assess %s: %w", call.Tool, err)
		}
	}
	a := Assessment{Tool: call.Tool, Policy: t.policy.Clone()}
	var dynamic []Signal // facts about the call
	for _, d := range t.deny {
		fired, err := d.eval(vars)
		switch {
		case err != nil && t.policy.Review == ReviewNever:
			// Nobody would look: refuse.
			a.Denied = &Denial{Rule: d.expr, Reason: fmt.Sprintf("deny rule %s could not be evaluated (%v), so the call is refused", d.expr, err)}
		case err != nil:
			// Not provably denied, so a human must look (fail closed).
			dynamic = append(dynamic, Signal{Code: SignalWhenError, Text: fmt.Sprintf("deny rule %s could not be evaluated: %v", d.expr, err)})
		case fired:
			a.Denied = &Denial{Rule: d.expr, Reason: d.reason}
		}
		if a.Denied != nil {
			a.NeedsHuman = true // see Assessment.Denied
			return a, nil
		}
	}
	if t.policy.Review == ReviewNever {
		return a, nil
	}

	// static signals describe the tool; dynamic ones depend on the call.
	var static []Signal
	if t.policy.Risk == RiskHigh {
		static = append(static, Signal{Code: SignalRiskHigh, Text: "risk is high"})
	}
	static = append(static, t.hinted...)
	var seen []string
	for _, c := range t.policy.Capabilities {
		if slices.Contains(g.sensitive, c) && !slices.Contains(seen, c) {
			seen = append(seen, c)
			static = append(static, Signal{Code: SignalSensitiveCapability, Text: capabilityText(c)})
		}
	}
	if s, ok := g.confidence(t.policy.Risk, call.Confidence, outside); ok {
		dynamic = append(dynamic, s)
	}

	if t.when != nil {
		fired, err := t.when.eval(vars)
		switch {
		case err != nil:
			dynamic = append(dynamic, Signal{Code: SignalWhenError, Text: fmt.Sprintf("rule %s could not be evaluated: %v", t.when.expr, err)})
		case fired:
			dynamic = append(dynamic, Signal{Code: SignalWhenRule, Text: t.when.fired})
		}
	}
	for _, q := range t.quorum {
		fired, err := q.eval(vars)
		switch {
		case err != nil:
			dynamic = append(dynamic, Signal{Code: SignalWhenError, Text: fmt.Sprintf("quorum rule %s could not be evaluated: %v", q.expr, err)})
		case fired:
			dynamic = append(dynamic, Signal{Code: SignalQuorumRule, Text: q.fired})
		default:
			continue
		}
		a.Policy.Quorum = max(a.Policy.Quorum, q.quorum)
	}

	switch t.policy.Review {
	case ReviewAlways:
		a.NeedsHuman = true
		a.Signals = append([]Signal{{Code: SignalReviewAlways, Text: "tool is always reviewed"}}, static...)
	case ReviewAfter:
		// A call that fires a signal is reviewed before, as under auto;
		// the others run when their cancel window ends.
		a.NeedsHuman = true
		a.Signals = static
		if len(dynamic) == 0 && len(static) == 0 {
			a.Window = t.policy.CancelWindow
			a.Signals = []Signal{{Code: SignalReviewAfter, Text: "runs after a cancel window unless an approver cancels it"}}
		}
	default: // ReviewAuto
		a.NeedsHuman = len(dynamic) > 0 || len(static) > 0
		if a.NeedsHuman {
			a.Signals = static
		}
	}
	if a.NeedsHuman {
		a.Signals = append(a.Signals, dynamic...)
	}
	return a, nil
}

// confidence returns the low_confidence signal when it fires. Only our
// model is asked for a confidence: an outside caller's missing one is not
// a signal.
func (g *Gate) confidence(risk Risk, c *float64, outside bool) (Signal, bool) {
	switch {
	case c == nil && (risk == RiskLow || outside):
		return Signal{}, false
	case c == nil:
		return Signal{Code: SignalLowConfidence, Text: fmt.Sprintf("model gave no confidence (required for %s-risk tools)", risk)}, true
	case math.IsNaN(*c) || *c < 0 || *c > 1:
		return Signal{Code: SignalLowConfidence, Text: fmt.Sprintf("model confidence %s is not between 0 and 1", formatConfidence(*c))}, true
	case *c < g.minConfidence:
		return Signal{Code: SignalLowConfidence, Text: fmt.Sprintf("model confidence %s is below %s", formatConfidence(*c), formatConfidence(g.minConfidence))}, true
	}
	return Signal{}, false
}

// formatConfidence prints v exactly, with at least two decimals (0.6 →
// "0.60", 0.425 → "0.425"), so a value just under the minimum never reads
// as equal to it.
func formatConfidence(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	dot := strings.IndexByte(s, '.')
	if dot < 0 {
		return s + ".00"
	}
	if decimals := len(s) - dot - 1; decimals < 2 {
		s += strings.Repeat("0", 2-decimals)
	}
	return s
}

// isObject reports whether decodeArgs accepts raw (nothing, or one JSON
// object), without building the map; false leaves the verdict to
// decodeArgs, which words the error.
func isObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || t[0] == '{' && json.Valid(t)
}

// decodeArgs parses call arguments, which must be one JSON object. Numbers
// become float64 (JSON numbers are doubles).
func decodeArgs(raw json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return map[string]any{}, nil
	}
	// One Unmarshal for arguments that are one object (every call the
	// gate lets through); the decoder below only to say what is wrong.
	var obj map[string]any
	if json.Unmarshal(raw, &obj) == nil && obj != nil {
		return obj, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgs, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidArgs)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: arguments must be a JSON object", ErrInvalidArgs)
	}
	return m, nil
}

// Clone returns a copy of tp that shares no slices with it.
func (tp ToolPolicy) Clone() ToolPolicy {
	tp.Capabilities = slices.Clone(tp.Capabilities)
	tp.Decisions = slices.Clone(tp.Decisions)
	tp.Approvers = tp.Approvers.clone()
	tp.EscalateTo = tp.EscalateTo.clone()
	tp.Secret = slices.Clone(tp.Secret)
	tp.QuorumWhen = slices.Clone(tp.QuorumWhen)
	tp.Deny = slices.Clone(tp.Deny)
	if tp.StepUp != nil {
		s := *tp.StepUp
		s.Methods = slices.Clone(s.Methods)
		tp.StepUp = &s
	}
	return tp
}

func (a Approvers) clone() Approvers {
	a.Users = slices.Clone(a.Users)
	a.Usergroups = slices.Clone(a.Usergroups)
	return a
}

// capabilityText says in words why a sensitive capability needs a human:
// "it can send email (a sensitive capability)". A capability's name is the
// policy's word for it; its underscores read as spaces.
func capabilityText(c string) string {
	return "it can " + strings.ReplaceAll(c, "_", " ") + " (a sensitive capability)"
}
