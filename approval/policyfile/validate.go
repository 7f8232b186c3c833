package policyfile

import (
	"cmp"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// Defaults for keys a policy file leaves out. docs/policy.md lists them all.
const (
	DefaultMaxSteps         = 8
	DefaultTimeout          = 24 * time.Hour
	DefaultRemindAfter      = time.Hour
	DefaultHTTPMethod       = "POST"
	DefaultHTTPTimeout      = 10 * time.Second
	DefaultPreviewTimeout   = 5 * time.Second
	DefaultMaxResponseBytes = 1 << 20
	DefaultAPIRatePerMinute = 120
)

// DefaultRemindAfterFor is remind_after where a policy sets none: half the
// timeout, at most DefaultRemindAfter (an hour), so a short timeout never
// makes a file that leaves reminders alone invalid.
func DefaultRemindAfterFor(timeout time.Duration) time.Duration {
	return min(DefaultRemindAfter, timeout/2)
}

// defaultSchema is used for a tool that declares no schema (no arguments).
const defaultSchema = `{"type":"object","properties":{}}`

var (
	toolName    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	sha256Hex   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	slackUser   = regexp.MustCompile(`^[UW][A-Z0-9]{2,}$`)
	headerName  = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)
	httpMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
)

// Funcs are the functions available to every template in a policy file:
// env "NAME" (getenv; the value is a secret, never logged or audited),
// json (the JSON encoding of a value) and the built-in urlquery. Callers
// executing templates pass their own getenv (os.Getenv in production).
func Funcs(getenv func(string) string) template.FuncMap {
	return template.FuncMap{
		"env": func(name string) string {
			if getenv == nil {
				return ""
			}
			return getenv(name)
		},
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		// {{currency "USD" .Data.total}} reads $1,289.00; cents "USD" reads a
		// value in minor units; date, percent and bytes as in formats.
		"currency": func(code string, v any) string {
			return approval.ValueFormat{Kind: approval.FormatCurrency, Currency: code}.Apply(v)
		},
		"cents": func(code string, v any) string {
			return approval.ValueFormat{Kind: approval.FormatCurrency, Currency: code, MinorUnits: true}.Apply(v)
		},
		"date":    func(v any) string { return approval.ValueFormat{Kind: approval.FormatDate}.Apply(v) },
		"percent": func(v any) string { return approval.ValueFormat{Kind: approval.FormatPercent}.Apply(v) },
		"bytes":   func(v any) string { return approval.ValueFormat{Kind: approval.FormatBytes}.Apply(v) },
	}
}

// parseTemplate parses text with Funcs, reporting errors at path.
func (d *decoder) parseTemplate(path, text string) {
	tpl, err := template.New(path).Funcs(Funcs(nil)).Parse(text)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "template: "+path+":")
		d.errAt(path, "template: line %s", msg)
		return
	}
	if p := envArgProblem(tpl); p != "" {
		d.errAt(path, "%s", p)
	}
}

// checkURL parses a URL template and makes sure the model's arguments can
// never choose where a request goes (hostProblem): the scheme and host are
// written literally, or come from the operator's environment as a base URL
// that a "/", "?" or "#" ends.
func (d *decoder) checkURL(path, url string) {
	d.parseTemplate(path, url) // reports a syntax error or a bad env
	tpl, err := template.New(path).Funcs(Funcs(nil)).Parse(url)
	if err != nil {
		return
	}
	if p := hostProblem(tpl); p != "" {
		d.errAt(path, "%s, got %q", p, url)
	}
}

func (d *decoder) present(path string) bool {
	_, ok := d.lines[path]
	return ok
}

