package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/countersign/countersign/approval"
)

// Load reads and parses the policy file at path. Problems are reported as
// an ErrorList whose entries carry the file name.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy file: %w", err)
	}
	f, err := Parse(data)
	if list, ok := errors.AsType[ErrorList](err); ok {
		for _, e := range list {
			e.File = path
		}
	}
	return f, err
}

// Parse parses and validates a policy file. All problems are collected and
// returned together as an ErrorList, each naming its key path and line.
func Parse(data []byte) (*File, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, ErrorList{syntaxError(data, err)}
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, ErrorList{{Message: "policy file is empty"}}
	}
	d := &decoder{}
	raw, ok := d.file(root.Content[0])
	if !ok {
		return nil, d.errs
	}
	f := d.build(raw)
	if len(d.errs) > 0 {
		slices.SortStableFunc(d.errs, func(a, b *Error) int { return a.Line - b.Line })
		return nil, d.errs
	}
	// Whatever the file accepts, the gate must accept too.
	if _, err := approval.NewGate(f.Policy); err != nil {
		return nil, ErrorList{{Message: err.Error()}}
	}
	return f, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError reports a YAML syntax error at the line where it is. The
// YAML library often names the line where the enclosing block starts
// instead, so the first failing line is found by parsing ever longer
// prefixes of the document (binary search for the shortest prefix that
// fails with the same problem).
func syntaxError(data []byte, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	fails := func(n int) bool {
		var v yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:n], nil), &v)
		return err != nil && strings.HasSuffix(err.Error(), ": "+msg)
	}
	lo, hi := 1, len(lines) // fails(hi) holds for the whole document
	if fails(hi) {
		for lo < hi {
			if mid := (lo + hi) / 2; fails(mid) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		line = hi
	}
	return &Error{Line: line, Message: "invalid YAML: " + msg}
}

// The raw* types hold what the file said, nil meaning "not set", before
// defaults are applied.

type rawFile struct {
	version       *int
	slack         rawSlack
	agent         rawAgent
	sensitive     []string
	minConfidence *float64
	defaults      rawRules
	tools         []*rawTool
	toolsListed   bool // tools is a list (possibly empty)
	external      *rawRules
	api           rawAPI
	mcp           rawMCP
}

type rawMCP struct {
	prefix    *bool
	upstreams []rawUpstream
}

type rawUpstream struct {
	path       string
	name       *string
	command    []string
	env        map[string]string
	url        *string
	headersEnv map[string]string
}

type rawAPI struct {
	keys        []rawAPIKey
	webhooks    []rawWebhook
	claimWindow *time.Duration
	path        string
}

type rawAPIKey struct {
	path      string
	name      *string
	sha256    *string
	tools     []string
	slackUser *string
	callers   []rawCaller
	rate      *int
}

// rawCaller is one of api.keys[].callers: an identity a gateway asserts
// and the Slack user it is.
type rawCaller struct {
	path      string
	identity  *string
	slackUser *string
}

type rawWebhook struct {
	path      string
	name      *string
	url       *string
	secretEnv *string
	keys      []string
}

type rawSlack struct {
	approvalsChannel *string
	taskChannels     []string
	allowedTeams     []string
	passkeyAdmins    *approval.Approvers
}

type rawAgent struct {
	systemPrompt    *string
	maxSteps        *int
	stopOnRejection *bool
	templates       map[string]string // key → template text
}

// rawRules are the keys a tool shares with defaults.
type rawRules struct {
	risk          *string
	review        *string // mode
	decisions     []string
	timeout       *time.Duration
	quorum        *int
	approvers     *approval.Approvers
	remindAfter   *time.Duration
	escalateAfter *time.Duration
	escalateTo    *approval.Approvers
	allowSelf     *bool
	remember      *time.Duration
	preauthorize  *time.Duration
	preauthLimits *approval.GrantLimits
	preauthPath   string
	widen         *bool
	cancelWindow  *time.Duration
	sample        *float64
	stepUp        *rawStepUp // stepup.go
}

type rawTool struct {
	path            string
	invalid         bool // not a mapping; already reported
	name            *string
	description     *string
	rules           rawRules
	capabilities    []string
	when            *string
	whenPath        string
	whenReason      *string // review.reason: the when rule in words
	confirm         *bool
	quorumWhen      []rawQuorumRule
	deny            []rawDenyRule
	stopOnRejection *bool
	schema          json.RawMessage // nil when absent
	secret          []string
	http            *rawHTTP
	preview         *rawPreview
	formats         map[string]approval.ValueFormat
}

