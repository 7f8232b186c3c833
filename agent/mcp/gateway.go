// Package mcp is Countersign's MCP gateway: an MCP server (stdio or
// streamable HTTP) in front of the upstream MCP servers the policy file
// names (its mcp key). It lists their tools (named <upstream>__<tool>
// unless the policy turns the prefix off), passes their resources,
// prompts, completions, subscriptions, logging, progress, sampling and
// elicitation through (forward.go), and gates every tools/call through Countersign's HTTP
// API (/v1): the call becomes a request there, exactly as any other
// agent's, with the same gate, Slack card and audit. The gateway holds
// the call while a human decides (sending MCP progress notifications),
// claims the approved request (exactly one claim wins, across processes
// and executors: identical concurrent calls share the one execution),
// runs the upstream tool with the arguments as approved (an edit
// included), reports the outcome to the API, and answers a rejection,
// timeout or refusal with a tool result marked isError that carries the
// reason.
//
// The gateway is the only place that imports the MCP go-sdk. docs/mcp.md
// describes it for users.
package mcp

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/clip"
)

// API is what the gateway needs of Countersign's HTTP API
// (*client.Client): one gating path for every source.
type API interface {
	// Request asks for approval of a call; an auto-approved or refused
	// call is answered at once.
	Request(ctx context.Context, c client.Call) (*client.Request, error)
	// Get returns the request once final or when wait passes (long poll).
	Get(ctx context.Context, id string, wait time.Duration) (*client.Request, error)
	// Claim claims an approved request before it runs: exactly one claim
	// wins and gets the token Result needs; a later one is a
	// *client.Error (already_claimed with the request as it now is,
	// abandoned, not_approved).
	Claim(ctx context.Context, id string) (*client.Claimed, error)
	// Result reports what came of the request claimed with token.
	Result(ctx context.Context, id, token string, status client.Status, output string) (*client.Request, error)
	// Self returns the calling key's name and the tools it may ask for:
	// tools/list shows only those.
	Self(ctx context.Context) (*client.Key, error)
}

var _ API = (*client.Client)(nil)

// Upstream is one MCP server the gateway proxies: a stdio Command or a
// streamable HTTP URL.
type Upstream struct {
	// Name names the upstream; its tools are <Name>__<tool> when prefixed.
	Name string
	// Command is the program and arguments of a stdio server, run as
	// written (a wrapper: [node, tap.mjs, --, node, server.js]). Its
	// environment is Env on top of a few of the gateway's own variables
	// (PATH, HOME, the locale: see Environ), never the rest of it.
	Command []string
	Env     map[string]string
	// URL is a streamable HTTP endpoint; Headers are sent with each call.
	URL     string
	Headers map[string]string
	// Transport, when set, is used instead of Command or URL (tests,
	// in-process upstreams).
	Transport mcp.Transport
}

// Separator joins an upstream's name and its tool's name when prefixed.
// MCP tool names allow [A-Za-z0-9_.-]; policy tool names allow
// [A-Za-z0-9_-], so "__" lets a policy declare a prefixed tool.
const Separator = "__"

// callHeader carries, from Handler to a tool handler, the token of the
// HTTP request that brought the call.
const callHeader = "X-Countersign-Mcp-Post"

// DefaultProgressEvery is how often a waiting call sends progress.
const DefaultProgressEvery = 10 * time.Second

// DefaultPollWait is how long one long poll of the API lasts.
const DefaultPollWait = 30 * time.Second

// DefaultFollowEvery is how often a call whose request another executor
// runs reads it, waiting for that execution's outcome.
const DefaultFollowEvery = 500 * time.Millisecond

