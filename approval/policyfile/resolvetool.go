package policyfile

import (
	"cmp"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// apply overlays the rules a tool or the defaults set onto tp.
func (d *decoder) apply(tp *approval.ToolPolicy, r *rawRules, path string) {
	if r.risk != nil {
		switch v := approval.Risk(*r.risk); v {
		case approval.RiskLow, approval.RiskMedium, approval.RiskHigh:
			tp.Risk = v
		default:
			d.errAt(path+".risk", "must be low, medium or high, got %q", *r.risk)
		}
	}
	if r.review != nil {
		p := path + ".review"
		if d.present(p + ".mode") {
			p += ".mode"
		}
		switch v := approval.Review(*r.review); v {
		case approval.ReviewAuto, approval.ReviewAlways, approval.ReviewNever, approval.ReviewAfter:
			tp.Review = v
		default:
			d.errAt(p, "must be auto, always, never or after, got %q", *r.review)
		}
	}
	if r.decisions != nil {
		p := path + ".decisions"
		var ds []approval.Verdict
		for i, s := range r.decisions {
			if v := approval.Verdict(s); v.Human() {
				ds = append(ds, v)
			} else {
				d.errAt(index(p, i), "must be approve, edit, reject or respond, got %q", s)
			}
		}
		if len(r.decisions) == 0 {
			d.errAt(p, "must list at least one of approve, edit, reject, respond")
		}
		tp.Decisions = ds
	}
	if r.timeout != nil {
		if *r.timeout <= 0 {
			d.errAt(path+".timeout", "must be positive")
		}
		tp.Timeout = *r.timeout
	}
	if r.quorum != nil {
		if *r.quorum < 1 {
			d.errAt(path+".quorum", "must be at least 1, got %d", *r.quorum)
		}
		tp.Quorum = *r.quorum
	}
	if r.approvers != nil {
		if noOne(*r.approvers) {
			d.errAt(path+".approvers", "names no one: list users or usergroups, or set channel_members: true")
		}
		allowSelf := tp.Approvers.AllowSelf
		tp.Approvers = *r.approvers
		tp.Approvers.AllowSelf = allowSelf
	}
	if r.escalateTo != nil {
		if noOne(*r.escalateTo) {
			d.errAt(path+".escalate_to", "names no one: list users or usergroups, or set channel_members: true")
		}
		tp.EscalateTo = *r.escalateTo
	}
	if r.allowSelf != nil {
		tp.Approvers.AllowSelf = *r.allowSelf
	}
	if r.remindAfter != nil {
		tp.RemindAfter = *r.remindAfter
	}
	if r.escalateAfter != nil {
		tp.EscalateAfter = *r.escalateAfter
	}
	if r.remember != nil {
		tp.Remember = *r.remember
	}
	if r.preauthorize != nil {
		if *r.preauthorize < 0 || *r.preauthorize > approval.MaxPreauthorize {
			d.errAt(path+".preauthorize", "must be between 0 (off) and %s, got %s", duration.Format(approval.MaxPreauthorize), duration.Format(*r.preauthorize))
		}
		tp.Preauthorize = *r.preauthorize
	}
	if r.preauthLimits != nil {
		tp.PreauthorizeLimits = *r.preauthLimits
	}
	if r.widen != nil {
		tp.WidenOnEscalation = *r.widen
	}
	if r.cancelWindow != nil {
		if *r.cancelWindow <= 0 {
			d.errAt(path+".cancel_window", "must be positive, got %s", duration.Format(*r.cancelWindow))
		}
		tp.CancelWindow = *r.cancelWindow
	}
	if r.sample != nil {
		if v := *r.sample; math.IsNaN(v) || v < 0 || v > 1 {
			d.errAt(path+".sample", "must be between 0 and 1 (a fraction of the calls), got %v", v)
		}
		tp.Sample = *r.sample
	}
	d.applyStepUp(tp, r.stepUp)
}

func noOne(a approval.Approvers) bool {
	return len(a.Users) == 0 && len(a.Usergroups) == 0 && !a.ChannelMembers
}

// combos checks rules that involve several keys. For a tool (t != nil) a
// check runs only when the tool itself sets one of its keys, so a mistake
// in defaults is reported once, at defaults.
func (d *decoder) combos(tp approval.ToolPolicy, r *rawRules, t *rawTool, path string) {
	own := func(set ...bool) bool { return t == nil || slices.Contains(set, true) }
	if tp.RemindAfter > 0 && tp.RemindAfter >= tp.Timeout && own(r.remindAfter != nil, r.timeout != nil) {
		d.errAt(path+".remind_after", "%s must be shorter than timeout %s (set 0 to turn reminders off)", duration.Format(tp.RemindAfter), duration.Format(tp.Timeout))
	}
	if tp.EscalateAfter > 0 && own(r.escalateAfter != nil, r.escalateTo != nil, r.timeout != nil) {
		switch {
		case noOne(tp.EscalateTo):
			d.errAt(path+".escalate_to", "required when escalate_after is set")
		case tp.EscalateAfter >= tp.Timeout:
			d.errAt(path+".escalate_after", "%s must be shorter than timeout %s", duration.Format(tp.EscalateAfter), duration.Format(tp.Timeout))
		}
	}
	if tp.WidenOnEscalation && noOne(tp.EscalateTo) && own(r.widen != nil, r.escalateTo != nil) {
		d.errAt(path+".widen_on_escalation", "needs escalate_to")
	}
	switch {
	case tp.Review == approval.ReviewAfter && tp.CancelWindow <= 0 && r.cancelWindow == nil && own(r.review != nil):
		d.errAt(path+".cancel_window", `required under review "after" (how long approvers may cancel a call before it runs)`)
	case tp.Review != approval.ReviewAfter && tp.CancelWindow > 0 && own(r.review != nil, r.cancelWindow != nil):
		d.errAt(path+".cancel_window", `only used under review "after", review is %q`, tp.Review)
	case tp.Review == approval.ReviewAfter && tp.CancelWindow >= tp.Timeout && own(r.cancelWindow != nil, r.timeout != nil):
		d.errAt(path+".cancel_window", "%s must be shorter than timeout %s", duration.Format(tp.CancelWindow), duration.Format(tp.Timeout))
	}
	if tp.Sample > 0 && (tp.Review == approval.ReviewAlways || tp.Review == approval.ReviewAfter) && own(r.review != nil, r.sample != nil) {
		d.errAt(path+".sample", "has no effect under review %q: a human already sees every call", tp.Review)
	}
	var quorumWhen []rawQuorumRule
	if t != nil {
		quorumWhen = t.quorumWhen
	}
	need := tp.Quorum
	for _, q := range tp.QuorumWhen {
		need = max(need, q.Quorum)
	}
	if a := tp.Approvers; !noOne(a) && !a.ChannelMembers && len(a.Usergroups) == 0 && need > len(a.Users) && own(r.quorum != nil, r.approvers != nil, quorumWhen != nil) {
		d.errAt(path+".quorum", "a quorum of %d can never be met: approvers lists only %d user(s)", need, len(a.Users))
	}
}

// resolveTool resolves one tool declaration against the defaults.
func (d *decoder) resolveTool(rt *rawTool, base approval.ToolPolicy, sensitive []string) (Tool, approval.ToolPolicy, bool) {
	name := strings.TrimSpace(deref(rt.name))
	switch {
	case rt.invalid:
		return Tool{}, approval.ToolPolicy{}, false
	case rt.name == nil && !d.present(rt.path+".name"):
		d.errAt(rt.path+".name", "required")
		return Tool{}, approval.ToolPolicy{}, false
	case rt.name == nil:
		return Tool{}, approval.ToolPolicy{}, false // already reported
	case !toolName.MatchString(name):
		d.errAt(rt.path+".name", "must be 1 to 64 letters, digits, _ or -, got %q", name)
		return Tool{}, approval.ToolPolicy{}, false
	}
	t := Tool{Name: name, Description: strings.TrimSpace(deref(rt.description))}

	tp := base.Clone()
	tp.Name = name
	d.apply(&tp, &rt.rules, rt.path)
	if !d.remindSet && rt.rules.remindAfter == nil {
		tp.RemindAfter = DefaultRemindAfterFor(tp.Timeout)
	}
	tp.Capabilities = rt.capabilities
	tp.Secret = rt.secret
	tp.Formats = rt.formats
	if rt.stopOnRejection != nil {
		tp.StopOnRejection = *rt.stopOnRejection
	}
	tp.Confirm = tp.Risk == approval.RiskHigh
	if rt.confirm != nil {
		tp.Confirm = *rt.confirm
	}
	if rt.whenReason != nil {
		tp.WhenReason = strings.TrimSpace(*rt.whenReason)
		if rt.when == nil {
			d.errAt(rt.path+".review.reason", "says why a when rule needs a human: set review.when too")
		}
	}
	if rt.when != nil {
		tp.When = strings.TrimSpace(*rt.when)
		if err := approval.CheckWhen(tp.When); err != nil {
			d.errAt(rt.whenPath, "%v", err)
		}
	}
	for _, q := range rt.quorumWhen {
		var rule approval.QuorumRule
		rule.When = d.requiredWhen(q.path+".when", q.when)
		rule.Reason = strings.TrimSpace(deref(q.reason))
		switch {
		case q.quorum == nil && !d.present(q.path+".quorum"):
			d.errAt(q.path+".quorum", "required")
		case q.quorum != nil && *q.quorum < 1:
			d.errAt(q.path+".quorum", "must be at least 1, got %d", *q.quorum)
		case q.quorum != nil:
			rule.Quorum = *q.quorum
		}
		tp.QuorumWhen = append(tp.QuorumWhen, rule)
	}
	for _, r := range rt.deny {
		var rule approval.DenyRule
		rule.When = d.requiredWhen(r.path+".when", r.when)
		switch {
		case r.reason == nil && !d.present(r.path+".reason"):
			d.errAt(r.path+".reason", "required: it is what the model and the requester are told")
		case r.reason != nil && strings.TrimSpace(*r.reason) == "":
			d.errAt(r.path+".reason", "must not be empty: it is what the model and the requester are told")
		case r.reason != nil:
			rule.Reason = strings.TrimSpace(*r.reason)
		}
		tp.Deny = append(tp.Deny, rule)
	}
	if tp.Review == approval.ReviewAfter {
		// Like never, a call runs without anyone approving it first.
		if err := approval.CheckReviewNever(tp, sensitive); err != nil {
			d.errAt(rt.path+".review", "%v", err)
		}
	}
	if tp.Review == approval.ReviewNever {
		p := rt.path + ".review"
		if err := approval.CheckReviewNever(tp, sensitive); err != nil {
			d.errAt(p, "%v", err)
		}
		if rt.when != nil {
			d.errAt(rt.whenPath, `has no effect under review "never"`)
		}
		if rt.quorumWhen != nil {
			d.errAt(rt.path+".quorum_when", `has no effect under review "never"`)
		}
		if rt.rules.preauthorize != nil && tp.Preauthorize > 0 {
			d.errAt(rt.path+".preauthorize", `has no effect under review "never"`)
		}
	}
	d.combos(tp, &rt.rules, rt, rt.path)

	if h := rt.http; h != nil {
		t.HTTP = d.http(rt.path+".http", h)
	}
	if p := rt.preview; p != nil {
		t.Preview = d.preview(rt.path+".preview", p)
	}
	return t, tp, true
}

func (d *decoder) http(path string, h *rawHTTP) *HTTPSpec {
	s := &HTTPSpec{
		Method:       strings.ToUpper(strings.TrimSpace(deref(h.method))),
		URL:          strings.TrimSpace(deref(h.url)),
		Headers:      h.headers,
		Body:         deref(h.body),
		Timeout:      DefaultHTTPTimeout,
		MaxBodyBytes: DefaultMaxResponseBytes,
	}
	s.Method = cmp.Or(s.Method, DefaultHTTPMethod)
	if !slices.Contains(httpMethods, s.Method) {
		d.errAt(path+".method", "must be one of %s, got %q", strings.Join(httpMethods, ", "), deref(h.method))
	}
	if s.URL == "" {
		if !d.present(path + ".url") {
			d.errAt(path+".url", "required")
		}
	} else {
		d.checkURL(path+".url", s.URL)
	}
	d.headers(path+".headers", s.Headers)
	if s.Body != "" {
		if s.Method == "GET" {
			d.errAt(path+".body", "a GET request has no body")
		}
		d.parseTemplate(path+".body", s.Body)
	}
	if h.timeout != nil {
		if *h.timeout <= 0 {
			d.errAt(path+".timeout", "must be positive")
		}
		s.Timeout = *h.timeout
	}
	if h.maxResponseSize != nil {
		if *h.maxResponseSize < 1 {
			d.errAt(path+".max_response_bytes", "must be at least 1, got %d", *h.maxResponseSize)
		}
		s.MaxBodyBytes = int64(*h.maxResponseSize)
	}
	return s
}

func (d *decoder) headers(path string, hs map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(hs)) {
		if !headerName.MatchString(k) {
			d.errAt(path+"."+k, "invalid header name %q", k)
		}
		d.parseTemplate(path+"."+k, hs[k])
	}
}

