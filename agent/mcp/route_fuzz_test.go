package mcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// FuzzRoute drives the gateway's routing state (forwarding: which link a
// client request runs on, its requests, subscriptions, session ends) with
// random interleavings of requests, answers, session ends and upstream
// messages across four client sessions and two upstreams, against a model
// of who caused what. Properties:
//   - a message other than progress goes to a session only when that
//     session is the only one that ever ran a request on the link it came
//     on (or, OneClient, the one client on a shared link), and with the
//     context of one of that session's own requests running there, if any;
//   - progress goes only to the running request whose token it carries, on
//     the link that request runs on;
//   - a resource update goes only to sessions subscribed through its link;
//   - where a message can be attributed exactly (a client's own open link,
//     a running request's token, OneClient) it is delivered, not refused;
//   - a link closed to make room had nothing running and no subscription.
func FuzzRoute(f *testing.F) {
	f.Add([]byte{0x06, 1, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3, 0, 4, 1, 0, 0, 2, 0, 1})
	f.Add([]byte{0x07, 2, 0, 1, 0, 0, 0, 4, 2, 0, 0, 2, 0, 2, 1, 0, 6, 0, 0, 2, 1, 0, 5, 1, 0, 3, 0, 0})
	f.Add([]byte{0x79, 0, 0, 0, 0, 0, 1, 0, 0, 2, 1, 2, 0, 1, 0, 3, 1, 2, 4, 2, 1, 5, 0, 1})
	f.Add([]byte{0x0e, 0, 0, 0, 4, 0, 1, 0, 4, 2, 1, 0, 4, 3, 0, 0, 3, 0, 6, 1, 0, 0, 1, 0, 2, 0, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) < 2 {
			return
		}
		newRouteModel(ops[0], ops[1]).run(t, ops[2:])
	})
}

// routeModel is the fuzzed forwarding and what the test knows of it.
type routeModel struct {
	f           *forwarding
	ups         [2]*upstream
	sessions    [4]*mcp.ServerSession
	sessionless [4]bool
	ended       [4]bool
	one         *mcp.ServerSession                      // OneClient: the first session admitted
	links       []*link                                 // every link a request ran on, the shared ones first
	causers     map[*link]map[*mcp.ServerSession]bool   // the sessions that ever ran a request on each link
	calls       []*modelCall                            // requests running
	done        []string                                // tokens of requests that have finished
	subs        map[string]map[*mcp.ServerSession]*link // uri → session → the link it subscribed through
}

type modelCall struct {
	id      string
	l       *link
	session *mcp.ServerSession
	ctx     context.Context
	token   any
}

type sessionKey struct{}

// newRouteModel reads the set-up from two bytes: flags (bit 0 OneClient;
// bits 1-2 whether each upstream can open a session per client; bits 3-6
// which sessions are sessionless) and the links per upstream (1-3).
func newRouteModel(flags, max byte) *routeModel {
	m := &routeModel{f: newForwarding(flags&1 != 0, 1+int(max%3)),
		causers: map[*link]map[*mcp.ServerSession]bool{}, subs: map[string]map[*mcp.ServerSession]*link{}}
	for i := range m.ups {
		spec := Upstream{Name: fmt.Sprintf("up%d", i), Transport: &mcp.InMemoryTransport{}}
		if flags&(2<<i) != 0 {
			spec = Upstream{Name: spec.Name, Command: []string{"server"}}
		}
		up := &upstream{name: spec.Name, spec: spec}
		up.shared = &link{up: up}
		m.ups[i] = up
		m.links = append(m.links, up.shared)
	}
	for i := range m.sessions {
		m.sessions[i] = new(mcp.ServerSession)
		m.sessionless[i] = flags&(8<<i) != 0
	}
	return m
}

func (m *routeModel) run(t *testing.T, ops []byte) {
	for len(ops) >= 3 {
		op, x, y := ops[0], int(ops[1]), int(ops[2])
		ops = ops[3:]
		switch op % 7 {
		case 0:
			m.request(t, x%4, y%2, y&4 != 0)
		case 1:
			m.finish(x)
		case 2:
			m.message(t, x, []string{msgLog, msgSampling, msgElicitation}[y%3])
		case 3:
			m.progress(t, x, y)
		case 4:
			m.subscribe(t, x%4, y%2, fmt.Sprintf("test://%d", y%3))
		case 5:
			m.update(t, x, fmt.Sprintf("test://%d", y%3))
		case 6:
			m.end(x % 4)
		}
	}
}