// Options configure a Gateway. Upstreams and API are required.
type Options struct {
	Upstreams []Upstream
	// Prefix names tools <upstream>__<tool>.
	Prefix bool
	// API returns the API client for a caller's key: the MCP client's
	// bearer key over HTTP, Key over stdio.
	API func(key string) API
	// Key is the API key used when the MCP request carries none (stdio).
	Key string
	// ProgressEvery is how often a waiting call sends a progress
	// notification, default DefaultProgressEvery.
	ProgressEvery time.Duration
	// Ticker returns the ticks of a waiting call's progress and a stop
	// function, default a time.Ticker of ProgressEvery.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	// PollWait is how long one long poll lasts, default DefaultPollWait.
	PollWait time.Duration
	// FollowEvery is how often a call whose request another executor
	// claimed (another gateway process) reads the request until its
	// outcome is recorded, default DefaultFollowEvery.
	FollowEvery time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// Version is the server version told to MCP clients.
	Version string
	// Authorize, when set, tells whether an HTTP client's bearer key is
	// a key of the API: Handler refuses any other with 403 before the MCP
	// session starts, so an unknown key cannot even list the tools.
	Authorize func(key string) bool
	// Logger gets one line per failure, default discard.
	Logger *slog.Logger
	// ConnectTimeout bounds one attempt to start an upstream (connect,
	// initialize, list), default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between attempts to start an
	// upstream that failed to start or stopped: it doubles from RetryMin
	// up to RetryMax, default DefaultRetryMin and DefaultRetryMax.
	RetryMin, RetryMax time.Duration
	// After returns a channel that receives once d has passed, and a stop
	// function: the wait before the next attempt. Default a time.Timer;
	// tests fire it by hand.
	After func(d time.Duration) (<-chan time.Time, func())
	// MaxPendingCalls bounds the calls not yet answered the gateway
	// remembers, default MaxPendingCalls (see there).
	MaxPendingCalls int
	// KeepAliveEvery is how often the HTTP response of a held call carries
	// an SSE comment, default DefaultKeepAliveEvery (transport.go).
	KeepAliveEvery time.Duration
}

// Gateway is the MCP server in front of the upstreams.
type Gateway struct {
	opts   Options
	server *mcp.Server
	runID  string // names a stdio session's calls (its session id is empty)

	posts sync.Map // callHeader token → the HTTP request's context
	held  sync.Map // callHeader token → the HTTP request's *heldWriter

	fwd *forwarding // what runs upstream for whom, levels, subscriptions (forward.go)

	upstreams []*upstream        // one per Options.Upstreams, fixed by New
	stop      context.CancelFunc // ends the upstreams' supervisors
	wg        sync.WaitGroup     // the supervisors; each exits once stop is called

	mu        sync.Mutex          // guards the fields below
	pending   *pendingCalls       // call key → its call id while not answered; at most MaxPendingCalls
	flights   map[string]*flight  // request id → its execution in this process, removed once it ends
	toolNames map[string][]string // upstream → its listed tools
}

