// Package extauthz is Countersign behind a gateway that delegates its
// decision: Envoy's external authorization (ext_authz), over gRPC
// (envoy.service.auth.v3.Authorization/Check) and over HTTP (Envoy's
// http_service). The gateway forwards an MCP request's JSON-RPC body; a
// tools/call, resources/read or prompts/get becomes a request of the /v1
// API (the same door as every surface: keys, rate limits, the policy and
// the audit are the API's), named as the MCP gateway names it and asked
// on behalf of the caller the gateway vouches for (a JWT's claim, or a
// header it sets), whom the key's callers in the policy name. The check
// is held while a person decides, and an approved call is claimed before
// it is let through, so a retried or duplicated check never lets it
// through twice. Everything else (initialize, tools/list, notifications,
// responses) passes.
//
// ext_authz cannot change the body it checks, so an approver's edit cannot
// be applied: its requests offer no edit (approval.GatewayExtAuthz), and a
// call approved with other arguments all the same is denied, saying so.
// The gateway never tells the service what came of the call: the claim is
// reported as handed to the upstream, its answer unseen.
//
// Begin and Gating.Await are the core every gateway protocol shares (ask,
// hold, claim); ext_authz's gRPC Check and HTTP handler are front ends of
// it (decide, then answer), and agentgateway's ExtMcp processor (package
// extmcp, below this one) another, served on the same gRPC server
// (ServeGRPC).
//
// It is, with its subpackages, the one home of go-control-plane and gRPC
// (docs/architecture.md).
package extauthz

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval"
)

// API is what the service needs of Countersign's /v1 API, for one key
// (*client.Client).
type API interface {
	// Request asks for approval of a call; an auto-approved or refused
	// call is answered at once. A refusal is a *client.Error.
	Request(ctx context.Context, c client.Call) (*client.Request, error)
	// Get returns the request once final or when wait passes (long poll).
	Get(ctx context.Context, id string, wait time.Duration) (*client.Request, error)
	// Claim claims an approved request: exactly one claim wins; every
	// other is a *client.Error (already_claimed, needs_approvals,
	// refused, abandoned, not_approved).
	Claim(ctx context.Context, id string) (*client.Claimed, error)
	// Result reports what came of the request claimed with token.
	Result(ctx context.Context, id, token string, status client.Status, output string) (*client.Request, error)
}

var _ API = (*client.Client)(nil)

// Waiter waits for a request to be decided (store.Store.Wait).
type Waiter interface {
	// Wait returns once request id is final (and its wake-up sent), or
	// with ctx's error when ctx ends first; another error says the wait
	// failed.
	Wait(ctx context.Context, id string) (*approval.Request, error)
}

// Options configure a Service.
type Options struct {
	// API returns a client of the /v1 API calling with key (the checked
	// request's bearer key). Required.
	API func(key string) API
	// Waiter, when set, is the store's waiter for a request's decision
	// (store.Store): a held check blocks on it directly, in the gRPC or
	// HTTP handler's own goroutine, holding nothing else, and reads the
	// request through the API once it is decided. Nil: the check waits by
	// the API's long poll (Get with PollWait), which holds an in-process
	// HTTP exchange per check (see BenchmarkExtAuthzHeld).
	Waiter Waiter
	// MaxBody is the largest body checked, default DefaultMaxBody; a
	// larger one is denied (413).
	MaxBody int
	// PollWait is how long one long poll of a pending request lasts,
	// default 25 s; the check is held across polls until it is decided or
	// the gateway's deadline passes.
	PollWait time.Duration
	// PrefixTools names a tool <server>__<tool> when the route names its
	// MCP server, as the MCP gateway does with the policy's mcp.prefix,
	// so one policy rule covers a tool whichever way its call comes.
	PrefixTools bool
	// MaxHold bounds how long one HTTP check is held (the gateway's own
	// timeout should end it first), default 15 min; the gRPC check is
	// bounded by its caller's deadline.
	MaxHold time.Duration
	// Logger logs one line per check that did not pass for a system
	// reason. Default: discard.
	Logger *slog.Logger
}

// DefaultMaxBody is Options.MaxBody's default: 1 MiB, as the API's.
const DefaultMaxBody = 1 << 20