// maxPreviewLabel bounds preview.label.
const maxPreviewLabel = 100

func (d *decoder) preview(path string, p *rawPreview) *PreviewSpec {
	s := &PreviewSpec{
		Label:   strings.TrimSpace(deref(p.label)),
		URL:     strings.TrimSpace(deref(p.url)),
		Headers: p.headers,
		Timeout: DefaultPreviewTimeout,
		Summary: deref(p.summary),
		Fields:  p.fields,
	}
	if utf8.RuneCountInString(s.Label) > maxPreviewLabel {
		d.errAt(path+".label", "must be at most %d characters (the card's \"Facts from …\" line)", maxPreviewLabel)
	}
	if s.URL != "" {
		d.checkURL(path+".url", s.URL)
	} else if len(s.Fields) > 0 && !d.present(path+".url") {
		d.errAt(path+".url", "required when fields are listed (fields are read from the url's JSON response)")
	}
	d.headers(path+".headers", s.Headers)
	if p.timeout != nil {
		if *p.timeout <= 0 {
			d.errAt(path+".timeout", "must be positive")
		}
		s.Timeout = *p.timeout
	}
	if s.Summary != "" {
		d.parseTemplate(path+".summary", s.Summary)
	}
	for i, f := range s.Fields {
		fp := index(path+".fields", i)
		if strings.TrimSpace(f.Label) == "" {
			d.errAt(fp+".label", "required")
		}
		if strings.TrimSpace(f.Path) == "" {
			d.errAt(fp+".path", "required")
		}
	}
	return s
}