// New starts every upstream (at once, each within ConnectTimeout), lists
// their tools, resources and prompts, and returns the gateway serving
// them. An upstream that fails to start does not stop the others: it is
// logged, Unavailable names it, its tools answer that it is unavailable
// (nothing runs), and it is tried again with backoff until it starts;
// its tools then appear (MCP clients get tools/list_changed). An upstream
// whose session ends is tried again likewise. Close disconnects.
func New(ctx context.Context, o Options) (*Gateway, error) {
	if o.API == nil {
		return nil, errors.New("mcp gateway: Options.API is required")
	}
	if len(o.Upstreams) == 0 {
		return nil, errors.New("mcp gateway: no upstreams (the policy file's mcp.upstreams)")
	}
	// The gateway imports only the API client and the MCP SDK (never
	// approval), so its negative numbers and nil functions fall back here
	// rather than through approval.PositiveOr and approval.FuncOr.
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = DefaultProgressEvery
	}
	if o.PollWait <= 0 {
		o.PollWait = DefaultPollWait
	}
	if o.FollowEvery <= 0 {
		o.FollowEvery = DefaultFollowEvery
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(o.RetryMin, DefaultRetryMax)
	}
	if o.MaxPendingCalls <= 0 {
		o.MaxPendingCalls = MaxPendingCalls
	}
	if o.KeepAliveEvery <= 0 {
		o.KeepAliveEvery = DefaultKeepAliveEvery
	}
	if o.Ticker == nil {
		o.Ticker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if o.After == nil {
		o.After = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTimer(d)
			return t.C, func() { t.Stop() }
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	o.Version = cmp.Or(o.Version, "dev")
	g := &Gateway{opts: o, runID: "mcp_" + strings.ToLower(rand.Text()[:12]), pending: newPendingCalls(o.MaxPendingCalls), flights: map[string]*flight{}, toolNames: map[string][]string{}, fwd: newForwarding()}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "countersign", Version: o.Version}, &mcp.ServerOptions{
		Instructions:       "Tool calls go through Countersign: a call the policy gates waits for a human's approval in Slack, and a rejection comes back as an error result with the approver's reason.",
		CompletionHandler:  g.complete,
		SubscribeHandler:   g.subscribe,
		UnsubscribeHandler: g.unsubscribe,
	})
	g.fwd.sessions = func() []*mcp.ServerSession { return slices.Collect(g.server.Sessions()) }
	g.server.AddReceivingMiddleware(g.unavailableTools, g.keyTools, g.passOn)
	g.start(ctx)
	return g, nil
}

// Server is the MCP server, to Run over a transport (stdio).
func (g *Gateway) Server() *mcp.Server { return g.server }

// Handler serves the gateway over streamable HTTP, every revision
// (revisionHandlers). Each MCP client's Authorization: Bearer key is the
// API key its calls are made with; a request without one, or with one
// Options.Authorize refuses, gets 403 (refuseKey).
func (g *Gateway) Handler() http.Handler {
	h := g.revisionHandlers()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A client that goes away cancels its calls: a waiting call stops
		// waiting and its tool never runs. The go-sdk keeps a session's
		// call running when its POST's connection drops (it could be
		// resumed), so the POST's context is handed to the tool handler
		// through a header only this wrapper sets (see gated).
		token := rand.Text()
		r.Header.Set(callHeader, token)
		g.posts.Store(token, r.Context())
		defer g.posts.Delete(token)
		if key := bearer(r.Header); key == "" || (g.opts.Authorize != nil && !g.opts.Authorize(key)) {
			refuseKey(w, r, key != "")
			return
		}
		hw := &heldWriter{ResponseWriter: w}
		g.held.Store(token, hw)
		defer g.held.Delete(token)
		defer hw.end()
		h.ServeHTTP(hw, r)
	})
}

// Close ends the MCP clients' sessions (a call still waiting stops
// waiting; its request stays pending in Countersign) and disconnects from
// the upstreams.
func (g *Gateway) Close() error {
	for ss := range g.server.Sessions() {
		_ = ss.Close()
	}
	g.stop()
	var errs []error
	for _, up := range g.upstreams {
		if err := up.close(); err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: %w", up.name, err))
		}
	}
	g.wg.Wait()
	return errors.Join(errs...)
}

// listTools (re)registers the upstream's tools on the gateway's server.
func (g *Gateway) listTools(ctx context.Context, up *upstream, cs *mcp.ClientSession) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil || caps.Tools == nil {
		return nil
	}
	var names []string
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("mcp upstream %s: list tools: %w", up.name, err)
		}
		tools = append(tools, t)
	}
	for _, t := range tools {
		exposed := *t
		exposed.Name = g.exposedName(up, t.Name)
		if exposed.InputSchema == nil {
			exposed.InputSchema = map[string]any{"type": "object"}
		}
		names = append(names, exposed.Name)
		g.server.AddTool(&exposed, g.gated(up, t))
	}
	g.mu.Lock()
	old := g.toolNames[up.name]
	g.toolNames[up.name] = names
	g.mu.Unlock()
	var gone []string
	for _, n := range old {
		if !slices.Contains(names, n) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	return nil
}