// build validates the raw file, applies defaults and returns the File.
// Problems are collected in d.errs.
func (d *decoder) build(r *rawFile) *File {
	f := &File{Version: 1}
	switch {
	case r.version == nil && !d.present("version"):
		d.errAt("version", "required; must be 1")
	case r.version != nil && *r.version != 1:
		d.errAt("version", "must be 1, got %d", *r.version)
	}

	// slack
	f.Slack.ApprovalsChannel = strings.TrimSpace(deref(r.slack.approvalsChannel))
	if f.Slack.ApprovalsChannel == "" && (r.slack.approvalsChannel != nil || !d.present("slack.approvals_channel")) {
		d.errAt("slack.approvals_channel", "required")
	} else if ch := f.Slack.ApprovalsChannel; ch != "" && !channelID.MatchString(ch) {
		d.errAt("slack.approvals_channel", "%q is not a channel id: Slack posts only to an id like C0123456789 (public) or G0123456789 (private), not a name; copy it from the channel's details (About, at the bottom)", ch)
	}
	f.Slack.TaskChannels = r.slack.taskChannels
	f.Slack.AllowedTeams = r.slack.allowedTeams
	if f.Slack.ApprovalsChannel != "" && slices.Contains(f.Slack.TaskChannels, f.Slack.ApprovalsChannel) {
		d.errAt("slack.task_channels", "must not include the approvals channel %s: requesters and the model's replies must stay out of it", f.Slack.ApprovalsChannel)
	}

	// agent
	f.Agent.SystemPrompt = deref(r.agent.systemPrompt)
	f.Agent.MaxSteps = DefaultMaxSteps
	if r.agent.maxSteps != nil {
		if *r.agent.maxSteps < 1 || *r.agent.maxSteps > 100 {
			d.errAt("agent.max_steps", "must be between 1 and 100, got %d", *r.agent.maxSteps)
		}
		f.Agent.MaxSteps = *r.agent.maxSteps
	}
	f.Agent.StopOnRejection = deref(r.agent.stopOnRejection)
	for k, text := range r.agent.templates {
		d.parseTemplate("agent.templates."+k, text)
	}
	f.Agent.Templates = Templates{
		Rejected:  r.agent.templates["rejected"],
		Edited:    r.agent.templates["edited"],
		Expired:   r.agent.templates["expired"],
		Unknown:   r.agent.templates["unknown"],
		Responded: r.agent.templates["responded"],
	}

	// global policy
	f.Policy = approval.Policy{
		Version:               1,
		SensitiveCapabilities: slices.Clone(approval.DefaultSensitiveCapabilities),
		MinConfidence:         approval.DefaultMinConfidence,
		Tools:                 map[string]approval.ToolPolicy{},
	}
	if r.sensitive != nil {
		f.Policy.SensitiveCapabilities = r.sensitive // explicit [] means none
	}
	if c := r.minConfidence; c != nil {
		if *c <= 0 || *c > 1 {
			d.errAt("min_confidence", "must be greater than 0 and at most 1, got %v", *c)
		}
		f.Policy.MinConfidence = *c
	}

	// defaults
	base := approval.ToolPolicy{
		Risk:            approval.RiskMedium,
		Review:          approval.ReviewAuto,
		Decisions:       slices.Clone(approval.DefaultDecisions),
		Timeout:         DefaultTimeout,
		Quorum:          1,
		Approvers:       approval.Approvers{ChannelMembers: true},
		RemindAfter:     DefaultRemindAfter,
		StopOnRejection: f.Agent.StopOnRejection,
	}
	d.apply(&base, &r.defaults, "defaults")
	d.remindSet = r.defaults.remindAfter != nil
	if !d.remindSet {
		base.RemindAfter = DefaultRemindAfterFor(base.Timeout)
	}
	d.combos(base, &r.defaults, nil, "defaults")

	f.schemas = map[string]*Schema{}
	firstAt := map[string]string{}
	for _, rt := range r.tools {
		t, tp, ok := d.resolveTool(rt, base, f.Policy.SensitiveCapabilities)
		if !ok {
			continue
		}
		sch := d.schema(rt, &t, &tp)
		if at, dup := firstAt[t.Name]; dup {
			d.errAt(rt.path+".name", "duplicate tool name %q (first at %s)", t.Name, at)
			continue
		}
		firstAt[t.Name] = rt.path
		if sch != nil {
			f.schemas[t.Name] = sch
		}
		f.Tools = append(f.Tools, t)
		f.Policy.Tools[t.Name] = tp
	}
	// A file that only gates MCP tools (an external rule and mcp
	// upstreams) needs no tools of its own.
	mcpOnly := r.external != nil && len(r.mcp.upstreams) > 0
	switch {
	case mcpOnly:
	case !d.present("tools"):
		d.errAt("tools", "required; declare at least one tool (or, to gate only MCP tools, an external rule and mcp upstreams)")
	case r.toolsListed && len(r.tools) == 0:
		d.errAt("tools", "declare at least one tool")
	}
	if r.external != nil {
		ext := base.Clone()
		d.apply(&ext, r.external, "external")
		d.combos(ext, r.external, nil, "external")
		if r.external.preauthorize != nil && *r.external.preauthorize > 0 {
			d.errAt("external.preauthorize", "not available for external tools: an API request has no task thread to scope it to")
		}
		if r.external.remember != nil && *r.external.remember > 0 {
			d.errAt("external.remember", "not available for external tools")
		}
		ext.Preauthorize, ext.Remember = 0, 0
		f.Policy.External = &ext
	}
	f.API = d.buildAPI(&r.api, f)
	f.MCP = d.buildMCP(&r.mcp)
	return f
}