type rawQuorumRule struct {
	path   string
	when   *string
	quorum *int
	reason *string
}

type rawDenyRule struct {
	path   string
	when   *string
	reason *string
}

type rawHTTP struct {
	method          *string
	url             *string
	headers         map[string]string
	body            *string
	timeout         *time.Duration
	maxResponseSize *int
}

type rawPreview struct {
	label   *string
	url     *string
	headers map[string]string
	timeout *time.Duration
	summary *string
	fields  []PreviewField
}

func (d *decoder) file(n *yaml.Node) (*rawFile, bool) {
	r := &rawFile{}
	ok := d.mapping(n, "", handlers{
		"version": func(n *yaml.Node, p string) { r.version = d.int(n, p) },
		"slack": func(n *yaml.Node, p string) {
			d.mapping(n, p, handlers{
				"approvals_channel": func(n *yaml.Node, p string) {
					if r.slack.approvalsChannel = d.str(n, p); r.slack.approvalsChannel != nil && strings.TrimSpace(n.Value) != "" {
						d.slackID(n, p, SlackApprovals, strings.TrimSpace(n.Value))
					}
				},
				"task_channels":  func(n *yaml.Node, p string) { r.slack.taskChannels = d.slackIDs(n, p, SlackChannel) },
				"allowed_teams":  func(n *yaml.Node, p string) { r.slack.allowedTeams = d.slackIDs(n, p, SlackTeam) },
				"passkey_admins": func(n *yaml.Node, p string) { r.slack.passkeyAdmins = d.approvers(n, p) },
			})
		},
		"agent":                  func(n *yaml.Node, p string) { d.agent(n, p, &r.agent) },
		"sensitive_capabilities": func(n *yaml.Node, p string) { r.sensitive = d.strings(n, p) },
		"min_confidence":         func(n *yaml.Node, p string) { r.minConfidence = d.float(n, p) },
		"defaults":               func(n *yaml.Node, p string) { d.mapping(n, p, d.rules(&r.defaults, nil)) },
		"external": func(n *yaml.Node, p string) {
			r.external = &rawRules{}
			d.mapping(n, p, d.rules(r.external, nil))
		},
		"api": func(n *yaml.Node, p string) { d.api(n, p, &r.api) },
		"mcp": func(n *yaml.Node, p string) { d.mcp(n, p, &r.mcp) },
		"tools": func(n *yaml.Node, p string) {
			if n.Kind != yaml.SequenceNode {
				d.errorf(n, p, "must be a list of tools, got %s", describe(n))
				return
			}
			r.toolsListed = true
			for i, item := range n.Content {
				t := &rawTool{path: index(p, i)}
				d.seen(item, t.path)
				d.tool(resolve(item), t)
				r.tools = append(r.tools, t)
			}
		},
	})
	return r, ok
}

func (d *decoder) api(n *yaml.Node, path string, a *rawAPI) {
	a.path = path
	d.mapping(n, path, handlers{
		"claim_window": func(n *yaml.Node, p string) { a.claimWindow = d.duration(n, p) },
		"keys": func(n *yaml.Node, p string) {
			d.list(n, p, "{name, sha256, tools}", func(item *yaml.Node, ip string) {
				k := rawAPIKey{path: ip}
				d.mapping(item, ip, handlers{
					"name":   func(n *yaml.Node, p string) { k.name = d.str(n, p) },
					"sha256": func(n *yaml.Node, p string) { k.sha256 = d.str(n, p) },
					"tools":  func(n *yaml.Node, p string) { k.tools = d.strings(n, p) },
					"slack_user": func(n *yaml.Node, p string) {
						if k.slackUser = d.str(n, p); k.slackUser != nil && strings.TrimSpace(n.Value) != "" {
							d.slackID(n, p, SlackUser, strings.TrimSpace(n.Value))
						}
					},
					"rate_per_minute": func(n *yaml.Node, p string) { k.rate = d.int(n, p) },
					"callers": func(n *yaml.Node, p string) {
						d.list(n, p, "{identity, slack_user}", func(item *yaml.Node, ip string) {
							c := rawCaller{path: ip}
							d.mapping(item, ip, handlers{
								"identity": func(n *yaml.Node, p string) { c.identity = d.str(n, p) },
								"slack_user": func(n *yaml.Node, p string) {
									if c.slackUser = d.str(n, p); c.slackUser != nil && strings.TrimSpace(n.Value) != "" {
										d.slackID(n, p, SlackUser, strings.TrimSpace(n.Value))
									}
								},
							})
							k.callers = append(k.callers, c)
						})
					},
				})
				a.keys = append(a.keys, k)
			})
		},
		"webhooks": func(n *yaml.Node, p string) {
			d.list(n, p, "{name, url, secret_env}", func(item *yaml.Node, ip string) {
				w := rawWebhook{path: ip}
				d.mapping(item, ip, handlers{
					"name":       func(n *yaml.Node, p string) { w.name = d.str(n, p) },
					"url":        func(n *yaml.Node, p string) { w.url = d.str(n, p) },
					"secret_env": func(n *yaml.Node, p string) { w.secretEnv = d.str(n, p) },
					"keys":       func(n *yaml.Node, p string) { w.keys = d.strings(n, p) },
				})
				a.webhooks = append(a.webhooks, w)
			})
		},
	})
}