// listPassThrough registers the upstream's resources, resource templates
// and prompts, each read from the upstream that owns it once the API lets
// the read through (gatedRead, gatedPrompt), and removes those it no
// longer lists (it is called again when the upstream says its resources
// or prompts changed, and when it restarts).
func (g *Gateway) listPassThrough(ctx context.Context, up *upstream, cs *mcp.ClientSession) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil {
		return nil
	}
	now := &listed{prompts: map[string]string{}}
	read := g.gatedRead(up)
	if caps.Resources != nil {
		for r, err := range cs.Resources(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list resources: %w", up.name, err)
			}
			now.resources = append(now.resources, r.URI)
			g.server.AddResource(r, read)
		}
		for rt, err := range cs.ResourceTemplates(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list resource templates: %w", up.name, err)
			}
			now.templates = append(now.templates, rt.URITemplate)
			g.server.AddResourceTemplate(rt, read)
		}
	}
	if caps.Prompts != nil {
		for p, err := range cs.Prompts(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list prompts: %w", up.name, err)
			}
			name := p.Name
			exposed := *p
			exposed.Name = g.exposedName(up, name)
			now.prompts[exposed.Name] = name
			g.server.AddPrompt(&exposed, g.gatedPrompt(up, name))
		}
	}
	gone := g.relist(up, now)
	if len(gone.resources) > 0 {
		g.server.RemoveResources(gone.resources...)
	}
	if len(gone.templates) > 0 {
		g.server.RemoveResourceTemplates(gone.templates...)
	}
	if len(gone.prompts) > 0 {
		g.server.RemovePrompts(slices.Collect(maps.Keys(gone.prompts))...)
	}
	return nil
}

func (g *Gateway) exposedName(up *upstream, name string) string {
	if g.opts.Prefix {
		return up.name + Separator + name
	}
	return name
}

// annotations are the upstream tool's MCP hints as the API takes them;
// none at all is MCP's default (destructive, open-world).
func annotations(t *mcp.Tool) *client.Annotations {
	a := &client.Annotations{}
	if t.Annotations == nil {
		return a
	}
	ro := t.Annotations.ReadOnlyHint
	a.ReadOnly = &ro
	a.Destructive = t.Annotations.DestructiveHint
	a.OpenWorld = t.Annotations.OpenWorldHint
	return a
}

// gated is the handler of one upstream tool: every call goes through the
// API first.
func (g *Gateway) gated(up *upstream, t *mcp.Tool) mcp.ToolHandler {
	hints := annotations(t)
	// The upstream's schema, so an approver's edit of an undeclared tool's
	// arguments is validated as the upstream would.
	var schema json.RawMessage
	if t.InputSchema != nil {
		if b, err := json.Marshal(t.InputSchema); err == nil {
			schema = b
		}
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancel := g.withPost(ctx, req.Extra)
		defer cancel()
		if _, err := up.current(); err != nil {
			// Fail closed: no request is made for a call that cannot run.
			g.opts.Logger.Warn("mcp call refused: upstream unavailable", "tool", g.exposedName(up, t.Name), "err", err)
			return unavailable(g.exposedName(up, t.Name), up.name), nil
		}
		api := g.opts.API(g.key(req.Extra))
		args := json.RawMessage(req.Params.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		name := g.exposedName(up, t.Name)
		run := g.run(req.Session)
		callKey, callID := g.callID(run, name, args)
		reason, _ := req.Params.Meta["reason"].(string)
		r, err := api.Request(ctx, client.Call{Tool: name, Arguments: args, RunID: run, CallID: callID, Reason: reason, Annotations: hints, InputSchema: schema, Upstream: up.name})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			g.opts.Logger.Error("mcp call not gated", "tool", name, "err", err)
			g.done(callKey)
			return refusal("Countersign refused the call to %s: %s", name, apiMessage(err)), nil
		}
		if !r.Status.Final() {
			release := g.hold(req.Extra, r.ID, name)
			r, err = g.wait(ctx, req.Session, req.Params.GetProgressToken(), api, r, name)
			release()
			if err != nil {
				// The client is gone (or cancelled the call): stop waiting
				// and never run the tool. The request stays in Countersign,
				// is still decided there and audited.
				return nil, err
			}
		}
		g.done(callKey)
		switch {
		case r.ID != "" && ranElsewhere(r.Status):
			// An identical call of this session claimed it first.
			return g.follow(ctx, req, api, r, name)
		case r.Status != client.Approved:
			return refusal("%s", outcomeText(name, r)), nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case r.ID == "":
			// Let through by the policy: no request, nothing to claim.
			res, callErr := g.callTool(ctx, req, up, &mcp.CallToolParams{Name: t.Name, Arguments: r.Arguments})
			if callErr != nil {
				return refusal("the upstream %s failed: %v", up.name, callErr), nil
			}
			return res, nil
		}
		return g.execute(ctx, req, api, up, t.Name, r, name)
	}
}