// Service answers checks. It is safe for concurrent use.
type Service struct {
	opts Options
	// closed ends every held check (Close); stop cancels it.
	closed context.Context
	stop   context.CancelFunc
}

// New returns a Service.
func New(o Options) (*Service, error) {
	if o.API == nil {
		return nil, errors.New("extauthz: Options.API is required")
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.PollWait <= 0 {
		o.PollWait = 25 * time.Second
	}
	if o.MaxHold <= 0 {
		o.MaxHold = 15 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	closed, stop := context.WithCancel(context.Background())
	return &Service{opts: o, closed: closed, stop: stop}, nil
}

// Close ends every held check, denied (the call does not run; its
// request stays to be decided, and a later check of the same call finds
// it), and every later one. Call it before stopping the servers that
// serve s, so that they need not wait for a person.
func (s *Service) Close() { s.stop() }

// Check is one checked HTTP request, whichever protocol brought it.
type Check struct {
	// Headers are the request's headers, names lower-cased.
	Headers map[string]string
	// Body is the forwarded body; Partial when the gateway cut it at its
	// max_request_bytes; Size the request's whole size when known (-1 not).
	Body    []byte
	Partial bool
	Size    int64
	// Caller is the identity of the caller the gateway vouches for (a
	// JWT's email or sub from the gateway's JWT filter, or the caller
	// header it sets), "" when it names none; CallerBad says why what it
	// sent is not usable as one (then the call is denied).
	Caller, CallerBad string
	// Route is the gateway's route and Server the MCP server behind it, as
	// the gateway's configuration names them ("" when it does not): the
	// card shows both, and a read or a prompt is named by its server.
	Route, Server string
}

// Headers the gateway sets on the checked request for the HTTP variant
// (Envoy: http_service.authorization_request.headers_to_add, which
// replaces a client's own), and HeaderCaller for both.
const (
	// HeaderCaller is the caller's identity as the gateway vouches for it
	// (Envoy's jwt_authn claim_to_headers, Istio's outputClaimToHeaders).
	HeaderCaller = "x-countersign-caller"
	// HeaderRoute names the route (the gRPC check reads context_extensions
	// route instead).
	HeaderRoute = "x-countersign-route"
	// HeaderServer names the MCP server (gRPC: context_extensions
	// mcp_server).
	HeaderServer = "x-countersign-mcp-server"
)

// maxIdentity bounds a caller's identity, as the policy's
// (policyfile.MaxCallerIdentity).
const maxIdentity = 256

// badIdentity says why id cannot name a caller, "" when it can (or is
// empty: the API decides whether the key needs one).
func badIdentity(id string) string {
	switch {
	case len(id) > maxIdentity:
		return fmt.Sprintf("it is longer than %d bytes", maxIdentity)
	case !utf8.ValidString(id):
		return "it is not UTF-8"
	case strings.TrimSpace(id) != id:
		return "it has leading or trailing spaces"
	case strings.ContainsFunc(id, unicode.IsControl):
		return "it has control characters"
	}
	return ""
}

// Verdict is the answer to a check: Allow, or the HTTP Status and Body the
// gateway returns to the client instead. Headers are added to the request
// (allowed) or to the denial.
type Verdict struct {
	Allow   bool
	Status  int
	Headers map[string]string
	Body    []byte
	// RequestID is the Countersign request, when one was made.
	RequestID string
}

// HeaderRequestID carries the Countersign request id: on the request let
// through to the upstream, and on a denial.
const HeaderRequestID = "x-countersign-request-id"

// MaxBody is the largest body (or params) a check reads; a larger one is
// refused.
func (s *Service) MaxBody() int { return s.opts.MaxBody }

// answer is the verdict of a check decide began: h's (awaited by the
// caller, in its own frame: the handler's, whose stack is then shallow
// while a person decides), else v. A denial is logged, one line, by the
// gateway's request id trace (and ours, when a request was made); a
// system failure was logged as an error.
func (s *Service) answer(ctx context.Context, v Verdict, h *heldCheck, trace string) Verdict {
	if h != nil {
		v = h.verdict(ctx)
	}
	if !v.Allow {
		s.opts.Logger.Info("ext_authz check denied", "x_request_id", trace, "request_id", v.RequestID, "status", v.Status)
	}
	return v
}

// decide begins answering the check c: its verdict when it is decided at
// once (refused, or no call in it), else the held check of its call, which
// the protocol's handler awaits in its own frame (heldCheck.await) before
// answer. The check's answer comes when the call may pass, is refused, or
// ctx ends (the gateway gave up: the answer is a denial nobody reads, and
// the request stays to be decided, and is never claimed here).
func (s *Service) decide(ctx context.Context, c Check) (Verdict, *heldCheck) {
	if len(c.Body) > s.opts.MaxBody || c.Size > int64(s.opts.MaxBody) {
		return deny(http.StatusRequestEntityTooLarge, nil, "", fmt.Sprintf("Countersign refused the request: its body is over %d bytes, the most it checks. It did not run.", s.opts.MaxBody)), nil
	}
	body := bytes.TrimSpace(c.Body)
	if len(body) == 0 {
		return Verdict{Allow: true}, nil // a GET (the SSE stream), a DELETE (session end): no call in it
	}
	if c.Partial {
		return deny(http.StatusRequestEntityTooLarge, nil, "", "Countersign refused the request: the gateway forwarded only part of its body (allow_partial_message), so the call cannot be checked. It did not run."), nil
	}
	if body[0] == '[' {
		// A batch (MCP 2025-03-26): anything but a gated method passes; a
		// gated call in a batch is not gated one by one here.
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil {
			return deny(http.StatusBadRequest, nil, "", "Countersign refused the request: its body is not valid JSON-RPC ("+err.Error()+"). It did not run."), nil
		}
		for _, raw := range raws {
			m, err := readRPC(raw)
			if err != nil {
				return deny(http.StatusBadRequest, nil, "", "Countersign refused the request: its body is not valid JSON-RPC ("+err.Error()+"). It did not run."), nil
			}
			if gated(m.Method) {
				return deny(http.StatusBadRequest, m.ID, "", "Countersign refused the request: a "+m.Method+" inside a JSON-RPC batch is not checked; send it on its own. It did not run."), nil
			}
		}
		return Verdict{Allow: true}, nil
	}
	m, err := readRPC(body)
	if err != nil {
		return deny(http.StatusBadRequest, nil, "", "Countersign refused the request: its body is not valid JSON-RPC ("+err.Error()+"). It did not run."), nil
	}
	var call client.Call
	switch m.Method {
	case "tools/call":
		call, err = s.toolCall(c, m)
	case "resources/read":
		call, err = readResource(c, m)
	case "prompts/get":
		call, err = getPrompt(c, m)
	default:
		return Verdict{Allow: true}, nil
	}
	if err != nil {
		var r refusal
		if errors.As(err, &r) {
			return deny(r.status, m.ID, "", r.text), nil
		}
		return deny(http.StatusBadRequest, m.ID, "", "Countersign refused the call: its params are not valid ("+err.Error()+"). It did not run."), nil
	}
	return Verdict{}, s.gateCheck(ctx, c, m, call)
}

// gated reports whether method is one a check gates.
func gated(method string) bool {
	return method == "tools/call" || method == "resources/read" || method == "prompts/get"
}

// refusal is a request refused before it is asked for: the HTTP status
// and the text of the denial.
type refusal struct {
	status int
	text   string
}

func (r refusal) Error() string { return r.text }

// toolCall reads a tools/call as the call asked for: the tool's name
// prefixed by the MCP server's when the route names one and the policy
// prefixes tools (as the MCP gateway names it), its arguments compact.
func (s *Service) toolCall(c Check, m rpc) (client.Call, error) {
	p, err := ReadCall(m.Params)
	if err != nil {
		return client.Call{}, err
	}
	if p.Name == "" {
		return client.Call{}, refusal{http.StatusBadRequest, "Countersign refused the call: tools/call needs params.name. It did not run."}
	}
	args, err := Arguments(p.Arguments)
	if err != nil {
		return client.Call{}, refusal{http.StatusBadRequest, "Countersign refused the call to " + p.Name + ": " + err.Error() + ". It did not run."}
	}
	tool := p.Name
	if c.Server != "" && s.opts.PrefixTools {
		tool = c.Server + mcp.Separator + p.Name
	}
	return client.Call{Tool: tool, Arguments: args, Reason: p.Reason, Upstream: c.Server}, nil
}

// readResource reads a resources/read as the MCP gateway asks for it
// (mcp.ReadCall: the pseudo-tool <server>__resources_read), so one policy
// rule covers a read whichever way it comes. The pseudo-tool is named by
// the MCP server, which the route must name (Check.Server).
func readResource(c Check, m rpc) (client.Call, error) {
	uri, err := ReadResource(m.Params)
	switch {
	case err != nil:
		return client.Call{}, err
	case uri == "":
		return client.Call{}, refusal{http.StatusBadRequest, "Countersign refused the request: resources/read needs params.uri. Nothing was read."}
	case c.Server == "":
		return client.Call{}, refusal{http.StatusForbidden, "Countersign refused to read " + uri + ": the gateway's route does not name its MCP server (context_extensions mcp_server), which names the read in the policy. Nothing was read."}
	}
	return mcp.ReadCall(c.Server, uri), nil
}

// getPrompt reads a prompts/get as the MCP gateway asks for it
// (mcp.PromptCall: the pseudo-tool <server>__prompts_get).
func getPrompt(c Check, m rpc) (client.Call, error) {
	name, args, err := ReadPrompt(m.Params)
	if err != nil {
		return client.Call{}, err
	}
	switch {
	case name == "":
		return client.Call{}, refusal{http.StatusBadRequest, "Countersign refused the request: prompts/get needs params.name. Nothing was read."}
	case c.Server == "":
		return client.Call{}, refusal{http.StatusForbidden, "Countersign refused to get the prompt " + name + ": the gateway's route does not name its MCP server (context_extensions mcp_server), which names the prompt in the policy. Nothing was read."}
	}
	return mcp.PromptCall(c.Server, name, args), nil
}

// gateCheck gates call (read from m) as Begin does, with the caller's
// key, as the caller the gateway vouches for, through ext_authz: a
// gateway that cannot apply an edit, so none is offered
// (approval.GatewayExtAuthz). It returns once asked: the check's handler
// awaits it (heldCheck.await) in its own frame.
func (s *Service) gateCheck(ctx context.Context, c Check, m rpc, call client.Call) *heldCheck {
	key := Bearer(c.Headers["authorization"])
	session := c.Headers["mcp-session-id"]
	call.RunID = session
	call.CallID = CallID("extauthz-", []byte(session), m.ID, []byte(call.Tool), call.Arguments, []byte(c.Caller))
	call.Gateway, call.Route, call.OnBehalfOf = approval.GatewayExtAuthz, c.Route, c.Caller
	return &heldCheck{g: s.begin(ctx, Call{Call: call, Key: key, CallerBad: c.CallerBad, Trace: c.Headers["x-request-id"]}), key: key, id: m.ID}
}

// heldCheck is a check whose call Begin began (gateCheck): awaited in
// the frame of the protocol's handler (one goroutine, and a stack as
// shallow as the handler's, while a person decides: see
// BenchmarkExtAuthzHeld), then turned into the gateway's answer.
type heldCheck struct {
	g   *gating
	key string          // the caller's API key
	id  json.RawMessage // the JSON-RPC id the denial answers
}

// await waits until the call is let through or refused.
func (h *heldCheck) await() {
	for !h.g.done {
		h.g.await()
	}
}

// verdict is the gateway's answer once h was awaited.
func (h *heldCheck) verdict(ctx context.Context) Verdict {
	g := h.g.out
	if !g.Pass {
		v := deny(g.Status, h.id, g.RequestID, g.Text)
		if g.RetryAfter > 0 {
			v.Headers["retry-after"] = fmt.Sprint(int(g.RetryAfter.Seconds()))
		}
		return v
	}
	if g.RequestID == "" {
		return Verdict{Allow: true} // let through by the policy: no request, nothing to claim
	}
	// The upstream's answer is never seen here: report the call as handed
	// on, so the request does not wait for a result.
	h.g.s.Report(ctx, h.key, g, client.Executed, "let through by the gateway (ext_authz); its answer is not seen by Countersign")
	return Verdict{Allow: true, Headers: map[string]string{HeaderRequestID: g.RequestID}, RequestID: g.RequestID}
}

// Call is one MCP call to gate, whichever protocol brought it.
type Call struct {
	// Call is what the /v1 API is asked; CallID names the call so that a
	// gateway's retry or a duplicated check finds the same request
	// (CallID builds one).
	client.Call
	// Key is the caller's API key (its Authorization: Bearer); "" is
	// refused. Call.OnBehalfOf is the caller the gateway vouches for
	// (checked here: a malformed identity is refused before anything is
	// asked); CallerBad, when set, says why what the gateway sent is not
	// usable as one, and the call is refused.
	Key       string
	CallerBad string
	// Edits reports whether the gateway can run the call with other
	// arguments than it asked (agentgateway's ExtMcp answers mutated
	// params); when not (ext_authz), a call approved with edited
	// arguments does not pass. It must agree with Call.Gateway: a gateway
	// whose requests offer no edit (approval.Caller.AppliesEdits) cannot
	// apply one.
	Edits bool
	// Trace is the gateway's id of the request, logged with a failure.
	Trace string
}

// Gated is the answer to a Call.
type Gated struct {
	// Pass: the call may run, with Arguments (Edited when an approver
	// changed them; the claim binds them). RequestID is "" when the policy
	// let it through without a request; otherwise the request was claimed
	// with Token, and its outcome is to be reported (Report).
	Pass      bool
	Arguments json.RawMessage
	Edited    bool
	RequestID string
	Token     string
	// Status (an HTTP status: 401, 403, 409, 413, 429, 503, 504…) and
	// Text say why the call did not pass; Text names the tool, and who
	// decided and why. RetryAfter is set when the API asks the caller to
	// wait (rate limited).
	Status     int
	Text       string
	RetryAfter time.Duration
}

// Arguments returns a call's arguments as the API asks them: compact,
// {} when absent or null; an error names what is wrong.
func Arguments(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}"), nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil || compact.Bytes()[0] != '{' {
		return nil, errors.New("params.arguments is not a JSON object")
	}
	return compact.Bytes(), nil
}

