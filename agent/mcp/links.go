package mcp

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: which of the gateway's sessions with an upstream (a link) a
// client request runs on, so that whatever the upstream sends on that
// session reaches only the client whose session it is.
//
// Why a session per client. go-sdk's client hands the gateway an
// upstream's sampling or elicitation request, or a log message, with
// nothing that names the client request it relates to; over stdio nothing
// on the wire does, and an upstream may send it after the call's answer.
// On a session shared by several clients, any rule picking one of them
// ("the one whose calls are running") is a guess: it sent client A's
// sampling request, made after A's call was answered, to client B, whose
// call was running. So the gateway gives each client session its own
// session with every upstream it uses, opened on its first request there
// (a new process for a command upstream, a new MCP session for a URL);
// everything that session brings goes to that client, by construction.
// The gateway's shared session with each upstream (its listing session,
// started by New) carries the requests of clients that have no session of
// their own: sessionless (2026-07-28) HTTP clients, and every client of an
// upstream given as one Transport. Of what an upstream sends there only
// progress (matched exactly by a token of the gateway's, one per client
// request) and resource updates (to the clients subscribed to the uri
// through it) are relayed; sampling and elicitation are not declared on it
// and refused, log messages are dropped. Over stdio (Options.OneClient)
// the gateway serves one client for its whole life: the shared sessions
// are that client's own, and a second client session is refused.
// route.go makes each routing decision.

// MaxClientLinks is how many sessions the gateway keeps open with one
// upstream for its clients, by default. When a client session needs one
// more, the least recently used one with nothing running on it (no
// request, no subscription) is closed; when every one is busy, the request
// is refused (an error naming the limit).
const MaxClientLinks = 32

// errOneClient is why a second client session of a OneClient gateway is
// refused.
var errOneClient = errors.New("this gateway serves one MCP client (countersign mcp over stdio)")

// errLinksFull is why a client session gets no session of its own with an
// upstream: MaxClientLinks are open and busy.
var errLinksFull = errors.New("too many MCP client sessions use this upstream at once")

// link is one of the gateway's MCP sessions with an upstream and the client
// session whose traffic it carries: owner, or, for the upstream's shared
// link (owner nil), the clients with no link of their own.
type link struct {
	up    *upstream
	owner *mcp.ServerSession // nil: the upstream's shared link (its session is up.session)

	// A client link's session, set once by its first user (dialLink).
	ready chan struct{}      // closed once cs and proc, or err, are set
	cs    *mcp.ClientSession // under forwarding.mu until ready is closed
	proc  *exec.Cmd
	order *order
	err   error

	// Under forwarding.mu.
	busy   int    // requests reserved on it (use) and not yet released
	used   uint64 // forwarding.seq at its last reservation: the least recently used closes first
	closed bool   // forgotten: it takes no new request and its session is closing
	shut   bool   // its session was closed (closeLink)
}

// linkKey names a client link.
type linkKey struct {
	up    *upstream
	owner *mcp.ServerSession
}