// flight is the one execution of an approved request in this process:
// identical calls waiting on the same request share its answer.
type flight struct {
	done chan struct{} // closed once res or err is set
	res  *mcp.CallToolResult
	err  error
}

// execute runs approved request r at most once: one call per request in
// this process leads (the others share its answer), and the leader claims
// the request through the API before calling the upstream; a claim that
// loses (another gateway process, or any other executor, claimed it
// first) never runs the tool and answers with the winner's stored result.
func (g *Gateway) execute(ctx context.Context, req *mcp.CallToolRequest, api API, up *upstream, tool string, r *client.Request, name string) (*mcp.CallToolResult, error) {
	g.mu.Lock()
	f, running := g.flights[r.ID]
	if !running {
		f = &flight{done: make(chan struct{})}
		g.flights[r.ID] = f
	}
	g.mu.Unlock()
	if running {
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.res != nil {
			return ownCopy(f.res), nil
		}
		return g.follow(ctx, req, api, r, name) // the leader's client left before its answer: read the record
	}
	f.res, f.err = g.lead(ctx, req, api, up, tool, r, name)
	g.mu.Lock()
	delete(g.flights, r.ID)
	g.mu.Unlock()
	close(f.done)
	return ownCopy(f.res), f.err
}

// lead claims r and, when the claim wins, runs the upstream tool with the
// approved arguments and reports its outcome with the claim's token.
func (g *Gateway) lead(ctx context.Context, req *mcp.CallToolRequest, api API, up *upstream, tool string, r *client.Request, name string) (*mcp.CallToolResult, error) {
	claim, err := api.Claim(ctx, r.ID)
	if err != nil {
		var apiErr *client.Error
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.As(err, &apiErr) && apiErr.Code == "already_claimed":
			cur := r
			if apiErr.Request != nil {
				cur = apiErr.Request
			}
			return g.follow(ctx, req, api, cur, name)
		case errors.As(err, &apiErr) && apiErr.Request != nil:
			return refusal("%s", outcomeText(name, apiErr.Request)), nil
		}
		g.opts.Logger.Error("mcp call not claimed", "request_id", r.ID, "tool", name, "err", err)
		return refusal("Countersign refused to let %s run: %s. It did not run.", name, apiMessage(err)), nil
	}
	res, callErr := g.callTool(ctx, req, up, &mcp.CallToolParams{Name: tool, Arguments: claim.Request.Arguments})
	status, summary := client.Executed, ""
	switch {
	case callErr != nil:
		status, summary = client.Failed, callErr.Error()
	case res.IsError:
		status, summary = client.Failed, resultText(res)
	default:
		summary = resultText(res)
	}
	// Reported even when the client has gone meanwhile: it ran.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resultTimeout)
	if _, err := api.Result(rctx, r.ID, claim.Token, status, clip.Bytes(summary, 500)); err != nil {
		g.opts.Logger.Error("mcp result not reported", "request_id", r.ID, "tool", name, "err", err)
	}
	cancel()
	if callErr != nil {
		return refusal("the upstream %s failed: %v", up.name, callErr), nil
	}
	return res, nil
}