// Gating is a call Begin asked and Await waits for, in two steps, for a
// protocol's handler that awaits in its own frame: the frames that read
// the request and asked are not kept while a person decides (as the
// ext_authz handlers do with heldCheck).
type Gating struct{ g *gating }

// Begin is the one answer of every gateway protocol to one call, with
// Await: it asks the /v1 API with the caller's key, on behalf of the
// caller the gateway vouches for, and goes on as far as it can without
// waiting; Await then holds while a person decides (on the store's
// waiter, or by long polls) and claims an approved call, so that it
// passes once. The answer comes when the call may pass, is refused, or
// ctx ends (the gateway gave up: the request stays to be decided, and is
// never claimed here). When ctx has a deadline (the gateway's timeout),
// the answer comes a tenth of the remaining time (at most 1 s) before it:
// a pass the gateway never reads would be a claim nothing ran.
func (s *Service) Begin(ctx context.Context, c Call) Gating { return Gating{s.begin(ctx, c)} }

// Await waits until the call Begin asked may pass, is refused, or its
// context ends, and returns the answer to it.
func (g Gating) Await() Gated {
	for !g.g.done {
		g.g.await()
	}
	return g.g.out
}

// gating is one call through Begin and Await: asked (begin), then, while its
// request is pending, waiting for a person (await) until it ends (done,
// with out). A protocol's handler may await in its own frame: the frames
// that asked are then not kept while a person decides (heldCheck).
type gating struct {
	s   *Service
	ctx context.Context // the call's: the gateway's deadline less a margin, ended by Close
	// release ends ctx (its timer, and its watch of Close) once done.
	release func()
	api     API
	c       Call
	r       *client.Request // as last read
	done    bool
	out     Gated
}

