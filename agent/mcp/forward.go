package mcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: what the gateway forwards besides the gated calls, so that an
// MCP client sees its upstreams as they are: completion, resource
// subscriptions and their updates, logging both ways, the upstreams'
// progress, sampling and elicitation requests, and the list changes of
// resources and prompts.
//
// Which client an upstream's message belongs to. The gateway holds one
// session per upstream, shared by all its MCP clients (over HTTP, many).
// go-sdk's client hands the gateway an upstream's server→client request or
// notification with nothing that names the client request it relates to.
// So the gateway keeps, per upstream, the client requests it is running
// there (inflight); each gets its own progress token upstream, so progress
// is matched exactly. A sampling or elicitation request, or a log message,
// goes to the client session whose requests are running on that upstream
// when there is exactly one such session (always the case over stdio:
// one client); with none or several it is refused (a request: the
// upstream gets an error) or not relayed (a log message), never sent to a
// client that may not have caused it.

// forwarding is the gateway's state for forwarding.
type forwarding struct {
	mu       sync.Mutex                                  // guards the fields below
	seq      uint64                                      // orders inflight entries
	inflight map[string]*inflight                        // upstream progress token → a client request running upstream
	levels   map[*mcp.ServerSession]mcp.LoggingLevel     // each client session's logging/setLevel
	subs     map[string]map[*mcp.ServerSession]*upstream // uri → the client sessions subscribed to it, and its upstream
	owners   map[*upstream]*listed                       // what each upstream listed, for routing by name or uri
	orders   map[*upstream]*order                        // each upstream connection's notification count (order.go)
	level    mcp.LoggingLevel                            // the level last passed on to the upstreams
	sessions func() []*mcp.ServerSession                 // the connected client sessions
}

// listed is what one upstream listed besides tools.
type listed struct {
	resources []string          // uris
	templates []string          // uri templates
	prompts   map[string]string // exposed name → the upstream's name
}

// inflight is one client request the gateway runs upstream.
type inflight struct {
	up      *upstream
	ctx     context.Context // the client request's: sent with it, a message goes on that request's stream
	session *mcp.ServerSession
	token   any // the client's progress token, nil when it sent none
	seq     uint64
}

func newForwarding() *forwarding {
	return &forwarding{inflight: map[string]*inflight{}, levels: map[*mcp.ServerSession]mcp.LoggingLevel{},
		subs: map[string]map[*mcp.ServerSession]*upstream{}, owners: map[*upstream]*listed{}, orders: map[*upstream]*order{}}
}

// begin records a client request of session about to run on up and
// returns the _meta to send upstream with it (a progress token of the
// gateway's, when the client sent one) and the function that forgets it
// once it has run, after the upstream's notifications that came before its
// answer are relayed (order.go).
func (g *Gateway) begin(ctx context.Context, up *upstream, session *mcp.ServerSession, token any) (mcp.Meta, func()) {
	id := "cs_" + strings.ToLower(rand.Text()[:16])
	f := g.fwd
	f.mu.Lock()
	f.seq++
	f.inflight[id] = &inflight{up: up, ctx: ctx, session: session, token: token, seq: f.seq}
	o := f.orders[up]
	f.mu.Unlock()
	var meta mcp.Meta
	if token != nil {
		meta = mcp.Meta{"progressToken": id}
	}
	return meta, func() {
		o.settle(ctx)
		f.mu.Lock()
		delete(f.inflight, id)
		f.mu.Unlock()
	}
}

// errNoOwner is why an upstream's request is not relayed: no client, or
// more than one, has a request running on that upstream.
var errNoOwner = errors.New("the gateway cannot tell which MCP client this request belongs to")

// owner is the latest request running on up of the one client session
// that has requests running there.
func (g *Gateway) owner(up *upstream) (*inflight, error) {
	f := g.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	var latest *inflight
	sessions := 0
	seen := map[*mcp.ServerSession]bool{}
	for _, c := range f.inflight {
		if c.up != up || c.session == nil {
			continue
		}
		if !seen[c.session] {
			seen[c.session] = true
			sessions++
		}
		if latest == nil || c.seq > latest.seq {
			latest = c
		}
	}
	switch sessions {
	case 0:
		return nil, fmt.Errorf("%w: no client request is running on upstream %s", errNoOwner, up.name)
	case 1:
		return latest, nil
	}
	return nil, fmt.Errorf("%w: requests of %d MCP clients are running on upstream %s", errNoOwner, sessions, up.name)
}

// relayCtx is the context a message relayed for c is sent with: c's (so it
// goes on the stream of c's request), ended also when ctx (the upstream's
// request) ends.
func relayCtx(ctx context.Context, c *inflight) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(c.ctx)
	stop := context.AfterFunc(ctx, cancel)
	return out, func() { stop(); cancel() }
}