func (d *decoder) mcp(n *yaml.Node, path string, m *rawMCP) {
	d.mapping(n, path, handlers{
		"prefix": func(n *yaml.Node, p string) { m.prefix = d.bool(n, p) },
		"upstreams": func(n *yaml.Node, p string) {
			d.list(n, p, "{name, command or url}", func(item *yaml.Node, ip string) {
				u := rawUpstream{path: ip}
				d.mapping(item, ip, handlers{
					"name":        func(n *yaml.Node, p string) { u.name = d.str(n, p) },
					"command":     func(n *yaml.Node, p string) { u.command = d.argv(n, p) },
					"env":         func(n *yaml.Node, p string) { u.env = d.stringMap(n, p) },
					"url":         func(n *yaml.Node, p string) { u.url = d.str(n, p) },
					"headers_env": func(n *yaml.Node, p string) { u.headersEnv = d.stringMap(n, p) },
				})
				m.upstreams = append(m.upstreams, u)
			})
		},
	})
}

func (d *decoder) agent(n *yaml.Node, path string, a *rawAgent) {
	d.mapping(n, path, handlers{
		"system_prompt":     func(n *yaml.Node, p string) { a.systemPrompt = d.str(n, p) },
		"max_steps":         func(n *yaml.Node, p string) { a.maxSteps = d.int(n, p) },
		"stop_on_rejection": func(n *yaml.Node, p string) { a.stopOnRejection = d.bool(n, p) },
		"templates": func(n *yaml.Node, p string) {
			a.templates = map[string]string{}
			h := handlers{}
			for _, k := range []string{"rejected", "edited", "expired", "unknown", "responded"} {
				h[k] = func(n *yaml.Node, p string) {
					if s := d.str(n, p); s != nil {
						a.templates[k] = *s
					}
				}
			}
			d.mapping(n, p, h)
		},
	})
}

// rules returns the handlers for the keys shared by defaults and tools.
// review accepts a mode ("always") or a mapping {mode, when}; when is
// only allowed on a tool (t != nil).
func (d *decoder) rules(r *rawRules, t *rawTool) handlers {
	return handlers{
		"risk": func(n *yaml.Node, p string) { r.risk = d.str(n, p) },
		"review": func(n *yaml.Node, p string) {
			if n.Kind == yaml.ScalarNode {
				r.review = d.str(n, p)
				return
			}
			h := handlers{"mode": func(n *yaml.Node, p string) { r.review = d.str(n, p) }}
			if t != nil {
				h["when"] = func(n *yaml.Node, p string) { d.when(n, p, t) }
				h["reason"] = func(n *yaml.Node, p string) { t.whenReason = d.str(n, p) }
			} else {
				h["when"] = func(n *yaml.Node, p string) { d.errorf(n, p, "a when rule belongs on a tool, not in defaults") }
				h["reason"] = func(n *yaml.Node, p string) {
					d.errorf(n, p, "a when rule (and its reason) belongs on a tool, not in defaults")
				}
			}
			d.mapping(n, p, h)
		},
		"decisions":           func(n *yaml.Node, p string) { r.decisions = d.strings(n, p) },
		"timeout":             func(n *yaml.Node, p string) { r.timeout = d.duration(n, p) },
		"quorum":              func(n *yaml.Node, p string) { r.quorum = d.int(n, p) },
		"approvers":           func(n *yaml.Node, p string) { r.approvers = d.approvers(n, p) },
		"remind_after":        func(n *yaml.Node, p string) { r.remindAfter = d.duration(n, p) },
		"escalate_after":      func(n *yaml.Node, p string) { r.escalateAfter = d.duration(n, p) },
		"escalate_to":         func(n *yaml.Node, p string) { r.escalateTo = d.approvers(n, p) },
		"allow_self_approval": func(n *yaml.Node, p string) { r.allowSelf = d.bool(n, p) },
		"remember":            func(n *yaml.Node, p string) { r.remember = d.duration(n, p) },
		"preauthorize":        func(n *yaml.Node, p string) { d.preauthorize(n, p, r) },
		"widen_on_escalation": func(n *yaml.Node, p string) { r.widen = d.bool(n, p) },
		"cancel_window":       func(n *yaml.Node, p string) { r.cancelWindow = d.duration(n, p) },
		"sample":              func(n *yaml.Node, p string) { r.sample = d.float(n, p) },
		"step_up":             func(n *yaml.Node, p string) { r.stepUp = d.stepUp(n, p, t) },
	}
}