// schema compiles a tool's argument schema and checks secret names against
// it. It sets t.Schema (compact JSON) and returns the compiled schema, nil
// when invalid.
func (d *decoder) schema(rt *rawTool, t *Tool, tp *approval.ToolPolicy) *Schema {
	path := rt.path + ".schema"
	raw := []byte(defaultSchema)
	if rt.schema != nil {
		raw = rt.schema
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil || top["type"] != "object" {
		d.errAt(path, `must be an object schema (type: object)`)
		return nil
	}
	sch, err := CompileSchema(t.Name, raw)
	if err != nil {
		d.errAt(path, "%v", err)
		return nil
	}
	t.Schema = raw
	props, _ := ReadProps(raw) // compiled: its names read
	for i, s := range tp.Secret {
		if !props.Has(s) {
			d.errAt(index(rt.path+".secret", i), "%q is not a property of the schema", s)
		}
	}
	if rt.schema != nil {
		// A tool without a schema takes whatever its caller sends: there
		// is nothing to check its rules against.
		d.checkRuleArgs(rt, tp, props)
		d.checkArgNames(rt, tp, props)
		if t.HTTP != nil {
			d.checkTemplateArgs(rt.path+".http.url", t.HTTP.URL, props)
		}
		if t.Preview != nil {
			d.checkTemplateArgs(rt.path+".preview.url", t.Preview.URL, props)
		}
	}
	return sch
}

// requiredWhen returns the CEL rule at path, reporting it missing or not
// compiling.
func (d *decoder) requiredWhen(path string, when *string) string {
	switch {
	case when == nil && !d.present(path):
		d.errAt(path, "required")
	case when != nil:
		expr := strings.TrimSpace(*when)
		if err := approval.CheckWhen(expr); err != nil {
			d.errAt(path, "%v", err)
		}
		return expr
	}
	return ""
}

// checkRuleArgs checks every rule of a tool (review.when or when,
// quorum_when, deny) against the tool's schema, whatever the review mode
// and however the rule is written: an argument the schema does not
// declare is reported with the closest one it does (such a rule can never
// be evaluated: under review auto or always every call would say so and
// ask a human, and the quorum rule's approvals; under never a deny rule
// would refuse every call), and an argument read as another type than the
// schema gives it (approval.CheckRule).
func (d *decoder) checkRuleArgs(rt *rawTool, tp *approval.ToolPolicy, props Props) {
	types := props.ArgTypes()
	check := func(path, expr string) {
		if path == "" || strings.TrimSpace(expr) == "" {
			return
		}
		refs, err := approval.ArgRefs(expr)
		if err != nil {
			return // reported by CheckWhen
		}
		for _, name := range refs {
			if !props.Has(name) {
				d.errAt(path, "args.%s is not a property of the tool's schema (%s)%s", name, props.have(), didYouMean("args.", name, props.Names()))
			}
		}
		if err := approval.CheckRule(expr, types); err != nil {
			d.errAt(path, "%v", err)
		}
	}
	check(rt.whenPath, tp.When)
	for i, q := range rt.quorumWhen {
		if i < len(tp.QuorumWhen) {
			check(q.path+".when", tp.QuorumWhen[i].When)
		}
	}
	for i, r := range rt.deny {
		if i < len(tp.Deny) {
			check(r.path+".when", tp.Deny[i].When)
		}
	}
	if s := rt.rules.stepUp; s != nil && tp.StepUp != nil {
		check(s.path+".when", tp.StepUp.When)
	}
}

// checkArgNames checks the keys of a tool that name one of its arguments
// against its schema: formats (a format for an argument the schema lacks
// is never used) and preauthorize.total.argument (the budget counts a
// number: an argument the schema lacks, or one that is not a number,
// could never be counted, and the allowance would cover nothing).
func (d *decoder) checkArgNames(rt *rawTool, tp *approval.ToolPolicy, props Props) {
	for _, name := range slices.Sorted(maps.Keys(rt.formats)) {
		if !props.Has(name) {
			d.errAt(rt.path+".formats."+name, "%q is not a property of the tool's schema (%s)%s", name, props.have(), didYouMean("", name, props.Names()))
		}
	}
	if rt.rules.preauthLimits == nil || tp.PreauthorizeLimits.Argument == "" {
		return
	}
	path, name := rt.rules.preauthPath+".total.argument", tp.PreauthorizeLimits.Argument
	switch i := slices.IndexFunc(props.List, func(p Prop) bool { return p.Name == name }); {
	case i < 0:
		d.errAt(path, "%q is not a property of the tool's schema (%s)%s", name, props.have(), didYouMean("", name, props.Names()))
	case props.List[i].ArgType() != approval.ArgNumber:
		d.errAt(path, "%q is not a number in the tool's schema (type: number or integer): a budget adds up its values", name)
	}
}

// have is "it has: a, b" for messages, or "it declares no properties".
func (ps Props) have() string {
	if len(ps.List) == 0 {
		return "it declares no properties"
	}
	return "it has: " + strings.Join(ps.sortedNames(), ", ")
}
