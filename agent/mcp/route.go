package mcp

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: where a message an upstream sends on one of the gateway's
// sessions with it goes (links.go says why each client has its own). The
// one decision, for every kind of message that may carry a client's data.

// The methods of the messages route decides for.
const (
	msgProgress    = "notifications/progress"
	msgLog         = "notifications/message"
	msgSampling    = "sampling/createMessage"
	msgElicitation = "elicitation/create"
	msgUpdated     = "notifications/resources/updated"
)

// errNoOwner is why an upstream's message is not relayed: it came on a
// session that is no single client's, and it cannot be tied to one client
// request exactly.
var errNoOwner = errors.New("the gateway cannot tell which MCP client this message belongs to")

// target is where one upstream message goes: a client session, the
// context to send it with (that of one of the session's own requests
// running on the link, so it travels on that request's stream; nil when
// none runs), and for progress the client's own token.
type target struct {
	session *mcp.ServerSession
	ctx     context.Context
	token   any
}

// route is where a message of method (msgProgress, msgLog, msgSampling,
// msgElicitation) that the upstream sent on l goes, or errNoOwner:
//   - progress goes to the client request whose token (one of the
//     gateway's, one per request) it carries, if that request runs on l;
//   - anything else goes to l's client: its owner, or, on a OneClient
//     gateway, the one client; on a shared link of several clients it goes
//     nowhere.
func (f *forwarding) route(l *link, method string, token any) (target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if method == msgProgress {
		id, _ := token.(string)
		c := f.inflight[id]
		if c == nil || c.link != l || c.token == nil || (l.owner != nil && c.session != l.owner) {
			return target{}, fmt.Errorf("%w: progress of no client request running on upstream %s", errNoOwner, l.up.name)
		}
		return target{session: c.session, ctx: c.ctx, token: c.token}, nil
	}
	owner := l.owner
	if owner == nil && f.oneClient {
		owner = f.one
	}
	if owner == nil {
		return target{}, fmt.Errorf("%w: upstream %s's session is shared by MCP clients", errNoOwner, l.up.name)
	}
	if l.closed {
		return target{}, fmt.Errorf("%w: the client session of upstream %s's session has ended", errNoOwner, l.up.name)
	}
	t := target{session: owner}
	var latest *inflight
	for _, c := range f.inflight {
		if c.link == l && c.session == owner && (latest == nil || c.seq > latest.seq) {
			latest = c
		}
	}
	if latest != nil {
		t.ctx = latest.ctx
	}
	return t, nil
}

// subscribers are the client sessions a resource update of uri that the
// upstream sent on l goes to: those subscribed to uri through l.
func (f *forwarding) subscribers(l *link, uri string) []*mcp.ServerSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*mcp.ServerSession
	for s, sl := range f.subs[uri] {
		if sl == l && !l.closed {
			out = append(out, s)
		}
	}
	return out
}

// relayUpdate sends an upstream's resource update, which came on l, to the
// clients route's rule allows (subscribers). go-sdk sends an update to
// every session subscribed to the uri, so the sending middleware
// updatesOnlyTo holds back the others; updates are relayed one at a time.
func (g *Gateway) relayUpdate(ctx context.Context, l *link, p *mcp.ResourceUpdatedNotificationParams) {
	to := g.fwd.subscribers(l, p.URI)
	if len(to) == 0 {
		return
	}
	f := g.fwd
	f.updateMu.Lock()
	defer f.updateMu.Unlock()
	f.updateTo.Store(&to)
	defer f.updateTo.Store(nil)
	if err := g.server.ResourceUpdated(ctx, p); err != nil {
		g.opts.Logger.Warn("mcp resource update not relayed", "upstream", l.up.name, "err", err)
	}
}

// updatesOnlyTo is the sending middleware that lets a resources/updated
// notification reach only the sessions relayUpdate is sending it to.
func (g *Gateway) updatesOnlyTo(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == msgUpdated {
			to := g.fwd.updateTo.Load()
			ss, _ := req.GetSession().(*mcp.ServerSession)
			if to == nil || ss == nil || !slices.Contains(*to, ss) {
				return nil, nil
			}
		}
		return next(ctx, method, req)
	}
}

// sessionlessHeader marks, from revisionHandlers to the handlers, a
// request served by the stateless handler: its client (2026-07-28 over
// HTTP) has no session beyond the request.
const sessionlessHeader = "X-Countersign-Mcp-Sessionless"

// sessionless tells whether the request extra came with has no client
// session beyond itself.
func (g *Gateway) sessionless(extra *mcp.RequestExtra) bool {
	return extra != nil && extra.Header != nil && extra.Header.Get(sessionlessHeader) != ""
}
