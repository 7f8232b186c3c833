package policyfile

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

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

// MaxCallerIdentity bounds an identity of api.keys[].callers (and what a
// call may name as its caller): an email or a JWT subject, not a document.
const MaxCallerIdentity = 256

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
	headerName  = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)
	httpMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
)

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
	} // its shape is checked where it is read (slackID)
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
	if a := r.slack.passkeyAdmins; a != nil {
		if noOne(*a) {
			d.errAt("slack.passkey_admins", "names no one: list users or usergroups, or set channel_members: true")
		}
		if a.AllowSelf {
			d.errAt("slack.passkey_admins.allow_self", "is not allowed: nobody vouches for their own passkey")
		}
		f.Policy.PasskeyAdmins = a
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
		for _, c := range k.callers {
			id, user := strings.TrimSpace(deref(c.identity)), strings.TrimSpace(deref(c.slackUser))
			switch {
			case id == "":
				d.errAt(c.path+".identity", "required: the identity the gateway asserts (a JWT's email or sub, or its caller header)")
			case len(id) > MaxCallerIdentity:
				d.errAt(c.path+".identity", "is longer than %d bytes", MaxCallerIdentity)
			case key.Callers[id] != "":
				d.errAt(c.path+".identity", "duplicate caller %q in this key", id)
			case user == "":
				d.errAt(c.path+".slack_user", "required: the Slack user the caller is (named on cards, refused as the approver of their own calls)")
			default:
				if key.Callers == nil {
					key.Callers = map[string]string{}
				}
				key.Callers[id] = user
			}
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