// begin asks for c (Begin's step) and goes on as far as it can
// without waiting.
func (s *Service) begin(ctx context.Context, c Call) *gating {
	ctx, cancelDeadline := ctx, context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); ok {
		ctx, cancelDeadline = context.WithDeadline(ctx, d.Add(-min(time.Until(d)/10, time.Second)))
	}
	ctx, cancel := context.WithCancel(ctx)
	unwatch := context.AfterFunc(s.closed, cancel)
	g := &gating{s: s, ctx: ctx, c: c, release: func() { unwatch(); cancel(); cancelDeadline() }}
	tool := c.Tool
	if c.Key == "" {
		return g.end(Gated{Status: http.StatusUnauthorized, Text: "Countersign refused the call to " + tool + ": no API key (Authorization: Bearer <key>). It did not run."})
	}
	if why := cmp.Or(c.CallerBad, badIdentity(c.OnBehalfOf)); why != "" {
		return g.end(Gated{Status: http.StatusUnauthorized, Text: "Countersign refused the call to " + tool + ": the caller's identity is not usable (" + why + "). It did not run."})
	}
	g.api = s.opts.API(c.Key)
	r, err := g.api.Request(ctx, c.Call)
	if err != nil {
		return g.end(s.refused(ctx, tool, c.Trace, err))
	}
	g.r = r
	g.step()
	return g
}