// clientOptions are the options of the gateway's client of up: it relays
// what up sends to the MCP clients. It declares sampling and (form)
// elicitation, which it relays, and no roots, which it cannot.
// Its progress and log handlers count each notification handled in o.
func (g *Gateway) clientOptions(up *upstream, o *order) *mcp.ClientOptions {
	return &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(ctx context.Context, req *mcp.ToolListChangedRequest) {
			if err := g.listTools(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream tools not refreshed", "upstream", up.name, "err", err)
			}
		},
		ResourceListChangedHandler: func(ctx context.Context, req *mcp.ResourceListChangedRequest) {
			if err := g.listPassThrough(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream resources not refreshed", "upstream", up.name, "err", err)
			}
		},
		PromptListChangedHandler: func(ctx context.Context, req *mcp.PromptListChangedRequest) {
			if err := g.listPassThrough(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream prompts not refreshed", "upstream", up.name, "err", err)
			}
		},
		ResourceUpdatedHandler: func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			// go-sdk sends it to the client sessions subscribed to the uri.
			if err := g.server.ResourceUpdated(ctx, req.Params); err != nil {
				g.opts.Logger.Warn("mcp resource update not relayed", "upstream", up.name, "err", err)
			}
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			defer o.handled()
			id, _ := req.Params.ProgressToken.(string)
			g.fwd.mu.Lock()
			c := g.fwd.inflight[id]
			g.fwd.mu.Unlock()
			if c == nil || c.token == nil || c.up != up {
				return // not a request of a client that asked for progress
			}
			p := *req.Params
			p.Meta, p.ProgressToken = nil, c.token
			if err := c.session.NotifyProgress(c.ctx, &p); err != nil {
				g.opts.Logger.Warn("mcp upstream progress not relayed", "upstream", up.name, "err", err)
			}
		},
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			defer o.handled()
			// ServerSession.Log drops what is below the client's level.
			if c, err := g.owner(up); err == nil {
				if err := c.session.Log(c.ctx, req.Params); err != nil {
					g.opts.Logger.Warn("mcp upstream log not relayed", "upstream", up.name, "err", err)
				}
				return
			}
			if ss := g.fwd.sessions(); len(ss) == 1 {
				// One client: no other client's data can reach it.
				_ = ss[0].Log(ctx, req.Params)
				return
			}
			g.opts.Logger.Debug("mcp upstream log not relayed: no single client it belongs to", "upstream", up.name)
		},
		CreateMessageHandler: func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			c, err := g.owner(up)
			if err != nil {
				g.opts.Logger.Warn("mcp sampling request refused", "upstream", up.name, "err", err)
				return nil, err
			}
			ctx, cancel := relayCtx(ctx, c)
			defer cancel()
			return c.session.CreateMessage(ctx, req.Params)
		},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c, err := g.owner(up)
			if err != nil {
				g.opts.Logger.Warn("mcp elicitation request refused", "upstream", up.name, "err", err)
				return nil, err
			}
			ctx, cancel := relayCtx(ctx, c)
			defer cancel()
			return c.session.Elicit(ctx, req.Params)
		},
	}
}

// passOn is the receiving middleware that makes the gateway's answers
// to initialize advertise what its upstreams offer, and passes a client's
// logging/setLevel on to the upstreams.
func (g *Gateway) passOn(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		switch r := res.(type) {
		case *mcp.InitializeResult:
			if r != nil && r.Capabilities != nil {
				out := *r
				out.Capabilities = g.capabilities(r.Capabilities)
				return &out, nil
			}
		}
		if method == "logging/setLevel" {
			if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok && p != nil {
				if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
					g.setLevel(ctx, ss, p.Level)
				}
			}
		}
		return res, err
	}
}

// capabilities are go-sdk's capabilities of the gateway's server with
// what no upstream offers taken out: completions, resource subscriptions
// and logging are advertised only when an upstream has them. The list
// changes of tools, resources and prompts are advertised: the gateway
// lists an upstream again when it says its list changed or restarts.
func (g *Gateway) capabilities(in *mcp.ServerCapabilities) *mcp.ServerCapabilities {
	caps := *in
	var completions, subscribe, logging bool
	for _, up := range g.upstreams {
		cs, err := up.current()
		if err != nil {
			continue
		}
		c := cs.InitializeResult().Capabilities
		if c == nil {
			continue
		}
		completions = completions || c.Completions != nil
		subscribe = subscribe || (c.Resources != nil && c.Resources.Subscribe)
		logging = logging || c.Logging != nil
	}
	if !completions {
		caps.Completions = nil
	}
	if caps.Resources != nil {
		r := *caps.Resources
		r.Subscribe = subscribe
		caps.Resources = &r
	}
	if !logging {
		caps.Logging = nil
	}
	return &caps
}