// admitted runs the admission of session i, checking it against the model.
func (m *routeModel) admitted(t *testing.T, i int) bool {
	ss := m.sessions[i]
	got := m.f.admit(ss)
	if m.f.oneClient && m.one == nil {
		m.one = ss
	}
	if want := !m.f.oneClient || m.one == ss; got != want {
		t.Fatalf("admit(session %d) = %v, want %v", i, got, want)
	}
	return got
}

// pick picks the link of a request of session i to upstream u, closing
// an evicted link as closeLink does, and checks the eviction.
func (m *routeModel) pick(t *testing.T, i, u int) *link {
	ss := m.sessions[i]
	l, fresh, evicted, err := m.f.pick(m.ups[u], ss, m.sessionless[i])
	if err != nil {
		if !errors.Is(err, errLinksFull) {
			t.Fatalf("pick: %v", err)
		}
		return nil
	}
	if evicted != nil {
		for _, c := range m.calls {
			if c.l == evicted {
				t.Fatalf("a link with a request running (%s) was closed to make room", c.id)
			}
		}
		for uri, by := range m.subs {
			for _, sl := range by {
				if sl == evicted {
					t.Fatalf("a link with a subscription to %s was closed to make room", uri)
				}
			}
		}
		m.f.mu.Lock()
		m.f.forget(evicted)
		m.f.mu.Unlock()
		m.dropSubs(evicted)
	}
	if fresh {
		close(l.ready)
		m.links = append(m.links, l)
	}
	if l.owner != nil && l.owner != ss {
		t.Fatalf("session %d's request picked a link of another session", i)
	}
	if m.causers[l] == nil {
		m.causers[l] = map[*mcp.ServerSession]bool{}
	}
	m.causers[l][ss] = true
	return l
}

func (m *routeModel) request(t *testing.T, i, u int, withToken bool) {
	if m.ended[i] || !m.admitted(t, i) {
		return
	}
	l := m.pick(t, i, u)
	if l == nil {
		return
	}
	ss := m.sessions[i]
	ctx := context.WithValue(context.Background(), sessionKey{}, len(m.calls)+len(m.done))
	var token any
	if withToken {
		token = fmt.Sprintf("client-token-%d", i)
	}
	id := m.f.start(ctx, l, ss, token)
	m.calls = append(m.calls, &modelCall{id: id, l: l, session: ss, ctx: ctx, token: token})
}

func (m *routeModel) finish(x int) {
	if len(m.calls) == 0 {
		return
	}
	c := m.calls[x%len(m.calls)]
	m.f.finish(c.id)
	m.f.release(c.l)
	m.calls = slices.DeleteFunc(m.calls, func(o *modelCall) bool { return o == c })
	m.done = append(m.done, c.id)
}

// exact tells whether every message on l can only have been caused by
// one session, and which.
func (m *routeModel) exact(l *link) *mcp.ServerSession {
	if l.owner == nil && m.f.oneClient {
		return m.one
	}
	var only *mcp.ServerSession
	for s := range m.causers[l] {
		if only != nil {
			return nil
		}
		only = s
	}
	if l.owner != nil && only != l.owner {
		return nil
	}
	return only
}

func (m *routeModel) index(ss *mcp.ServerSession) int { return slices.Index(m.sessions[:], ss) }

