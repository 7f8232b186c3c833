package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: starting the upstreams, keeping each one up (retried with
// backoff while it is down) and answering for one that is down.

// Defaults for starting upstreams.
const (
	// DefaultConnectTimeout bounds one attempt to start an upstream.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultRetryMin is the first wait before an upstream that failed to
	// start is tried again; each failure doubles it, up to DefaultRetryMax.
	DefaultRetryMin = time.Second
	// DefaultRetryMax is the longest wait between two attempts.
	DefaultRetryMax = time.Minute
)

// ErrUnavailable is why a call to a tool of an upstream that is not
// running (it failed to start, or stopped, and is being tried again) is
// refused: nothing was run.
var ErrUnavailable = errors.New("upstream unavailable")

// upstream is one upstream and its session while it is up. Tool handlers
// hold the upstream, not a session, so a restarted upstream serves the
// tools already listed.
type upstream struct {
	name   string
	spec   Upstream
	shared *link // the gateway's own session with it (links.go), fixed by start

	mu      sync.Mutex         // guards session, proc, order, down and closed
	session *mcp.ClientSession // the shared session; nil while the upstream is unavailable
	proc    *exec.Cmd          // a command upstream's process of session (nil otherwise)
	order   *order             // session's notification count (order.go)
	down    error              // why it is unavailable (nil while up)
	closed  bool               // the gateway closed: no new session
}

// current is the upstream's session, or an error wrapping ErrUnavailable.
func (up *upstream) current() (*mcp.ClientSession, error) {
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.session == nil {
		return nil, fmt.Errorf("mcp upstream %s: %w", up.name, ErrUnavailable)
	}
	return up.session, nil
}

// set makes cs (and proc, its process when a command; o, its
// notification count) the upstream's shared session; false when the
// gateway has closed meanwhile (the caller closes cs).
func (up *upstream) set(cs *mcp.ClientSession, proc *exec.Cmd, o *order) bool {
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.closed {
		return false
	}
	up.session, up.proc, up.order, up.down = cs, proc, o, nil
	return true
}

// fail marks the upstream unavailable for err.
func (up *upstream) fail(err error) {
	up.mu.Lock()
	defer up.mu.Unlock()
	up.session, up.down = nil, err
}

// close ends the upstream's session for good, and kills what is left of
// a command upstream's process group.
func (up *upstream) close() error {
	up.mu.Lock()
	cs, proc := up.session, up.proc
	up.session, up.proc, up.closed = nil, nil, true
	up.mu.Unlock()
	if cs == nil {
		return nil
	}
	err := cs.Close() // closes its stdin, then signals it (go-sdk)
	if proc != nil {
		reap(proc)
	}
	return err
}

// Unavailable names each upstream that is not running, with why (its last
// failure to start); empty when every upstream is up. For logs, readiness
// detail and metrics.
func (g *Gateway) Unavailable() map[string]error {
	out := map[string]error{}
	for _, up := range g.upstreams {
		up.mu.Lock()
		if up.session == nil && !up.closed {
			out[up.name] = cmp.Or(up.down, ErrUnavailable)
		}
		up.mu.Unlock()
	}
	return out
}

// start makes the first attempt at every upstream, at once, and leaves a
// supervisor per upstream that tries a failed one again and restarts one
// that stops. The supervisors exit when Close calls g.stop.
func (g *Gateway) start(ctx context.Context) {
	ctx, g.stop = context.WithCancel(context.WithoutCancel(ctx))
	var first sync.WaitGroup
	for _, u := range g.opts.Upstreams {
		up := &upstream{name: u.Name, spec: u}
		up.shared = &link{up: up}
		g.upstreams = append(g.upstreams, up)
		first.Go(func() {
			if err := g.connect(ctx, up); err != nil {
				up.fail(err)
				g.opts.Logger.Error("mcp upstream unavailable; retrying", "upstream", up.name, "err", err)
			}
		})
	}
	first.Wait()
	for _, up := range g.upstreams {
		g.wg.Go(func() { g.supervise(ctx, up) })
	}
}

// supervise keeps up running until ctx ends: it waits for the session to
// end, then tries to start the upstream again after a backoff that
// doubles from RetryMin to RetryMax while attempts fail.
func (g *Gateway) supervise(ctx context.Context, up *upstream) {
	wait := g.opts.RetryMin
	for {
		if cs, err := up.current(); err == nil {
			err := cs.Wait() // returns once the session ends (the process exited, or Close)
			up.mu.Lock()
			if proc := up.proc; proc != nil && up.session == cs {
				reap(proc) // a wrapper that died leaves no children behind
			}
			up.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			up.fail(fmt.Errorf("stopped: %v", cmp.Or(err, errors.New("session ended"))))
			g.opts.Logger.Error("mcp upstream stopped; retrying", "upstream", up.name, "err", err)
			wait = g.opts.RetryMin
		}
		tick, stop := g.opts.After(wait)
		select {
		case <-ctx.Done():
			stop()
			return
		case <-tick:
		}
		if err := g.connect(ctx, up); err != nil {
			up.fail(err)
			wait = min(2*wait, g.opts.RetryMax)
			g.opts.Logger.Error("mcp upstream unavailable; retrying", "upstream", up.name, "err", err, "retry_in", wait)
			continue
		}
		g.opts.Logger.Info("mcp upstream started", "upstream", up.name)
		wait = g.opts.RetryMin
	}
}

// UpstreamRevision is the MCP revision the gateway asks its upstreams for.
// Up to 2025-11-25 an upstream's server-to-client traffic (a sampling or
// elicitation request during a call, a resource update, a log message)
// travels on the session, where the gateway relays it to the client whose
// session it is (links.go); on 2026-07-28 resource updates move to
// subscriptions/listen streams and a server asks for sampling in a call's
// result, neither of which the gateway relays yet. A server that only
// speaks 2026-07-28 refuses the handshake: the upstream shows as
// unavailable with that error (docs/mcp.md, Limits).
const UpstreamRevision = "2025-11-25"

// dial makes the transport of one new session with u: a new process of a
// command upstream, a new connection to a URL or to an in-process Server.
// The progress and log notifications read off it are counted in o.
func dial(ctx context.Context, u Upstream, o *order) (mcp.Transport, *exec.Cmd, error) {
	var t mcp.Transport
	var proc *exec.Cmd
	switch {
	case u.Server != nil:
		st, ct := mcp.NewInMemoryTransports()
		if _, err := u.Server.Connect(context.WithoutCancel(ctx), st, nil); err != nil {
			return nil, nil, fmt.Errorf("mcp upstream %s: connect in process: %w", u.Name, err)
		}
		t = ct
	case u.Transport != nil:
		t = u.Transport
	case len(u.Command) > 0:
		// The command line as the policy wrote it, in order: a wrapper
		// names its own program and then the server's.
		cmd := exec.Command(u.Command[0], u.Command[1:]...)
		cmd.Env = Environ(os.Environ(), u.Env)
		cmd.Stderr = os.Stderr
		isolate(cmd) // it never outlives the gateway (procs_linux.go)
		proc = cmd
		t = &mcp.CommandTransport{Command: cmd}
	case u.URL != "":
		var base http.RoundTripper = http.DefaultTransport
		if len(u.Headers) > 0 {
			base = headerTransport{base: base, headers: u.Headers}
		}
		hc := &http.Client{Transport: orderTransport{base: base, o: o}}
		// Streamable HTTP counts in orderTransport.
		return &mcp.StreamableClientTransport{Endpoint: u.URL, HTTPClient: hc}, nil, nil
	default:
		return nil, nil, fmt.Errorf("mcp upstream %s: no command or url", u.Name)
	}
	return countingTransport{base: t, o: o}, proc, nil
}

// dials tells whether the gateway can open more than one session with u:
// every upstream but one given as a single Transport.
func (u Upstream) dials() bool {
	return u.Server != nil || (u.Transport == nil && (len(u.Command) > 0 || u.URL != ""))
}

// connect makes one attempt to start up's shared session: a new process
// (or connection), initialize, and its tools, resources and prompts
// listed, within ConnectTimeout.
func (g *Gateway) connect(ctx context.Context, up *upstream) error {
	u := up.spec
	o := newOrder()
	ctx, cancel := context.WithTimeout(ctx, g.opts.ConnectTimeout)
	defer cancel()
	t, proc, err := dial(ctx, u, o)
	if err != nil {
		return err
	}
	// The shared session carries sampling and elicitation only when it is
	// the one client's own (OneClient).
	one := g.opts.OneClient
	c := mcp.NewClient(&mcp.Implementation{Name: "countersign-gateway", Version: g.opts.Version}, g.clientOptions(up.shared, o, one, one))
	cs, err := c.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: UpstreamRevision})
	if err != nil {
		if proc != nil {
			reap(proc)
		}
		return fmt.Errorf("mcp upstream %s: connect: %w", u.Name, err)
	}
	err = g.listTools(ctx, up, cs)
	if err == nil {
		err = g.listPassThrough(ctx, up, cs)
	}
	if err == nil && !up.set(cs, proc, o) {
		err = fmt.Errorf("mcp upstream %s: the gateway closed", u.Name)
	}
	if err != nil {
		_ = cs.Close()
		if proc != nil {
			reap(proc)
		}
		return err
	}
	if level := g.fwd.sharedLevel(); level != "" {
		g.passLevel(ctx, up.name, cs, level) // a restarted upstream logs at its client's level
	}
	return nil
}

// unavailableTools answers a tools/call naming an upstream that is down
// and whose tools were never listed (prefixed names only: <upstream>__…)
// with ErrUnavailable's refusal instead of "unknown tool". A listed tool
// of an upstream that is down says so itself (gated).
func (g *Gateway) unavailableTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if !ok || !g.opts.Prefix || call.Params == nil {
			return next(ctx, method, req)
		}
		name, _, found := strings.Cut(call.Params.Name, Separator)
		if !found {
			return next(ctx, method, req)
		}
		for _, up := range g.upstreams {
			if up.name != name {
				continue
			}
			if _, err := up.current(); err == nil {
				break
			}
			g.mu.Lock()
			listed := slices.Contains(g.toolNames[up.name], call.Params.Name)
			g.mu.Unlock()
			if !listed {
				return unavailable(call.Params.Name, up.name), nil
			}
		}
		return next(ctx, method, req)
	}
}

// unavailable is the refusal of a call to a tool of an upstream that is
// not running.
func unavailable(tool, upstream string) *mcp.CallToolResult {
	return refusal("%s did not run: the MCP upstream %s is unavailable (it failed to start or stopped; Countersign is starting it again). Try again later.", tool, upstream)
}