// levelOrder ranks MCP's logging levels, most verbose first.
var levelOrder = []mcp.LoggingLevel{"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}

// setLevel keeps ss's level (go-sdk filters what ss is sent by it) and
// passes the most verbose level of the connected clients on to every
// upstream that logs: they share one session per upstream.
func (g *Gateway) setLevel(ctx context.Context, ss *mcp.ServerSession, level mcp.LoggingLevel) {
	f := g.fwd
	live := f.sessions()
	f.mu.Lock()
	f.levels[ss] = level
	for s := range f.levels {
		if !slices.Contains(live, s) {
			delete(f.levels, s)
		}
	}
	most := level
	for _, l := range f.levels {
		if slices.Index(levelOrder, l) < slices.Index(levelOrder, most) {
			most = l
		}
	}
	f.level = most
	f.mu.Unlock()
	for _, up := range g.upstreams {
		g.passLevel(ctx, up, most)
	}
}

// passLevel sets level on up when it logs.
func (g *Gateway) passLevel(ctx context.Context, up *upstream, level mcp.LoggingLevel) {
	cs, err := up.current()
	if err != nil || level == "" {
		return
	}
	if c := cs.InitializeResult().Capabilities; c == nil || c.Logging == nil {
		return
	}
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level}); err != nil {
		g.opts.Logger.Warn("mcp logging level not passed on", "upstream", up.name, "err", err)
	}
}

// complete forwards completion/complete to the upstream of the prompt or
// resource it names. It runs nothing and reads no content, so it is not
// gated; the key must be allowed to get that prompt or read that resource
// (the pseudo-tools of reads.go).
func (g *Gateway) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := *req.Params
	ref := *p.Ref
	var up *upstream
	var op string
	switch ref.Type {
	case "ref/prompt":
		var name string
		up, name = g.promptOwner(ref.Name)
		ref.Name, op = name, PromptsGet
	case "ref/resource":
		up, op = g.resourceOwner(ref.URI), ResourcesRead
	}
	if up == nil {
		return nil, fmt.Errorf("no upstream offers %s %q", ref.Type, ref.Name+ref.URI)
	}
	if err := g.allowed(ctx, req.Extra, up, op); err != nil {
		return nil, err
	}
	cs, err := up.current()
	if err != nil {
		return nil, err
	}
	p.Ref = &ref
	meta, end := g.begin(ctx, up, req.Session, nil)
	defer end()
	p.Meta = meta
	return cs.Complete(ctx, &p)
}

// subscribe forwards resources/subscribe to the resource's upstream (the
// key must be allowed to read it); go-sdk then sends the client the
// upstream's updates of that uri (ResourceUpdatedHandler).
func (g *Gateway) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	up := g.resourceOwner(req.Params.URI)
	if up == nil {
		return fmt.Errorf("no upstream offers resource %q", req.Params.URI)
	}
	if err := g.allowed(ctx, req.Extra, up, ResourcesRead); err != nil {
		return err
	}
	cs, err := up.current()
	if err != nil {
		return err
	}
	meta, end := g.begin(ctx, up, req.Session, nil)
	defer end()
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{Meta: meta, URI: req.Params.URI}); err != nil {
		return err
	}
	live := g.fwd.sessions()
	g.fwd.mu.Lock()
	if g.fwd.subs[req.Params.URI] == nil {
		g.fwd.subs[req.Params.URI] = map[*mcp.ServerSession]*upstream{}
	}
	g.fwd.subs[req.Params.URI][req.Session] = up
	orphaned := g.fwd.pruneSubs(live)
	g.fwd.mu.Unlock()
	g.unsubscribeUpstream(ctx, orphaned)
	return nil
}

// pruneSubs forgets the subscriptions of client sessions that have ended
// (go-sdk tells no one when a session closes, so this runs on each
// subscribe and unsubscribe) and returns the uris no live session is
// subscribed to any more, with their upstream, for the caller to
// unsubscribe there. The caller holds f.mu.
func (f *forwarding) pruneSubs(live []*mcp.ServerSession) map[string]*upstream {
	var orphaned map[string]*upstream
	for uri, by := range f.subs {
		var up *upstream
		for s, u := range by {
			if !slices.Contains(live, s) {
				delete(by, s)
				up = u
			}
		}
		if len(by) == 0 {
			delete(f.subs, uri)
			if up != nil {
				if orphaned == nil {
					orphaned = map[string]*upstream{}
				}
				orphaned[uri] = up
			}
		}
	}
	return orphaned
}