// end ends g with out.
func (g *gating) end(out Gated) *gating {
	g.done, g.out = true, out
	g.release()
	return g
}

// await waits until g's request is no longer pending (or PollWait
// passes), then goes on as far as it can without waiting again.
//
// What follows the wait is another frame's (waited): this one stays
// small while a person decides.
func (g *gating) await() {
	g.waited(g.s.wait(g.ctx, g.api, g.r.ID))
}

// waited goes on from what await's wait returned.
func (g *gating) waited(r *client.Request, err error) {
	if err != nil {
		g.end(g.s.refused(g.ctx, g.c.Tool, g.c.Trace, err))
		return
	}
	g.r = r
	g.step()
}

// step goes on from the request as last read: nothing while it is
// pending; else the call passes once claimed, or is refused.
func (g *gating) step() {
	s, c, r, tool := g.s, g.c, g.r, g.c.Tool
	if r.Status == client.Pending {
		return
	}
	edited := r.Edited || !sameJSON(r.Arguments, c.Arguments)
	switch {
	case r.Status != client.Approved:
		g.end(Gated{Status: http.StatusForbidden, RequestID: r.ID, Text: outcomeText(tool, r)})
		return
	case edited && !c.Edits:
		g.end(Gated{Status: http.StatusForbidden, RequestID: r.ID, Text: fmt.Sprintf("The call to %s was approved%s with edited arguments %s, which a gateway check cannot apply (it cannot change the request). It did not run; send the call again with those arguments (request %s).", tool, by(r), string(r.Arguments), r.ID)})
		return
	case r.ID == "":
		g.end(Gated{Pass: true, Arguments: c.Arguments}) // let through by the policy: no request, nothing to claim
		return
	}
	claimed, err := g.api.Claim(g.ctx, r.ID)
	var apiErr *client.Error
	switch {
	case err == nil:
		// The claim binds the arguments it was judged with: those run.
		args := claimed.Request.Arguments
		if len(args) == 0 {
			args = r.Arguments
		}
		g.end(Gated{Pass: true, Arguments: args, Edited: !sameJSON(args, c.Arguments), RequestID: r.ID, Token: claimed.Token})
	case errors.As(err, &apiErr) && apiErr.Code == "needs_approvals":
		r.Status = client.Pending // the policy in force asks more approvals: wait again
	case errors.As(err, &apiErr) && apiErr.Code == "already_claimed":
		cur := cmp.Or(apiErr.Request, r)
		g.end(Gated{Status: http.StatusConflict, RequestID: r.ID, Text: fmt.Sprintf("The call to %s already ran once through the gateway (request %s, %s): a check of the same call never lets it through twice.", tool, r.ID, cur.Status)})
	case errors.As(err, &apiErr) && apiErr.Request != nil:
		g.end(Gated{Status: http.StatusForbidden, RequestID: r.ID, Text: outcomeText(tool, apiErr.Request)})
	default:
		g.end(s.refused(g.ctx, tool, c.Trace, err))
	}
}

