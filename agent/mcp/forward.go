package mcp

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: what the gateway forwards besides the gated calls, so that an
// MCP client sees its upstreams as they are: completion, resource
// subscriptions and their updates, logging both ways, the upstreams'
// progress, sampling and elicitation requests, and the list changes of
// resources and prompts. Each client request runs on a session of the
// gateway's with the upstream chosen in links.go; what the upstream sends
// on it goes where route.go decides.

// forwarding is the gateway's state for forwarding.
type forwarding struct {
	mu        sync.Mutex                              // guards the fields below
	seq       uint64                                  // orders inflight entries and link uses
	inflight  map[string]*inflight                    // upstream progress token → a client request running upstream
	links     map[linkKey]*link                       // each client session's own links (links.go)
	watched   map[*mcp.ServerSession]bool             // client sessions whose end closes their links
	levels    map[*mcp.ServerSession]mcp.LoggingLevel // each client session's logging/setLevel
	subs      map[string]map[*mcp.ServerSession]*link // uri → the client sessions subscribed to it, and the link they subscribed through
	owners    map[*upstream]*listed                   // what each upstream listed, for routing by name or uri
	oneClient bool                                    // Options.OneClient
	one       *mcp.ServerSession                      // OneClient: the client session served, once it has sent a request
	max       int                                     // Options.MaxClientLinks
	closing   bool                                    // Close has begun: no new client link
	sessions  func() []*mcp.ServerSession             // the connected client sessions

	updateMu sync.Mutex                           // serialises relayed resource updates (relayUpdate)
	updateTo atomic.Pointer[[]*mcp.ServerSession] // while set, the only sessions a resources/updated notification may go to
}

// listed is what one upstream listed besides tools.
type listed struct {
	resources []string          // uris
	templates []string          // uri templates
	prompts   map[string]string // exposed name → the upstream's name
}

// inflight is one client request the gateway runs upstream.
type inflight struct {
	link    *link
	ctx     context.Context // the client request's: sent with it, a message goes on that request's stream
	session *mcp.ServerSession
	token   any // the client's progress token, nil when it sent none
	seq     uint64
}

func newForwarding(oneClient bool, max int) *forwarding {
	return &forwarding{inflight: map[string]*inflight{}, links: map[linkKey]*link{}, watched: map[*mcp.ServerSession]bool{},
		levels: map[*mcp.ServerSession]mcp.LoggingLevel{}, subs: map[string]map[*mcp.ServerSession]*link{},
		owners: map[*upstream]*listed{}, oneClient: oneClient, max: max}
}

// begin records a client request of session about to run on l (o is l's
// session's notification count) and returns the _meta to send upstream
// with it (a progress token of the gateway's, when the client sent one)
// and the function that forgets it once it has run, after the upstream's
// notifications that came before its answer are relayed (order.go).
func (g *Gateway) begin(ctx context.Context, l *link, o *order, session *mcp.ServerSession, token any) (mcp.Meta, func()) {
	id := g.fwd.start(ctx, l, session, token)
	var meta mcp.Meta
	if token != nil {
		meta = mcp.Meta{"progressToken": id}
	}
	return meta, func() {
		o.settle(ctx)
		g.fwd.finish(id)
	}
}

// start records a client request of session (ctx is its context, token
// its progress token or nil) running on l, under a new progress token of
// the gateway's, which it returns.
func (f *forwarding) start(ctx context.Context, l *link, session *mcp.ServerSession, token any) string {
	id := "cs_" + strings.ToLower(rand.Text()[:16])
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.inflight[id] = &inflight{link: l, ctx: ctx, session: session, token: token, seq: f.seq}
	return id
}

// finish forgets the request start recorded under id.
func (f *forwarding) finish(id string) {
	f.mu.Lock()
	delete(f.inflight, id)
	f.mu.Unlock()
}

// relayCtx is the context a message relayed on a client request's stream
// is sent with: that request's (reqCtx), ended also when ctx (the
// upstream's request) ends.
func relayCtx(ctx, reqCtx context.Context) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(reqCtx)
	stop := context.AfterFunc(ctx, cancel)
	return out, func() { stop(); cancel() }
}

