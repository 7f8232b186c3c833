// Package mcp is Countersign's MCP gateway: an MCP server (stdio or
// streamable HTTP) in front of the upstream MCP servers the policy file
// names (its mcp key). It lists their tools (named <upstream>__<tool>
// unless the policy turns the prefix off), passes their resources,
// prompts, completions, subscriptions, logging, progress, sampling and
// elicitation through (forward.go), each client over upstream sessions of
// its own so that what an upstream sends reaches only the client it came
// for (links.go, route.go), and gates every tools/call through
// Countersign's HTTP API (/v1): the call becomes a request there, exactly as any other
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
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/policyfile"
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
	// Transport, when set, is used instead of Command or URL. It is one
	// connection: the gateway has one session with such an upstream, shared
	// by its clients (see links.go for what that withholds from them).
	Transport mcp.Transport
	// Server, when set, is an MCP server in this process used instead of
	// Transport, Command or URL (tests, in-process upstreams): each session
	// of the gateway with it is a new in-memory connection.
	Server *mcp.Server
}

// Upstreams are the policy file's upstreams, their environment and
// headers resolved from env: Options.Upstreams of `serve`'s gateway and of
// `countersign mcp`'s.
func Upstreams(p policyfile.MCP, env func(string) string) []Upstream {
	var out []Upstream
	for _, u := range p.Upstreams {
		vars, headers := u.Resolve(env)
		out = append(out, Upstream{Name: u.Name, Command: u.Command, URL: u.URL, Env: vars, Headers: headers})
	}
	return out
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
	// OneClient says the gateway serves one MCP client for its whole life
	// (`countersign mcp` over stdio): its sessions with the upstreams are
	// that client's own, and a second client session is refused. Otherwise
	// (/mcp) each client session gets sessions of its own with the
	// upstreams it uses (links.go).
	OneClient bool
	// MaxClientLinks bounds the upstream sessions the gateway keeps open
	// for client sessions, per upstream, default MaxClientLinks (links.go).
	MaxClientLinks int
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
	watchers  sync.WaitGroup     // the client links' watchers (links.go); each exits once its session ends

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
	// rather than through option.PositiveOr and option.FuncOr.
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
	if o.MaxClientLinks <= 0 {
		o.MaxClientLinks = MaxClientLinks
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
	g := &Gateway{opts: o, runID: "mcp_" + strings.ToLower(rand.Text()[:12]), pending: newPendingCalls(o.MaxPendingCalls), flights: map[string]*flight{}, toolNames: map[string][]string{}, fwd: newForwarding(o.OneClient, o.MaxClientLinks)}
	g.server = mcp.NewServer(&mcp.Implementation{Name: "countersign", Version: o.Version}, &mcp.ServerOptions{
		Instructions:       "Tool calls go through Countersign: a call the policy gates waits for a human's approval in Slack, and a rejection comes back as an error result with the approver's reason.",
		CompletionHandler:  g.complete,
		SubscribeHandler:   g.subscribe,
		UnsubscribeHandler: g.unsubscribe,
	})
	g.fwd.sessions = func() []*mcp.ServerSession { return slices.Collect(g.server.Sessions()) }
	g.server.AddReceivingMiddleware(g.admit, g.unavailableTools, g.keyLists, g.passOn)
	g.server.AddSendingMiddleware(g.updatesOnlyTo)
	g.start(ctx)
	return g, nil
}

// Server is the MCP server, to Run over a transport (stdio).
func (g *Gateway) Server() *mcp.Server { return g.server }

// Handler serves the gateway over streamable HTTP, every revision
// (revisionHandlers). Each MCP client's Authorization: Bearer key is the
// API key its calls are made with; a request without one, or with one
// Options.Authorize refuses, gets 403 (refuseKey). A session belongs to
// the key that started it (sessionPerKey).
func (g *Gateway) Handler() http.Handler {
	h := sessionPerKey(g.revisionHandlers())
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
	g.closeLinks()
	g.wg.Wait()
	g.watchers.Wait()
	return errors.Join(errs...)
}