// wait returns request id once it is no longer pending, or once PollWait
// has passed: on the store's waiter when there is one, then read through
// the API (the key's view of it); else by the API's long poll. A waiter
// that fails falls back to the long poll, so a failure never spins.
func (s *Service) wait(ctx context.Context, api API, id string) (*client.Request, error) {
	if s.opts.Waiter == nil {
		return api.Get(ctx, id, s.opts.PollWait)
	}
	wctx, cancel := context.WithTimeout(ctx, s.opts.PollWait)
	_, err := s.opts.Waiter.Wait(wctx, id)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil && wctx.Err() == nil:
		s.opts.Logger.Warn("gateway check: waiting on the store failed; long poll instead", "request_id", id, "err", err)
		return api.Get(ctx, id, s.opts.PollWait)
	}
	return api.Get(ctx, id, 0)
}

// Report records the outcome of the call g let through (status Executed
// or Failed, output a short summary) with its claim token, asking as
// key. A failure is logged: the call ran, whatever the record says.
func (s *Service) Report(ctx context.Context, key string, g Gated, status client.Status, output string) {
	if g.RequestID == "" || g.Token == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := s.opts.API(key).Result(ctx, g.RequestID, g.Token, status, output); err != nil {
		s.opts.Logger.Warn("gateway call's result not recorded", "request_id", g.RequestID, "status", status, "err", err)
	}
}