// session is the link's upstream session and its notification count,
// once connected; an error wrapping ErrUnavailable otherwise.
func (l *link) session(ctx context.Context) (*mcp.ClientSession, *order, error) {
	if l.owner == nil {
		l.up.mu.Lock()
		defer l.up.mu.Unlock()
		if l.up.session == nil {
			return nil, nil, fmt.Errorf("mcp upstream %s: %w", l.up.name, ErrUnavailable)
		}
		return l.up.session, l.up.order, nil
	}
	select {
	case <-l.ready:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	if l.err != nil {
		return nil, nil, l.err
	}
	return l.cs, l.order, nil
}

// pick is the link a request of session to up runs on, reserved until
// release (it is not closed to make room meanwhile): session's own link
// (fresh when the caller must connect it: dialLink), or the shared link
// for a OneClient gateway, a sessionless client, or an upstream the
// gateway cannot open more sessions with. evicted, when set, is an idle
// link the caller closes (closeLink) to make room.
func (f *forwarding) pick(up *upstream, session *mcp.ServerSession, sessionless bool) (l *link, fresh bool, evicted *link, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	if f.oneClient || sessionless || session == nil || !up.spec.dials() {
		l = up.shared
		l.busy++
		return l, false, nil, nil
	}
	if f.closing {
		return nil, false, nil, fmt.Errorf("mcp upstream %s: the gateway closed", up.name)
	}
	key := linkKey{up, session}
	if l = f.links[key]; l != nil {
		l.busy++
		l.used = f.seq
		return l, false, nil, nil
	}
	n := 0
	for k, c := range f.links {
		if k.up != up {
			continue
		}
		n++
		if c.busy == 0 && !f.subscribed(c) && (evicted == nil || c.used < evicted.used) {
			evicted = c
		}
	}
	if n >= f.max {
		if evicted == nil {
			return nil, false, nil, fmt.Errorf("mcp upstream %s: %w (%d, each running a request or holding a subscription)", up.name, errLinksFull, n)
		}
		f.forget(evicted)
	} else {
		evicted = nil
	}
	l = &link{up: up, owner: session, ready: make(chan struct{}), busy: 1, used: f.seq}
	f.links[key] = l
	return l, true, evicted, nil
}

// subscribed tells whether a client holds a subscription through l. The
// caller holds f.mu.
func (f *forwarding) subscribed(l *link) bool {
	for _, by := range f.subs {
		for _, sl := range by {
			if sl == l {
				return true
			}
		}
	}
	return false
}

// forget marks l closed and drops it and its subscriptions from the
// gateway's records. The caller holds f.mu and closes l's session.
func (f *forwarding) forget(l *link) {
	l.closed = true
	if f.links[linkKey{l.up, l.owner}] == l {
		delete(f.links, linkKey{l.up, l.owner})
	}
	for uri, by := range f.subs {
		for s, sl := range by {
			if sl == l {
				delete(by, s)
			}
		}
		if len(by) == 0 {
			delete(f.subs, uri)
		}
	}
}

// release ends a reservation of pick.
func (f *forwarding) release(l *link) {
	f.mu.Lock()
	l.busy--
	f.mu.Unlock()
}

// use returns the link and upstream session a request of session (extra
// is its HTTP request's) runs on, and the function that releases the
// link once the request is done. A client link is connected by its first
// user; the others wait for it. The caller logs a failure (with its
// request).
func (g *Gateway) use(ctx context.Context, up *upstream, session *mcp.ServerSession, extra *mcp.RequestExtra) (*link, *mcp.ClientSession, *order, func(), error) {
	l, fresh, evicted, err := g.fwd.pick(up, session, g.sessionless(extra))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if evicted != nil {
		g.closeLink(evicted)
	}
	release := func() { g.fwd.release(l) }
	if fresh {
		g.dialLink(l)
	}
	cs, o, err := l.session(ctx)
	if err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	return l, cs, o, release, nil
}

// dialLink connects the client link l, within ConnectTimeout: a session
// that declares to the upstream what l's owner declared to the gateway
// of sampling and elicitation, at the owner's logging level. Once
// connected, l closes when its owner's session ends or its own does.
//
// It takes no context: the link outlives the request that opens it, and
// it must carry neither that request's cancellation (other requests of
// the owner wait for this connection) nor its values: the session's
// handlers run in contexts derived from the one it connects with, and
// go-sdk would send every message relayed from them on the stream of the
// client request whose id such a value carries (closed once answered).
func (g *Gateway) dialLink(l *link) {
	up := l.up
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.ConnectTimeout)
	defer cancel()
	var sample, elicit bool
	if p := l.owner.InitializeParams(); p != nil && p.Capabilities != nil {
		sample, elicit = p.Capabilities.Sampling != nil, p.Capabilities.Elicitation != nil
	}
	o := newOrder()
	var cs *mcp.ClientSession
	t, proc, err := dial(ctx, up.spec, o)
	if err == nil {
		c := mcp.NewClient(&mcp.Implementation{Name: "countersign-gateway", Version: g.opts.Version}, g.clientOptions(l, o, sample, elicit))
		cs, err = c.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: UpstreamRevision})
		if err != nil {
			err = fmt.Errorf("mcp upstream %s: connect: %w", up.name, err)
		}
	}
	f := g.fwd
	f.mu.Lock()
	switch {
	case err != nil:
		l.err = err
		f.forget(l)
	case l.closed || f.closing:
		l.err = fmt.Errorf("mcp upstream %s: the client session ended", up.name)
	default:
		l.cs, l.proc, l.order = cs, proc, o
		g.watchers.Go(func() { // exits when l's upstream session ends
			_ = cs.Wait()
			g.closeLink(l)
		})
		if !f.watched[l.owner] {
			f.watched[l.owner] = true
			owner := l.owner
			g.watchers.Go(func() { // exits when owner's session ends
				_ = owner.Wait()
				g.closeLinksOf(owner)
			})
		}
	}
	level := f.levels[l.owner]
	f.mu.Unlock()
	close(l.ready)
	if err != nil {
		g.opts.Logger.Error("mcp client link not connected", "upstream", up.name, "err", err)
		if proc != nil {
			reap(proc)
		}
		return
	}
	if l.err != nil { // closed while connecting
		_ = cs.Close()
		if proc != nil {
			reap(proc)
		}
		return
	}
	if level != "" {
		g.passLevel(ctx, up.name, cs, level)
	}
}

// closeLink closes the client link l (once) and its upstream session: a
// command upstream's process ends.
func (g *Gateway) closeLink(l *link) {
	f := g.fwd
	f.mu.Lock()
	f.forget(l)
	cs, proc := l.cs, l.proc
	if l.shut || cs == nil { // a link still connecting is closed by dialLink
		f.mu.Unlock()
		return
	}
	l.shut = true
	f.mu.Unlock()
	_ = cs.Close()
	if proc != nil {
		reap(proc)
	}
}

// closeLinksOf closes the links of a client session that has ended.
func (g *Gateway) closeLinksOf(owner *mcp.ServerSession) {
	for _, l := range g.fwd.ended(owner) {
		g.closeLink(l)
	}
}

// ended forgets a client session that has ended: its logging level, and
// its links, which it returns for the caller to close.
func (f *forwarding) ended(owner *mcp.ServerSession) []*link {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ls []*link
	for k, l := range f.links {
		if k.owner == owner {
			ls = append(ls, l)
			f.forget(l)
		}
	}
	delete(f.watched, owner)
	delete(f.levels, owner)
	return ls
}

// closeLinks closes every client link for good (Close).
func (g *Gateway) closeLinks() {
	f := g.fwd
	f.mu.Lock()
	f.closing = true
	ls := make([]*link, 0, len(f.links))
	for _, l := range f.links {
		ls = append(ls, l)
	}
	f.mu.Unlock()
	for _, l := range ls {
		g.closeLink(l)
	}
}

// admit is the receiving middleware that, on a OneClient gateway, refuses
// every client session but the first.
func (g *Gateway) admit(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && !g.fwd.admit(ss) {
			return nil, errOneClient
		}
		return next(ctx, method, req)
	}
}

// admit tells whether ss may be served: always, unless the gateway serves
// one client and ss is not the first session it saw.
func (f *forwarding) admit(ss *mcp.ServerSession) bool {
	if !f.oneClient {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.one == nil {
		f.one = ss
	}
	return f.one == ss
}