// ranElsewhere reports whether s says another executor claimed the
// request (it runs, or ran, there).
func ranElsewhere(s client.Status) bool {
	return s == client.Executing || s == client.Executed || s == client.Failed || s == client.Unknown
}

// follow answers a call whose request another executor claimed: it waits
// (reading the request every FollowEvery, with progress notifications on
// the progress ticks) until that execution's outcome is recorded, and
// answers with it. The tool never runs here.
func (g *Gateway) follow(ctx context.Context, req *mcp.CallToolRequest, api API, r *client.Request, name string) (*mcp.CallToolResult, error) {
	ticks, stop := g.opts.Ticker(g.opts.ProgressEvery)
	defer stop()
	token := req.Params.GetProgressToken()
	n := 0
	for r.Status == client.Executing {
		t := time.NewTimer(g.opts.FollowEvery)
	pause:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
				break pause
			case <-ticks:
				if token == nil || req.Session == nil {
					continue
				}
				n++
				msg := fmt.Sprintf("an identical call is running the approved request %s (%s); waiting for its result", r.ID, name)
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}); err != nil {
					g.opts.Logger.Warn("mcp progress not sent", "request_id", r.ID, "err", err)
				}
			}
		}
		got, err := api.Get(ctx, r.ID, 0)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			g.opts.Logger.Warn("mcp read of a claimed request failed; retrying", "request_id", r.ID, "err", err)
		default:
			r = got
		}
	}
	return storedAnswer(name, r), nil
}

// storedAnswer is the answer of a call whose request another executor
// ran: the outcome it reported.
func storedAnswer(tool string, r *client.Request) *mcp.CallToolResult {
	out := ""
	if r.Result != nil {
		out = r.Result.Output
	}
	switch r.Status {
	case client.Executed:
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}
	case client.Failed:
		return refusal("%s", out)
	case client.Unknown:
		return refusal("The call to %s (request %s) was run by another executor whose outcome is unknown. It did not run again here.", tool, r.ID)
	}
	return refusal("%s", outcomeText(tool, r))
}

