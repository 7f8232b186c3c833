// Package policyfile reads and validates Countersign's versioned policy and
// tools YAML file. Errors name the offending key path, e.g.
// "tools[2].review.when: 1:1: undeclared reference to 'arg' (line 14)".
package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/countersign/countersign/approval"
)

// File is a parsed, validated policy file.
type File struct {
	Version int
	Slack   Slack
	Agent   Agent
	// Policy is what the gate applies (defaults already merged per tool).
	Policy approval.Policy
	// Tools are the tool declarations, in file order.
	Tools []Tool
	// API holds the HTTP API's keys and webhooks (the api key).
	API API
	// MCP holds the MCP gateway's upstream servers (the mcp key).
	MCP MCP

	// schemas are the compiled argument schemas by tool name (set by Parse).
	schemas map[string]*Schema
}

// StepUpTools names the tools whose votes may need a step-up
// confirmation (step_up set; "external" for outside callers' tools),
// sorted.
func (f *File) StepUpTools() []string {
	var tools []string
	for name, tp := range f.Policy.Tools {
		if tp.StepUp != nil {
			tools = append(tools, name)
		}
	}
	if f.Policy.External != nil && f.Policy.External.StepUp != nil {
		tools = append(tools, "external")
	}
	slices.Sort(tools)
	return tools
}