var (
	upstreamName = regexp.MustCompile(`^[A-Za-z0-9-]{1,32}$`)
	envName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// buildMCP validates the mcp key: unique upstream names, each a command
// or a URL, environment and header variable names.
func (d *decoder) buildMCP(r *rawMCP) MCP {
	out := MCP{Prefix: r.prefix == nil || *r.prefix}
	names := map[string]string{}
	for _, u := range r.upstreams {
		up := Upstream{Name: strings.TrimSpace(deref(u.name)), Command: u.command, Env: u.env,
			URL: strings.TrimSpace(deref(u.url)), HeadersEnv: u.headersEnv}
		switch {
		case up.Name == "":
			d.errAt(u.path+".name", "required")
		case !upstreamName.MatchString(up.Name):
			d.errAt(u.path+".name", "must be 1 to 32 letters, digits or -, got %q (tool names become <name>__<tool>)", up.Name)
		case names[up.Name] != "":
			d.errAt(u.path+".name", "duplicate upstream name %q (first at %s)", up.Name, names[up.Name])
		default:
			names[up.Name] = u.path
		}
		switch {
		case len(up.Command) > 0 && up.URL != "":
			d.errAt(u.path+".url", "set command (a stdio server) or url (a streamable HTTP server), not both")
		case len(up.Command) == 0 && up.URL == "":
			d.errAt(u.path, "set command (a stdio server, e.g. [npx, -y, server]) or url (a streamable HTTP server)")
		case up.URL != "" && !strings.HasPrefix(up.URL, "https://") && !strings.HasPrefix(up.URL, "http://"):
			d.errAt(u.path+".url", "must start with http:// or https://, got %q", up.URL)
		}
		if len(up.Command) > 0 && strings.TrimSpace(up.Command[0]) == "" {
			d.errAt(index(u.path+".command", 0), "the program is empty")
		}
		if up.URL != "" && len(up.Env) > 0 {
			d.errAt(u.path+".env", "env is for a command; a URL upstream takes headers_env")
		}
		if len(up.Command) > 0 && len(up.HeadersEnv) > 0 {
			d.errAt(u.path+".headers_env", "headers_env is for a URL upstream; a command takes env")
		}
		for _, k := range slices.Sorted(maps.Keys(up.Env)) {
			if !envName.MatchString(k) {
				d.errAt(u.path+".env."+k, "not an environment variable name")
			}
		}
		for _, k := range slices.Sorted(maps.Keys(up.HeadersEnv)) {
			switch v := up.HeadersEnv[k]; {
			case !headerName.MatchString(k):
				d.errAt(u.path+".headers_env."+k, "not an HTTP header name")
			case !envName.MatchString(v):
				d.errAt(u.path+".headers_env."+k, "must name the environment variable holding the header's value, got %q", v)
			}
		}
		out.Upstreams = append(out.Upstreams, up)
	}
	return out
}

// buildAPI validates the api key: unique key names and hashes, tools the
// policy admits, Slack user ids, webhook URLs and their secret variables.
func (d *decoder) buildAPI(r *rawAPI, f *File) API {
	out := API{ClaimWindow: approval.DefaultClaimWindow}
	if r.claimWindow != nil {
		switch w := *r.claimWindow; {
		case w < 10*time.Second:
			d.errAt(r.path+".claim_window", "must be at least 10s (an MCP client or SDK needs time to take up the approved call), got %s", duration.Format(w))
		case w > 7*24*time.Hour:
			d.errAt(r.path+".claim_window", "must be at most 7d, got %s", duration.Format(w))
		default:
			out.ClaimWindow = w
		}
	}
	names, hashes := map[string]string{}, map[string]string{}
	for _, k := range r.keys {
		key := APIKey{Name: strings.TrimSpace(deref(k.name)), SHA256: strings.TrimSpace(deref(k.sha256)),
			SlackUser: strings.TrimSpace(deref(k.slackUser)), RatePerMinute: DefaultAPIRatePerMinute}
		switch {
		case key.Name == "":
			d.errAt(k.path+".name", "required")
		case !toolName.MatchString(key.Name):
			d.errAt(k.path+".name", "must be 1 to 64 letters, digits, _ or -, got %q", key.Name)
		case names[key.Name] != "":
			d.errAt(k.path+".name", "duplicate key name %q (first at %s)", key.Name, names[key.Name])
		default:
			names[key.Name] = k.path
		}
		switch {
		case !sha256Hex.MatchString(key.SHA256):
			d.errAt(k.path+".sha256", "must be the key's SHA-256 as 64 lowercase hex digits (printf %%s \"$KEY\" | sha256sum), never the key itself")
		case hashes[key.SHA256] != "":
			d.errAt(k.path+".sha256", "the same key is already listed at %s", hashes[key.SHA256])
		default:
			hashes[key.SHA256] = k.path
		}
		if len(k.tools) == 0 {
			d.errAt(k.path+".tools", "required: list the tools this key may ask for, or \"*\"")
		}
		for i, tool := range k.tools {
			_, declared := f.Policy.Tools[tool]
			if tool != "*" && !declared && f.Policy.External == nil {
				d.errAt(index(k.path+".tools", i), "%q is not a declared tool and the policy has no external rule", tool)
			}
		}
		key.Tools = k.tools
		if key.SlackUser != "" && !slackUser.MatchString(key.SlackUser) {
			d.errAt(k.path+".slack_user", "must be a Slack user id such as U0123ABCD, got %q", key.SlackUser)
		}
		if k.rate != nil {
			if *k.rate < 1 {
				d.errAt(k.path+".rate_per_minute", "must be at least 1, got %d", *k.rate)
			}
			key.RatePerMinute = *k.rate
		}
		out.Keys = append(out.Keys, key)
	}
	hooks := map[string]string{}
	for _, w := range r.webhooks {
		hook := Webhook{Name: strings.TrimSpace(deref(w.name)), URL: strings.TrimSpace(deref(w.url)), SecretEnv: strings.TrimSpace(deref(w.secretEnv))}
		switch {
		case hook.Name == "":
			d.errAt(w.path+".name", "required")
		case hooks[hook.Name] != "":
			d.errAt(w.path+".name", "duplicate webhook name %q (first at %s)", hook.Name, hooks[hook.Name])
		default:
			hooks[hook.Name] = w.path
		}
		if !strings.HasPrefix(hook.URL, "https://") && !strings.HasPrefix(hook.URL, "http://") {
			d.errAt(w.path+".url", "must start with http:// or https://, got %q", hook.URL)
		}
		if hook.SecretEnv == "" {
			d.errAt(w.path+".secret_env", "required: the environment variable holding the signing secret")
		}
		if w.keys != nil && len(w.keys) == 0 {
			d.errAt(w.path+".keys", "an empty list tells the endpoint of nothing; leave keys out to tell it of every key's requests")
		}
		for i, name := range w.keys {
			if !slices.ContainsFunc(out.Keys, func(k APIKey) bool { return k.Name == name }) {
				d.errAt(index(w.path+".keys", i), "%q is not the name of a key in api.keys", name)
			}
		}
		hook.Keys = w.keys
		out.Webhooks = append(out.Webhooks, hook)
	}
	return out
}

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

func (d *decoder) preview(path string, p *rawPreview) *PreviewSpec {
	s := &PreviewSpec{
		URL:     strings.TrimSpace(deref(p.url)),
		Headers: p.headers,
		Timeout: DefaultPreviewTimeout,
		Summary: deref(p.summary),
		Fields:  p.fields,
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
	if top["additionalProperties"] == false {
		d.checkRuleArgs(rt, tp, props)
	}
	if rt.schema != nil {
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

// checkRuleArgs reports a rule that reads an argument a closed schema
// (additionalProperties: false) does not declare: such a rule can never
// be evaluated, so it would quietly send every call to a human (or, under
// review never, deny it). Usually a typo: args.amout.
func (d *decoder) checkRuleArgs(rt *rawTool, tp *approval.ToolPolicy, props Props) {
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
				d.errAt(path, "args.%s is not a property of the tool's schema (it has: %s)", name, strings.Join(props.sortedNames(), ", "))
			}
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
}

// flattenSchemaError turns the library's multi-line error into one line
// listing only the innermost problems, e.g. "at '/amount': got string,
// want number".
func flattenSchemaError(err error, url string) string {
	prefix := ""
	if sve, ok := errors.AsType[*jsonschema.SchemaValidationError](err); ok {
		prefix, err = "not a valid JSON Schema: ", sve.Err
	}
	var msgs []string
	if ve, ok := errors.AsType[*jsonschema.ValidationError](err); ok {
		var walk func(e *jsonschema.ValidationError)
		walk = func(e *jsonschema.ValidationError) {
			if len(e.Causes) == 0 {
				lines := strings.Split(strings.TrimSpace(e.Error()), "\n")
				if msg := strings.TrimPrefix(strings.TrimSpace(lines[len(lines)-1]), "- "); !slices.Contains(msgs, msg) {
					msgs = append(msgs, msg)
				}
			}
			for _, c := range e.Causes {
				walk(c)
			}
		}
		walk(ve)
	} else {
		for _, l := range strings.Split(err.Error(), "\n") {
			msgs = append(msgs, strings.TrimPrefix(strings.TrimSpace(l), "- "))
		}
	}
	msg := prefix + strings.Join(msgs, "; ")
	if url != "" {
		msg = strings.ReplaceAll(msg, url, "schema")
	}
	return msg
}