// wait long-polls the request until it is final or ctx ends, sending a
// progress notification on every tick when the client asked for them.
func (g *Gateway) wait(ctx context.Context, session *mcp.ServerSession, token any, api API, r *client.Request, tool string) (*client.Request, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	final := make(chan *client.Request, 1)
	failed := make(chan error, 1)
	go func() { // exits when the request is final or ctx ends
		pause := 500 * time.Millisecond
		for {
			got, err := api.Get(ctx, r.ID, g.opts.PollWait)
			switch {
			case ctx.Err() != nil:
				failed <- ctx.Err()
				return
			case err == nil && got.Status.Final():
				final <- got
				return
			case err != nil:
				var apiErr *client.Error
				if errors.As(err, &apiErr) && apiErr.HTTPStatus < 500 && apiErr.Code != "rate_limited" {
					failed <- err
					return
				}
				g.opts.Logger.Warn("mcp long poll failed; retrying", "request_id", r.ID, "err", err)
				t := time.NewTimer(pause)
				select {
				case <-ctx.Done():
					t.Stop()
					failed <- ctx.Err()
					return
				case <-t.C:
				}
				pause = min(pause*2, 10*time.Second)
			default:
				pause = 500 * time.Millisecond
			}
		}
	}()
	ticks, stop := g.opts.Ticker(g.opts.ProgressEvery)
	defer stop()
	start := g.opts.Now()
	n := 0
	for {
		select {
		case got := <-final:
			return got, nil
		case err := <-failed:
			if ctx.Err() != nil {
				return nil, err
			}
			// The API refused the poll (key revoked…): answer the model.
			return &client.Request{ID: r.ID, Status: client.Unknown, Reason: apiMessage(err)}, nil
		case <-ticks:
			if token == nil || session == nil {
				continue
			}
			n++
			msg := fmt.Sprintf("waiting for a human approval in Slack: request %s (%s), %s so far", r.ID, tool, g.opts.Now().Sub(start).Round(time.Second))
			if err := session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}); err != nil {
				g.opts.Logger.Warn("mcp progress not sent", "request_id", r.ID, "err", err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// outcomeText says in words why a call did not run.
func outcomeText(tool string, r *client.Request) string {
	who := ""
	if name := cmp.Or(r.ApproverName, r.Approver); name != "" {
		who = " by " + name // a name: the model and its user read it
	}
	reason := ""
	if r.Reason != "" {
		reason = ": " + r.Reason
	}
	id := ""
	if r.ID != "" {
		id = " (request " + r.ID + ")"
	}
	switch r.Status {
	case client.Rejected:
		if r.ID == "" {
			return fmt.Sprintf("The call to %s was refused by policy%s. It did not run.", tool, reason)
		}
		return fmt.Sprintf("The call to %s was rejected%s%s%s. It did not run.", tool, who, reason, id)
	case client.Responded:
		return fmt.Sprintf("The call to %s did not run; a person answered instead%s%s: %s", tool, who, id, r.Response)
	case client.Expired:
		return fmt.Sprintf("The call to %s was not decided before its deadline%s%s. It did not run.", tool, id, reason)
	case client.Cancelled:
		return fmt.Sprintf("The call to %s was cancelled%s%s%s. It did not run.", tool, who, reason, id)
	default:
		return fmt.Sprintf("The call to %s is %s%s%s. It did not run.", tool, r.Status, id, reason)
	}
}

func refusal(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// apiMessage is an API error as a person reads it.
func apiMessage(err error) string {
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		s := apiErr.Message
		if apiErr.Field != "" {
			s += " (field " + apiErr.Field + ")"
		}
		return s
	}
	return err.Error()
}

// resultText is the text of a tool result, for the card's short summary.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d content item(s)", len(res.Content))
	}
	return strings.Join(parts, "\n")
}

// bearer returns the key of an Authorization: Bearer header.
func bearer(h http.Header) string {
	if h == nil {
		return ""
	}
	k, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(k)
}

// headerTransport adds fixed headers to each request to an upstream.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	return t.base.RoundTrip(r)
}

// CheckStdio checks the settings of `countersign mcp` before anything is
// built: the server's http(s) URL, the API key the calls are made with,
// and the policy file naming the upstreams. Each error names the
// environment variable (and flag) the setting is read from.
func CheckStdio(serverURL, apiKey, configFile string) []error {
	errs := client.CheckServer(serverURL, apiKey)
	if configFile == "" {
		errs = append(errs, errors.New("COUNTERSIGN_CONFIG (--config): required (the policy file with mcp.upstreams)"))
	}
	return errs
}

// RunStdio serves one MCP client over stdin/stdout until it disconnects
// or ctx ends (`countersign mcp`).
func (g *Gateway) RunStdio(ctx context.Context) error {
	return g.server.Run(ctx, &mcp.StdioTransport{})
}

// Clients is Options.API for the Countersign server at baseURL, reached
// with hc: a client of its HTTP API (agent/api/client) for each key.
func Clients(baseURL string, hc *http.Client) func(key string) API {
	return func(key string) API {
		c := client.New(baseURL, key)
		c.HTTP = hc
		return c
	}
}

// InProcess returns an HTTP client whose requests are served by h directly,
// in this process: the gateway mounted by `serve` reaches the API handler
// through it, the same code path as over the network, with no socket.
func InProcess(h http.Handler) *http.Client {
	return &http.Client{Transport: handlerTransport{h: h}}
}

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}