func (m *routeModel) message(t *testing.T, x int, method string) {
	l := m.links[x%len(m.links)]
	got, err := m.f.route(l, method, nil)
	cause := m.exact(l)
	open := l.owner == nil || !l.closed
	if err != nil {
		if cause != nil && open && l.owner != nil {
			t.Fatalf("%s on session %d's own open link refused: %v", method, m.index(cause), err)
		}
		if cause != nil && l.owner == nil && m.f.oneClient {
			t.Fatalf("%s on the one client's shared link refused: %v", method, err)
		}
		return
	}
	if cause == nil || got.session != cause {
		t.Fatalf("%s on a link whose requests came from sessions %v delivered to session %d", method, m.causerIndexes(l), m.index(got.session))
	}
	if l.owner != nil && (l.closed || m.ended[m.index(l.owner)]) {
		t.Fatalf("%s delivered on a closed link (session %d)", method, m.index(got.session))
	}
	if got.ctx != nil {
		if !slices.ContainsFunc(m.calls, func(c *modelCall) bool { return c.ctx == got.ctx && c.session == got.session && c.l == l }) {
			t.Fatalf("%s sent with the context of no request of session %d running on its link", method, m.index(got.session))
		}
	} else if slices.ContainsFunc(m.calls, func(c *modelCall) bool { return c.l == l && c.session == got.session }) {
		t.Fatalf("%s sent detached while a request of session %d runs on its link", method, m.index(got.session))
	}
}

func (m *routeModel) causerIndexes(l *link) []int {
	var out []int
	for s := range m.causers[l] {
		out = append(out, m.index(s))
	}
	slices.Sort(out)
	return out
}

func (m *routeModel) progress(t *testing.T, x, y int) {
	l := m.links[y%len(m.links)]
	var id string
	var call *modelCall
	switch {
	case x%3 == 0 && len(m.calls) > 0:
		call = m.calls[(x/3)%len(m.calls)]
		id = call.id
	case x%3 == 1 && len(m.done) > 0:
		id = m.done[(x/3)%len(m.done)]
	default:
		id = fmt.Sprintf("cs_forged%d", x)
	}
	got, err := m.f.route(l, msgProgress, id)
	exact := call != nil && call.l == l && call.token != nil
	if err != nil {
		if exact {
			t.Fatalf("progress of a running request (session %d) on its own link refused: %v", m.index(call.session), err)
		}
		return
	}
	if !exact {
		t.Fatalf("progress with token %q on a link it does not run on, or of no running request, delivered to session %d", id, m.index(got.session))
	}
	if got.session != call.session || got.ctx != call.ctx || got.token != call.token {
		t.Fatalf("progress of session %d's request delivered to session %d (token %v)", m.index(call.session), m.index(got.session), got.token)
	}
}

func (m *routeModel) subscribe(t *testing.T, i, u int, uri string) {
	if m.ended[i] || !m.admitted(t, i) {
		return
	}
	l := m.pick(t, i, u)
	if l == nil {
		return
	}
	ss := m.sessions[i]
	var live []*mcp.ServerSession
	for j, s := range m.sessions {
		if !m.ended[j] {
			live = append(live, s)
		}
	}
	m.f.subscribe(uri, ss, l, live)
	m.f.release(l)
	for _, by := range m.subs {
		for s := range by {
			if !slices.Contains(live, s) {
				delete(by, s) // pruneSubs forgets ended sessions
			}
		}
	}
	if m.subs[uri] == nil {
		m.subs[uri] = map[*mcp.ServerSession]*link{}
	}
	m.subs[uri][ss] = l
}

func (m *routeModel) update(t *testing.T, x int, uri string) {
	l := m.links[x%len(m.links)]
	got := m.f.subscribers(l, uri)
	for _, s := range got {
		if m.subs[uri][s] != l {
			t.Fatalf("an update of %s on a link session %d did not subscribe through delivered to it", uri, m.index(s))
		}
		if l.owner != nil && l.owner != s {
			t.Fatalf("an update on session %d's own link delivered to session %d", m.index(l.owner), m.index(s))
		}
	}
	for s, sl := range m.subs[uri] {
		if sl == l && !l.closed && !slices.Contains(got, s) {
			t.Fatalf("an update of %s on the link session %d subscribed through did not reach it", uri, m.index(s))
		}
	}
}

// end ends session i as closeLinksOf does.
func (m *routeModel) end(i int) {
	if m.ended[i] {
		return
	}
	m.ended[i] = true
	for _, l := range m.f.ended(m.sessions[i]) {
		m.dropSubs(l)
	}
}

// dropSubs forgets in the model the subscriptions through a closed link.
func (m *routeModel) dropSubs(l *link) {
	for _, by := range m.subs {
		for s, sl := range by {
			if sl == l {
				delete(by, s)
			}
		}
	}
}