// refused answers a call whose request could not be made, waited on or
// claimed: the API's refusal, or a failure (fail closed).
func (s *Service) refused(ctx context.Context, tool, trace string, err error) Gated {
	if s.closed.Err() != nil {
		return Gated{Status: http.StatusServiceUnavailable, Text: "Countersign is shutting down: the call to " + tool + " did not run. Try again."}
	}
	if ctx.Err() != nil {
		return Gated{Status: http.StatusGatewayTimeout, Text: "Countersign stopped waiting: the gateway gave up on the check. The call did not run."}
	}
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.HTTPStatus < 500 {
		return Gated{Status: apiErr.HTTPStatus, RetryAfter: apiErr.RetryAfter, Text: fmt.Sprintf("Countersign refused the call to %s: %s. It did not run.", tool, apiErr.Message)}
	}
	s.opts.Logger.Error("gateway check failed", "tool", tool, "x_request_id", trace, "err", err)
	return Gated{Status: http.StatusServiceUnavailable, Text: "Countersign could not check the call to " + tool + "; it did not run. Try again later."}
}

// CallID names a call for the API from the parts that make it the same
// call (for ext_authz: the MCP session, the JSON-RPC id, the tool, its
// arguments and the caller), so a gateway's retry or a duplicated check
// finds the same request, and another caller's identical call does not.
// prefix says which protocol named it.
func CallID(prefix string, parts ...[]byte) string {
	h := sha256.New()
	var b [2 * sha256.Size]byte
	for _, part := range parts {
		h.Write(strconv.AppendInt(b[:0], int64(len(part)), 10))
		h.Write([]byte{':'})
		h.Write(part)
	}
	var sum [sha256.Size]byte
	hex.Encode(b[:], h.Sum(sum[:0])[:16])
	return prefix + string(b[:32])
}

// Bearer is the key of an Authorization header "Bearer <key>", "" when
// the header holds none.
func Bearer(h string) string {
	scheme, key, ok := strings.Cut(strings.TrimSpace(h), " ")
	if key = strings.TrimSpace(key); !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return key
}

// sameJSON reports whether two JSON values are equal as values.
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true // the same bytes: nothing to read (the usual case)
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// deny is a denial: HTTP status and a JSON-RPC error body answering id.
func deny(status int, id json.RawMessage, requestID, text string) Verdict {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	body, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{Code: -32001, Message: text, Data: errorData{RequestID: requestID, Status: status}}})
	h := map[string]string{"content-type": "application/json"}
	if requestID != "" {
		h[HeaderRequestID] = requestID
	}
	return Verdict{Status: status, Headers: h, Body: body, RequestID: requestID}
}

type rpcError struct {
	Code    int       `json:"code"`
	Message string    `json:"message"`
	Data    errorData `json:"data"`
}

type errorData struct {
	RequestID string `json:"countersign_request_id,omitempty"`
	Status    int    `json:"http_status"`
}

func by(r *client.Request) string {
	if name := cmp.Or(r.ApproverName, r.Approver); name != "" {
		return " by " + name
	}
	return ""
}

// outcomeText says why a decided call did not pass, naming who decided
// and why (client.Request.NotRun), or that it ran already.
func outcomeText(tool string, r *client.Request) string {
	switch r.Status {
	case client.Executing, client.Executed, client.Failed, client.Unknown:
		id := ""
		if r.ID != "" {
			id = " (request " + r.ID + ")"
		}
		return fmt.Sprintf("The call to %s already ran once through the gateway%s: a check of the same call never lets it through twice.", tool, id)
	}
	return r.NotRun(tool)
}