// clientOptions are the options of the gateway's client on link l: it
// relays what the upstream sends to the client route names. It declares
// sampling and (form) elicitation when sample and elicit say (what l's
// client declared to the gateway), and no roots, which it cannot relay.
// Its progress and log handlers count each notification handled in o.
// Only the shared link lists: the lists are the gateway's, one per
// upstream.
func (g *Gateway) clientOptions(l *link, o *order, sample, elicit bool) *mcp.ClientOptions {
	up := l.up
	opts := &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			g.relayUpdate(ctx, l, req.Params)
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			defer o.handled()
			t, err := g.fwd.route(l, msgProgress, req.Params.ProgressToken)
			if err != nil {
				return // not a request of a client that asked for progress
			}
			p := *req.Params
			p.Meta, p.ProgressToken = nil, t.token
			if err := t.session.NotifyProgress(t.ctx, &p); err != nil {
				g.opts.Logger.Warn("mcp upstream progress not relayed", "upstream", up.name, "err", err)
			}
		},
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			defer o.handled()
			t, err := g.fwd.route(l, msgLog, nil)
			if err != nil {
				g.opts.Logger.Debug("mcp upstream log not relayed", "upstream", up.name, "err", err)
				return
			}
			// ServerSession.Log drops what is below the client's level.
			if err := t.session.Log(cmp.Or(t.ctx, ctx), req.Params); err != nil {
				g.opts.Logger.Warn("mcp upstream log not relayed", "upstream", up.name, "err", err)
			}
		},
	}
	if l.owner == nil {
		opts.ToolListChangedHandler = func(ctx context.Context, req *mcp.ToolListChangedRequest) {
			if err := g.listTools(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream tools not refreshed", "upstream", up.name, "err", err)
			}
		}
		opts.ResourceListChangedHandler = func(ctx context.Context, req *mcp.ResourceListChangedRequest) {
			if err := g.listPassThrough(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream resources not refreshed", "upstream", up.name, "err", err)
			}
		}
		opts.PromptListChangedHandler = func(ctx context.Context, req *mcp.PromptListChangedRequest) {
			if err := g.listPassThrough(ctx, up, req.Session); err != nil {
				g.opts.Logger.Error("mcp upstream prompts not refreshed", "upstream", up.name, "err", err)
			}
		}
	}
	if sample {
		opts.CreateMessageHandler = func(ctx context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			t, err := g.fwd.route(l, msgSampling, nil)
			if err != nil {
				g.opts.Logger.Warn("mcp sampling request refused", "upstream", up.name, "err", err)
				return nil, err
			}
			if t.ctx != nil {
				var cancel context.CancelFunc
				ctx, cancel = relayCtx(ctx, t.ctx)
				defer cancel()
			}
			return t.session.CreateMessage(ctx, req.Params)
		}
	}
	if elicit {
		opts.ElicitationHandler = func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			t, err := g.fwd.route(l, msgElicitation, nil)
			if err != nil {
				g.opts.Logger.Warn("mcp elicitation request refused", "upstream", up.name, "err", err)
				return nil, err
			}
			if t.ctx != nil {
				var cancel context.CancelFunc
				ctx, cancel = relayCtx(ctx, t.ctx)
				defer cancel()
			}
			return t.session.Elicit(ctx, req.Params)
		}
	}
	return opts
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

// setLevel keeps ss's level (go-sdk filters what ss is sent by it) and
// passes it on to the upstreams that log, on ss's own links (a link
// connected later gets it as it connects) or, on a OneClient gateway, on
// the shared ones, which are that client's.
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
	var ls []*link
	for k, l := range f.links {
		if k.owner == ss {
			ls = append(ls, l)
		}
	}
	shared := f.oneClient && f.one == ss
	f.mu.Unlock()
	if shared {
		for _, up := range g.upstreams {
			ls = append(ls, up.shared)
		}
	}
	for _, l := range ls {
		if l.owner != nil {
			select {
			case <-l.ready:
			default:
				continue // connecting: dialLink passes the level
			}
		}
		if cs, _, err := l.session(ctx); err == nil {
			g.passLevel(ctx, l.up.name, cs, level)
		}
	}
}

// sharedLevel is the level for the shared links: the one client's on a
// OneClient gateway, else none (what is logged on a shared link of several
// clients reaches none of them).
func (f *forwarding) sharedLevel() mcp.LoggingLevel {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.oneClient || f.one == nil {
		return ""
	}
	return f.levels[f.one]
}

// passLevel sets level on the upstream session cs when its server logs.
func (g *Gateway) passLevel(ctx context.Context, upstream string, cs *mcp.ClientSession, level mcp.LoggingLevel) {
	if c := cs.InitializeResult().Capabilities; c == nil || c.Logging == nil {
		return
	}
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level}); err != nil {
		g.opts.Logger.Warn("mcp logging level not passed on", "upstream", upstream, "err", err)
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
	l, cs, o, release, err := g.use(ctx, up, req.Session, req.Extra)
	if err != nil {
		g.opts.Logger.Warn("mcp completion not forwarded: no upstream session", "upstream", up.name, "err", err)
		return nil, err
	}
	defer release()
	p.Ref = &ref
	meta, end := g.begin(ctx, l, o, req.Session, nil)
	defer end()
	p.Meta = meta
	return cs.Complete(ctx, &p)
}