func (d *decoder) when(n *yaml.Node, p string, t *rawTool) {
	if t.when != nil {
		d.errorf(n, p, "when is already set at %s; set it in one place", t.whenPath)
		return
	}
	t.when, t.whenPath = d.str(n, p), p
}

func (d *decoder) approvers(n *yaml.Node, path string) *approval.Approvers {
	a := &approval.Approvers{}
	before, badIDs := len(d.errs), d.badIDs
	d.mapping(n, path, handlers{
		"users":      func(n *yaml.Node, p string) { a.Users = d.slackIDs(n, p, SlackUser) },
		"usergroups": func(n *yaml.Node, p string) { a.Usergroups = d.slackIDs(n, p, SlackUsergroup) },
		"channel_members": func(n *yaml.Node, p string) {
			if b := d.bool(n, p); b != nil {
				a.ChannelMembers = *b
			}
		},
	})
	if len(d.errs)-before > d.badIDs-badIDs {
		return nil // reported; don't pile "names no one" on top
	}
	return a
}

func (d *decoder) tool(n *yaml.Node, t *rawTool) {
	h := d.rules(&t.rules, t)
	h["name"] = func(n *yaml.Node, p string) { t.name = d.str(n, p) }
	h["description"] = func(n *yaml.Node, p string) { t.description = d.str(n, p) }
	h["capabilities"] = func(n *yaml.Node, p string) { t.capabilities = d.strings(n, p) }
	h["when"] = func(n *yaml.Node, p string) { d.when(n, p, t) }
	h["stop_on_rejection"] = func(n *yaml.Node, p string) { t.stopOnRejection = d.bool(n, p) }
	h["confirm"] = func(n *yaml.Node, p string) { t.confirm = d.bool(n, p) }
	h["formats"] = func(n *yaml.Node, p string) {
		if n.Kind != yaml.MappingNode {
			d.errorf(n, p, "must be a mapping of argument name to format, e.g. {amount: {currency: USD}}")
			return
		}
		t.formats = map[string]approval.ValueFormat{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			name := n.Content[i].Value
			t.formats[name] = d.format(n.Content[i+1], p+"."+name)
		}
	}
	h["secret"] = func(n *yaml.Node, p string) { t.secret = d.strings(n, p) }
	h["schema"] = func(n *yaml.Node, p string) {
		b, err := nodeJSON(n)
		if err != nil {
			d.errorf(n, p, "cannot be written as JSON: %v", err)
			return
		}
		t.schema = b
	}
	h["quorum_when"] = func(n *yaml.Node, p string) {
		d.list(n, p, "{when, quorum, reason}", func(item *yaml.Node, ip string) {
			q := rawQuorumRule{path: ip}
			d.mapping(item, ip, handlers{
				"when":   func(n *yaml.Node, p string) { q.when = d.str(n, p) },
				"quorum": func(n *yaml.Node, p string) { q.quorum = d.int(n, p) },
				"reason": func(n *yaml.Node, p string) { q.reason = d.str(n, p) },
			})
			t.quorumWhen = append(t.quorumWhen, q)
		})
	}
	h["deny"] = func(n *yaml.Node, p string) {
		d.list(n, p, "{when, reason}", func(item *yaml.Node, ip string) {
			r := rawDenyRule{path: ip}
			d.mapping(item, ip, handlers{
				"when":   func(n *yaml.Node, p string) { r.when = d.str(n, p) },
				"reason": func(n *yaml.Node, p string) { r.reason = d.str(n, p) },
			})
			t.deny = append(t.deny, r)
		})
	}
	h["http"] = func(n *yaml.Node, p string) {
		t.http = &rawHTTP{}
		d.mapping(n, p, handlers{
			"method":             func(n *yaml.Node, p string) { t.http.method = d.str(n, p) },
			"url":                func(n *yaml.Node, p string) { t.http.url = d.str(n, p) },
			"headers":            func(n *yaml.Node, p string) { t.http.headers = d.stringMap(n, p) },
			"body":               func(n *yaml.Node, p string) { t.http.body = d.str(n, p) },
			"timeout":            func(n *yaml.Node, p string) { t.http.timeout = d.duration(n, p) },
			"max_response_bytes": func(n *yaml.Node, p string) { t.http.maxResponseSize = d.int(n, p) },
		})
	}
	h["preview"] = func(n *yaml.Node, p string) {
		t.preview = &rawPreview{}
		d.mapping(n, p, handlers{
			"label":   func(n *yaml.Node, p string) { t.preview.label = d.str(n, p) },
			"url":     func(n *yaml.Node, p string) { t.preview.url = d.str(n, p) },
			"headers": func(n *yaml.Node, p string) { t.preview.headers = d.stringMap(n, p) },
			"timeout": func(n *yaml.Node, p string) { t.preview.timeout = d.duration(n, p) },
			"summary": func(n *yaml.Node, p string) { t.preview.summary = d.str(n, p) },
			"fields": func(n *yaml.Node, p string) {
				d.list(n, p, "{label, path, format}", func(item *yaml.Node, fp string) {
					var f PreviewField
					d.mapping(item, fp, handlers{
						"label":  func(n *yaml.Node, p string) { f.Label = deref(d.str(n, p)) },
						"path":   func(n *yaml.Node, p string) { f.Path = deref(d.str(n, p)) },
						"format": func(n *yaml.Node, p string) { f.Format = d.format(n, p) },
					})
					t.preview.fields = append(t.preview.fields, f)
				})
			},
		})
	}
	t.invalid = !d.mapping(n, t.path, h)
}