// Tool returns the declaration of the named tool.
func (f *File) Tool(name string) (Tool, bool) {
	for _, t := range f.Tools {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

// HasPreview reports whether the named tool is declared with a preview
// source (preview:).
func (f *File) HasPreview(name string) bool {
	t, ok := f.Tool(name)
	return ok && t.Preview != nil
}

// Schema returns the compiled argument schema of the named tool, nil when
// the tool is unknown or its schema does not compile. A File built by
// Parse has every schema compiled already; for one built by hand the
// schema is compiled on each call.
func (f *File) Schema(tool string) *Schema {
	if sch, ok := f.schemas[tool]; ok {
		return sch
	}
	t, ok := f.Tool(tool)
	if !ok {
		return nil
	}
	raw := t.Schema
	if len(raw) == 0 {
		raw = json.RawMessage(defaultSchema)
	}
	sch, err := CompileSchema(t.Name, raw)
	if err != nil {
		return nil
	}
	return sch
}

// ValidateArgs checks call arguments (proposed by the model or edited by
// an approver) against the tool's schema. It returns an error wrapping
// approval.ErrUnknownTool or approval.ErrInvalidArgs, with the schema's
// complaint in plain words.
func (f *File) ValidateArgs(tool string, args json.RawMessage) error {
	sch := f.Schema(tool)
	if sch == nil {
		return fmt.Errorf("validate %q arguments: %w", tool, approval.ErrUnknownTool)
	}
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	if err := sch.Validate(args); err != nil {
		return invalidArgs(tool, err)
	}
	return nil
}

// ValidateCall checks call arguments against the tool's schema: the
// file's for a tool it declares (ValidateArgs), else inputSchema, the
// schema its caller supplied (an MCP tool's inputSchema), when given. A
// tool it does not declare and without a schema passes. It implements
// approval.Schemas.
func (f *File) ValidateCall(tool string, inputSchema, args json.RawMessage) error {
	if _, ok := f.Tool(tool); ok {
		return f.ValidateArgs(tool, args)
	}
	if len(bytes.TrimSpace(inputSchema)) == 0 {
		return nil
	}
	sch, err := CompileSchema(tool, inputSchema)
	if err != nil {
		return fmt.Errorf("validate %s arguments: %w: %w: the tool's input schema is not usable: %v", tool, approval.ErrInvalidArgs, approval.ErrInvalidSchema, err)
	}
	if len(bytes.TrimSpace(args)) == 0 {
		args = json.RawMessage("{}")
	}
	if err := sch.Validate(args); err != nil {
		return invalidArgs(tool, err)
	}
	return nil
}

var _ approval.Schemas = (*File)(nil)

// MayAsk reports whether the API key c names (approval.Caller.Name) may
// ask for tool under this file: the key is still in api.keys and lists
// the tool, or "*". It implements approval.Scopes, which every claim asks
// again: a key narrowed or removed since a request was made no longer
// has it run.
func (f *File) MayAsk(c approval.Caller, tool string) bool {
	for _, k := range f.API.Keys {
		if k.Name == c.Name {
			return slices.Contains(k.Tools, "*") || slices.Contains(k.Tools, tool)
		}
	}
	return false
}

var _ approval.Scopes = (*File)(nil)

// invalidArgs wraps a schema's complaint about tool's arguments: it reads
// as one line (ArgsError.Summary), wraps approval.ErrInvalidArgs, and
// keeps the *ArgsError reachable with errors.As, so a form can put each
// violation on its field.
func invalidArgs(tool string, err error) error {
	ae, ok := errors.AsType[*ArgsError](err)
	if !ok {
		return fmt.Errorf("validate %s arguments: %w: %v", tool, approval.ErrInvalidArgs, err)
	}
	return &argsInvalid{msg: fmt.Sprintf("validate %s arguments: %v: %s", tool, approval.ErrInvalidArgs, ae.Summary()), args: ae}
}

// argsInvalid is the error of invalidArgs for a schema mismatch.
type argsInvalid struct {
	msg  string
	args *ArgsError
}

func (e *argsInvalid) Error() string   { return e.msg }
func (e *argsInvalid) Unwrap() []error { return []error{approval.ErrInvalidArgs, e.args} }

// API holds the settings of the HTTP API (docs/api.md).
type API struct {
	// Keys are the API keys; without any the API refuses every call.
	Keys []APIKey
	// Webhooks are told of every final decision on an API request.
	Webhooks []Webhook
	// ClaimWindow is how long an approved request of an outside caller
	// (an API key, the MCP gateway, a HumanLayer SDK) waits to be claimed
	// before it ends abandoned: the caller had gone (api.claim_window,
	// default approval.DefaultClaimWindow).
	ClaimWindow time.Duration
}

// APIKey is one API key. The key itself is never in the file: only its
// hex SHA-256.
type APIKey struct {
	// Name names the key on cards, in the audit and in logs.
	Name string
	// SHA256 is the lowercase hex SHA-256 of the key.
	SHA256 string
	// Tools the key may ask for: names of declared tools, names the
	// external rule covers, or "*" for any tool the policy admits.
	Tools []string
	// SlackUser is the Slack user the key acts for, if any: the requester
	// of its requests, who may then not approve them (four-eyes).
	SlackUser string
	// Callers map the identities a gateway checking calls with this key
	// asserts (Envoy ext_authz: a JWT's email or sub, a header the
	// gateway sets) to the Slack users they are: the requester of such a
	// call, named on its card and refused as its approver (four-eyes).
	// When set, every call of the key must name one of them (a call that
	// names none, or another, is refused); when empty, a call naming a
	// caller is refused (nothing says who it is).
	Callers map[string]string
	// RatePerMinute bounds the key's calls per process, default
	// DefaultAPIRatePerMinute.
	RatePerMinute int
}

// MCP holds the settings of the MCP gateway (docs/mcp.md).
type MCP struct {
	// Prefix names each upstream tool <upstream>__<tool> (default true).
	Prefix bool
	// Upstreams are the MCP servers the gateway proxies, in file order.
	Upstreams []Upstream
}

// Upstream is one MCP server the gateway proxies: a stdio Command or a
// streamable HTTP URL.
type Upstream struct {
	Name string
	// Command is the program and its arguments of a stdio server, in
	// order, repeats kept (a wrapper names its own program and then the
	// server's: [node, tap.mjs, --, node, server.js]).
	Command []string
	// Env is set for Command; ${VAR} in a value is read from the gateway's
	// environment (keep secrets out of the file).
	Env map[string]string
	// URL is a streamable HTTP server's endpoint.
	URL string
	// HeadersEnv maps a header sent to URL to the environment variable
	// holding its value (e.g. Authorization: DOCS_TOKEN).
	HeadersEnv map[string]string
}

// Webhook is one endpoint told of final decisions, signed with the secret
// read from the environment variable SecretEnv.
type Webhook struct {
	Name      string
	URL       string
	SecretEnv string
	// Keys, when not empty, names the API keys (api.keys[].name) whose
	// requests the endpoint is told of; empty, every key's.
	Keys []string
}

// Slack holds workspace settings.
type Slack struct {
	// ApprovalsChannel is the channel id where cards are posted (required).
	ApprovalsChannel string
	// TaskChannels, when non-empty, is the allow-list of channels where
	// mentions start runs (DMs are always allowed).
	TaskChannels []string
	// AllowedTeams, on an Enterprise Grid (org-wide) install, lists the
	// workspaces of the enterprise whose members may use Countersign; empty
	// allows every workspace of the installation's enterprise. Without
	// Grid only the installation's own team is ever accepted.
	AllowedTeams []string
}

// Agent holds agent loop settings.
type Agent struct {
	SystemPrompt    string
	MaxSteps        int // default 8
	StopOnRejection bool
	Templates       Templates
}

// Templates are the messages fed back to the model (text/template syntax,
// fields: .Tool .Approver .Reason .Response .Changes .Args).
type Templates struct {
	Rejected string
	Edited   string
	Expired  string
	Unknown  string
	// Responded tells the model an approver answered in place of the tool.
	Responded string
}

// Tool is one tool declaration.
type Tool struct {
	Name        string
	Description string
	// Schema is the JSON Schema of the arguments (an object schema).
	Schema  json.RawMessage
	HTTP    *HTTPSpec
	Preview *PreviewSpec
}

// HTTPSpec declares an HTTP tool. URL, header values and Body are
// text/template strings over .Args, .RequestID and env "NAME" (secrets,
// never logged or audited).
type HTTPSpec struct {
	Method       string
	URL          string
	Headers      map[string]string
	Body         string
	Timeout      time.Duration
	MaxBodyBytes int64
}

// PreviewSpec declares a system-of-record lookup for the card: an HTTP GET
// whose JSON response fills labelled fields.
type PreviewSpec struct {
	// Label names the system of record for people ("Order system"): the
	// card says its facts come from it. Empty: "the system of record".
	// Never the URL, whose address and path mean nothing to an approver.
	Label   string
	URL     string
	Headers map[string]string
	Timeout time.Duration
	Summary string // text/template over .Args and .Data
	// Fields map a label to a dotted path into the response JSON, e.g.
	// {"Customer": "customer.name"}, in file order.
	Fields []PreviewField
}

// PreviewField is one labelled value taken from the preview response.
type PreviewField struct {
	Label string
	Path  string
	// Format says how the value reads (money with its unit, a date, …).
	Format approval.ValueFormat
}