// subscribe forwards resources/subscribe to the resource's upstream (the
// key must be allowed to read it) on the client's link; the upstream's
// updates of that uri on that link then reach the client (relayUpdate).
func (g *Gateway) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	up := g.resourceOwner(req.Params.URI)
	if up == nil {
		return fmt.Errorf("no upstream offers resource %q", req.Params.URI)
	}
	if err := g.allowed(ctx, req.Extra, up, ResourcesRead); err != nil {
		return err
	}
	l, cs, o, release, err := g.use(ctx, up, req.Session, req.Extra)
	if err != nil {
		g.opts.Logger.Warn("mcp subscription not forwarded: no upstream session", "upstream", up.name, "uri", req.Params.URI, "err", err)
		return err
	}
	defer release()
	meta, end := g.begin(ctx, l, o, req.Session, nil)
	err = cs.Subscribe(ctx, &mcp.SubscribeParams{Meta: meta, URI: req.Params.URI})
	end()
	if err != nil {
		return err
	}
	g.unsubscribeUpstream(ctx, g.fwd.subscribe(req.Params.URI, req.Session, l, g.fwd.sessions()))
	return nil
}

// subscribe records that session subscribed to uri through l (unless l
// has closed meanwhile) and forgets the subscriptions of sessions not in
// live, returning those to end upstream (pruneSubs).
func (f *forwarding) subscribe(uri string, session *mcp.ServerSession, l *link, live []*mcp.ServerSession) map[string]*link {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !l.closed {
		if f.subs[uri] == nil {
			f.subs[uri] = map[*mcp.ServerSession]*link{}
		}
		f.subs[uri][session] = l
	}
	return f.pruneSubs(live)
}

// pruneSubs forgets the subscriptions of client sessions that have ended
// (go-sdk tells no one when a session closes, and a session on a shared
// link is not watched, so this runs on each subscribe and unsubscribe)
// and returns the uris no live session is subscribed to any more through
// a link still open, with that link, for the caller to unsubscribe there.
// The caller holds f.mu.
func (f *forwarding) pruneSubs(live []*mcp.ServerSession) map[string]*link {
	var orphaned map[string]*link
	for uri, by := range f.subs {
		gone := map[*link]bool{}
		for s, l := range by {
			if !slices.Contains(live, s) {
				delete(by, s)
				gone[l] = true
			}
		}
		for _, l := range by {
			delete(gone, l) // still subscribed through l by a live session
		}
		if len(by) == 0 {
			delete(f.subs, uri)
		}
		for l := range gone {
			if !l.closed {
				if orphaned == nil {
					orphaned = map[string]*link{}
				}
				orphaned[uri] = l
			}
		}
	}
	return orphaned
}

// unsubscribeUpstream ends the upstream subscriptions of uris no client
// is subscribed to any more through their link.
func (g *Gateway) unsubscribeUpstream(ctx context.Context, uris map[string]*link) {
	for uri, l := range uris {
		cs, _, err := l.session(ctx)
		if err != nil {
			continue // a restarted upstream has no subscription left
		}
		if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
			g.opts.Logger.Warn("mcp subscription of an ended session not ended upstream", "upstream", l.up.name, "uri", uri, "err", err)
		}
	}
}

// unsubscribe forgets the client's subscription and forwards
// resources/unsubscribe on the link it subscribed through, once no other
// client is subscribed to the uri through it (a shared link).
func (g *Gateway) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	uri := req.Params.URI
	live := g.fwd.sessions()
	f := g.fwd
	f.mu.Lock()
	l := f.subs[uri][req.Session]
	delete(f.subs[uri], req.Session)
	others := 0
	for s, sl := range f.subs[uri] {
		if sl == l && slices.Contains(live, s) {
			others++
		}
	}
	if len(f.subs[uri]) == 0 {
		delete(f.subs, uri)
	}
	orphaned := f.pruneSubs(live)
	open := l != nil && !l.closed
	if open {
		l.busy++ // not closed to make room while unsubscribing
	}
	f.mu.Unlock()
	g.unsubscribeUpstream(ctx, orphaned)
	if !open {
		return nil
	}
	defer f.release(l)
	if others > 0 {
		return nil
	}
	cs, o, err := l.session(ctx)
	if err != nil {
		return nil // a restarted upstream has no subscription left
	}
	meta, end := g.begin(ctx, l, o, req.Session, nil)
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

// callTool calls a tool upstream, on link l's session cs, for the client
// call req. The client's _meta is not forwarded (it speaks for the
// client's own session: protocol version, its progress token) except as a
// progress token of the gateway's, when the client sent one: the
// upstream's progress reaches the client with the client's token.
func (g *Gateway) callTool(ctx context.Context, req *mcp.CallToolRequest, l *link, cs *mcp.ClientSession, o *order, p *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	meta, end := g.begin(ctx, l, o, req.Session, req.Params.GetProgressToken())
	defer end()
	p.Meta = meta
	return cs.CallTool(ctx, p)
}