// list calls each for every item of a YAML sequence with the item's key
// path (marked seen); anything else is reported as "must be a list of
// <what>".
func (d *decoder) list(n *yaml.Node, p, what string, each func(item *yaml.Node, path string)) {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, p, "must be a list of %s, got %s", what, describe(n))
		return
	}
	for i, item := range n.Content {
		ip := index(p, i)
		d.seen(item, ip)
		each(item, ip)
	}
}

// format reads a value format: date, percent or bytes, or a mapping
// {currency: USD, minor_units: true}.
func (d *decoder) format(n *yaml.Node, path string) approval.ValueFormat {
	var f approval.ValueFormat
	if n.Kind == yaml.ScalarNode {
		f.Kind = n.Value
	} else {
		d.mapping(n, path, handlers{
			"currency": func(n *yaml.Node, p string) {
				f.Kind = approval.FormatCurrency
				f.Currency = deref(d.str(n, p))
			},
			"minor_units": func(n *yaml.Node, p string) { f.MinorUnits = deref(d.bool(n, p)) },
		})
	}
	if err := f.Check(); err != nil {
		d.errorf(n, path, "%v", err)
	}
	return f
}

// preauthorize reads a duration (1h), or a duration with limits:
// {for: 24h, uses: 3, total: {argument: amount, max: 100}}.
func (d *decoder) preauthorize(n *yaml.Node, path string, r *rawRules) {
	switch n.Kind {
	case yaml.ScalarNode:
		r.preauthorize = d.duration(n, path)
		return
	case yaml.MappingNode:
	default:
		d.errorf(n, path, "must be a duration (e.g. 1h) or {for, uses, total}")
		return
	}
	lim := &approval.GrantLimits{}
	d.mapping(n, path, handlers{
		"for": func(n *yaml.Node, p string) { r.preauthorize = d.duration(n, p) },
		"uses": func(n *yaml.Node, p string) {
			if v := d.int(n, p); v != nil {
				if *v < 1 {
					d.errorf(n, p, "must be at least 1, got %d", *v)
				}
				lim.MaxUses = *v
			}
		},
		"total": func(n *yaml.Node, p string) {
			d.mapping(n, p, handlers{
				"argument": func(n *yaml.Node, p string) { lim.Argument = deref(d.str(n, p)) },
				"max": func(n *yaml.Node, p string) {
					var f float64
					if err := n.Decode(&f); err != nil || f <= 0 {
						d.errorf(n, p, "must be a number above 0, got %q", n.Value)
						return
					}
					lim.MaxTotal = f
				},
			})
			if lim.Argument == "" || lim.MaxTotal <= 0 {
				d.errorf(n, p, "needs argument (a numeric argument's name) and max (above 0)")
			}
		},
	})
	if r.preauthorize == nil && !d.present(path+".for") {
		d.errorf(n, path+".for", "required: how long the pre-authorisation lasts, e.g. 24h")
	}
	r.preauthLimits, r.preauthPath = lim, path
}