// unsubscribeUpstream ends the upstream subscriptions of uris no client
// is subscribed to any more.
func (g *Gateway) unsubscribeUpstream(ctx context.Context, uris map[string]*upstream) {
	for uri, up := range uris {
		cs, err := up.current()
		if err != nil {
			continue // a restarted upstream has no subscription left
		}
		if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
			g.opts.Logger.Warn("mcp subscription of an ended session not ended upstream", "upstream", up.name, "uri", uri, "err", err)
		}
	}
}

// unsubscribe forgets the client's subscription and forwards
// resources/unsubscribe once no other client is subscribed to the uri
// (the upstream session is shared).
func (g *Gateway) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	uri := req.Params.URI
	live := g.fwd.sessions()
	g.fwd.mu.Lock()
	up := g.fwd.subs[uri][req.Session]
	delete(g.fwd.subs[uri], req.Session)
	others := 0
	for s := range g.fwd.subs[uri] {
		if slices.Contains(live, s) {
			others++
		}
	}
	if others == 0 {
		delete(g.fwd.subs, uri)
	}
	orphaned := g.fwd.pruneSubs(live)
	g.fwd.mu.Unlock()
	g.unsubscribeUpstream(ctx, orphaned)
	if up == nil || others > 0 {
		return nil
	}
	cs, err := up.current()
	if err != nil {
		return nil // a restarted upstream has no subscription left
	}
	meta, end := g.begin(ctx, up, req.Session, nil)
	defer end()
	return cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{Meta: meta, URI: uri})
}

// allowed tells whether the caller's key may ask for up's pseudo-tool op.
func (g *Gateway) allowed(ctx context.Context, extra *mcp.RequestExtra, up *upstream, op string) error {
	name := up.name + Separator + op
	k, err := g.opts.API(g.key(extra)).Self(ctx)
	if err != nil {
		return fmt.Errorf("countersign: the tools this key may use could not be read: %s", apiMessage(err))
	}
	if !k.Allows(name) {
		return fmt.Errorf("%w: this API key may not use %s", ErrRefused, name)
	}
	return nil
}

// promptOwner is the upstream of an exposed prompt name and its own name.
func (g *Gateway) promptOwner(exposed string) (*upstream, string) {
	g.fwd.mu.Lock()
	defer g.fwd.mu.Unlock()
	for up, l := range g.fwd.owners {
		if name, ok := l.prompts[exposed]; ok {
			return up, name
		}
	}
	return nil, ""
}

// resourceOwner is the upstream that listed uri, or a template matching
// it, or a uri template itself.
func (g *Gateway) resourceOwner(uri string) *upstream {
	g.fwd.mu.Lock()
	defer g.fwd.mu.Unlock()
	for up, l := range g.fwd.owners {
		if slices.Contains(l.resources, uri) || slices.Contains(l.templates, uri) {
			return up
		}
	}
	for up, l := range g.fwd.owners {
		for _, t := range l.templates {
			if templateMatch(t, uri) {
				return up
			}
		}
	}
	return nil
}

// templateVar is one {…} expression of a URI template (RFC 6570).
var templateVar = regexp.MustCompile(`\{[^}]*\}`)

// templateMatch tells whether uri is an expansion of template t (each
// expression matching anything).
func templateMatch(t, uri string) bool {
	parts := templateVar.Split(t, -1)
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	re, err := regexp.Compile("^" + strings.Join(parts, ".*") + "$")
	return err == nil && re.MatchString(uri)
}

// relist records what up lists now (after listPassThrough registered it)
// and returns what it listed before and no longer does.
func (g *Gateway) relist(up *upstream, now *listed) (gone *listed) {
	g.fwd.mu.Lock()
	old := g.fwd.owners[up]
	g.fwd.owners[up] = now
	g.fwd.mu.Unlock()
	gone = &listed{prompts: map[string]string{}}
	if old == nil {
		return gone
	}
	for _, u := range old.resources {
		if !slices.Contains(now.resources, u) {
			gone.resources = append(gone.resources, u)
		}
	}
	for _, t := range old.templates {
		if !slices.Contains(now.templates, t) {
			gone.templates = append(gone.templates, t)
		}
	}
	for n, name := range old.prompts {
		if _, ok := now.prompts[n]; !ok {
			gone.prompts[n] = name
		}
	}
	return gone
}

// callTool calls a tool upstream for the client call req. The client's
// _meta is not forwarded (it speaks for the client's own session:
// protocol version, its progress token) except as a progress token of the
// gateway's, when the client sent one: the upstream's progress reaches
// the client with the client's token.
func (g *Gateway) callTool(ctx context.Context, req *mcp.CallToolRequest, up *upstream, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	meta, end := g.begin(ctx, up, req.Session, req.Params.GetProgressToken())
	defer end()
	p.Meta = meta
	return up.call(ctx, p)
}
