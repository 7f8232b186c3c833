package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	mcpgw "github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// claimWorld is two Countersign processes (each its Store, Lifecycle, /v1
// API over HTTP and MCP gateway) on one Redis, in front of one upstream
// MCP tool. Every executor of the property test claims the same approved
// request: the agent's way (Lifecycle.Claim, in-process), an API client's
// (claim, then result with the token over HTTP), or an MCP call (the
// gateway claims through its process's API).
type claimWorld struct {
	life    [2]*approval.Lifecycle
	store   [2]*store.Store
	clients [2]*client.Client
	mcp     [2]*mcp.ClientSession
	audit   *store.Audit

	mu      sync.Mutex // guards the fields below, set per input
	callID  string
	release chan struct{}     // the winner's tool waits on it
	ran     chan string       // every run of the tool, by kind
	settled chan struct{}     // an MCP executor's claim step is done
	seen    map[string]string // MCP claim-step statuses, for failures
}

const claimKey = "csk_claim_property_key"

// claimArgs are the arguments of the one call every executor runs.
var claimArgs = json.RawMessage(`{"order_id":"1234","amount":400}`)

func (w *claimWorld) current() (string, chan struct{}, chan string, chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.callID, w.release, w.ran, w.settled
}

// stepAPI is a gateway's API client pointed at the shared request (every
// MCP call maps to it), telling the test when the call's claim step is
// done: its request found claimed already, or its own claim answered.
type stepAPI struct {
	w  *claimWorld
	cl *client.Client
}

func (s stepAPI) Request(ctx context.Context, _ client.Call) (*client.Request, error) {
	callID, _, _, settled := s.w.current()
	r, err := s.cl.Request(ctx, client.Call{Tool: "refund", CallID: callID, Arguments: claimArgs})
	if err == nil && r.Status != client.Approved {
		settled <- struct{}{}
	}
	return r, err
}

func (s stepAPI) Get(ctx context.Context, id string, wait time.Duration) (*client.Request, error) {
	return s.cl.Get(ctx, id, wait)
}

func (s stepAPI) Claim(ctx context.Context, id string) (*client.Claimed, error) {
	_, _, _, settled := s.w.current()
	c, err := s.cl.Claim(ctx, id)
	settled <- struct{}{}
	return c, err
}

func (s stepAPI) Result(ctx context.Context, id, token string, st client.Status, out string) (*client.Request, error) {
	return s.cl.Result(ctx, id, token, st, out)
}

func (s stepAPI) Self(ctx context.Context) (*client.Key, error) { return s.cl.Self(ctx) }

func newClaimWorld(tb testing.TB) *claimWorld {
	tb.Helper()
	ctx := context.Background()
	rdb, prefix := storetest.New(tb)
	w := &claimWorld{audit: store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}"})}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"refund": {Risk: approval.RiskHigh, Review: approval.ReviewAlways, Quorum: 1, Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	up := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	up.AddTool(&mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			_, release, ran, _ := w.current()
			ran <- "mcp"
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "outcome:mcp"}}}, nil
		})
	for p := range 2 {
		w.store[p] = store.New(rdb, store.Options{Prefix: prefix})
		tb.Cleanup(func() { _ = w.store[p].Close() })
		if w.life[p], err = approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(w.store[p], w.audit), Gate: gate}); err != nil {
			tb.Fatal(err)
		}
		secret, err := w.store[p].Secret(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		srv, err := api.New(api.Options{Lifecycle: w.life[p], Requests: w.store[p], Audit: w.audit, IDSecret: secret,
			Keys: []api.Key{{Name: "prop", SHA256: api.HashKey(claimKey), Tools: []string{"*"}, RatePerMinute: 1 << 20}}})
		if err != nil {
			tb.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		tb.Cleanup(hs.Close)
		w.clients[p] = client.New(hs.URL, claimKey)
		st, ct := mcp.NewInMemoryTransports()
		if _, err := up.Connect(ctx, st, nil); err != nil {
			tb.Fatal(err)
		}
		cl := w.clients[p]
		g, err := mcpgw.New(ctx, mcpgw.Options{Upstreams: []mcpgw.Upstream{{Name: "orders", Transport: ct}},
			API: func(string) mcpgw.API { return stepAPI{w: w, cl: cl} }, FollowEvery: time.Millisecond})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = g.Close() })
		gs, gc := mcp.NewInMemoryTransports()
		if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
			tb.Fatal(err)
		}
		if w.mcp[p], err = mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, gc, nil); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = w.mcp[p].Close() })
	}
	return w
}

// executor is one party that tries to run the approved call.
type executor struct {
	kind string // agent, api, mcp
	proc int
	// What it got: won (it ran the tool), and otherwise the state it was
	// answered with (status, and the outcome once recorded).
	won    bool
	status string
	output string
	err    error
}

// run makes e claim request id (and run it if it wins), telling settled
// once its claim step is done (MCP executors tell through stepAPI).
func (w *claimWorld) run(ctx context.Context, e *executor, id string, settled chan<- struct{}) {
	_, release, ran, _ := w.current()
	switch e.kind {
	case "agent":
		r, err := w.life[e.proc].Claim(ctx, id, fmt.Sprintf("agent-%d", e.proc))
		settled <- struct{}{}
		if err != nil {
			e.err = err
			if r != nil {
				e.status, e.output = string(r.Status), r.Result
			}
			return
		}
		e.won = true
		ran <- "agent"
		<-release
		_, e.err = w.life[e.proc].Finish(ctx, id, fmt.Sprintf("agent-%d", e.proc), approval.Outcome{Status: approval.StatusExecuted, Result: "outcome:agent"})
	case "api":
		c, err := w.clients[e.proc].Claim(ctx, id)
		settled <- struct{}{}
		if err != nil {
			e.err = err
			var apiErr *client.Error
			if errors.As(err, &apiErr) && apiErr.Request != nil {
				e.status = string(apiErr.Request.Status)
				if apiErr.Request.Result != nil {
					e.output = apiErr.Request.Result.Output
				}
			}
			return
		}
		e.won = true
		ran <- "api"
		<-release
		_, e.err = w.clients[e.proc].Result(ctx, id, c.Token, client.Executed, "outcome:api")
	case "mcp":
		res, err := w.mcp[e.proc].CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: claimArgs})
		if err != nil {
			e.err = err
			return
		}
		e.status, e.output = "answered", resultString(res)
		if res.IsError {
			e.err = fmt.Errorf("MCP answered an error: %s", e.output)
		}
	}
}

// checkClaimInterleaving runs one interleaving chosen by seed: 2 to 7
// executors of random kinds on random processes claim one approved
// request one after another (each waits until the one before it finished
// its claim step), and the winner's tool finishes after a random number
// of them. Exactly one runs; every other executor is answered with the
// winner's state: executing while it runs, its outcome after.
func (w *claimWorld) checkClaimInterleaving(t *testing.T, seed uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(seed, 27))
	n := 2 + rng.IntN(6)
	execs := make([]*executor, n)
	kinds := []string{"agent", "api", "mcp"}
	for i := range execs {
		execs[i] = &executor{kind: kinds[rng.IntN(3)], proc: rng.IntN(2)}
	}
	split := 1 + rng.IntN(n) // executors [0, split) claim while the winner runs

	callID := fmt.Sprintf("prop-%d-%s", seed, approval.NewID("c"))
	release, ran, settled := make(chan struct{}), make(chan string, n+1), make(chan struct{}, 1)
	w.mu.Lock()
	w.callID, w.release, w.ran, w.settled = callID, release, ran, settled
	w.mu.Unlock()
	r, err := w.clients[rng.IntN(2)].Request(ctx, client.Call{Tool: "refund", CallID: callID, Arguments: claimArgs})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	cur, err := w.store[0].Request(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.life[rng.IntN(2)].Decide(ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U0BOB0001",
		At: time.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide: %v", err)
	}

	done := make([]chan struct{}, n)
	for i, e := range execs {
		if i == split {
			close(release)
			<-done[0]
		}
		done[i] = make(chan struct{})
		go func() { // exits when the executor was answered
			defer close(done[i])
			w.run(ctx, e, r.ID, settled)
		}()
		select {
		case <-settled:
		case <-done[i]:
		case <-ctx.Done():
			t.Fatalf("seed %d: executor %d (%s on process %d) never finished its claim step", seed, i, e.kind, e.proc)
		}
	}
	if split == n {
		close(release)
	}
	for i := range execs {
		<-done[i]
	}
	close(ran)
	var runs []string
	for k := range ran {
		runs = append(runs, k)
	}
	desc := fmt.Sprintf("seed %d: %d executors, split %d:", seed, n, split)
	for _, e := range execs {
		desc += fmt.Sprintf(" %s@%d", e.kind, e.proc)
	}
	if len(runs) != 1 {
		t.Fatalf("%s the tool ran %d times (%v), want once", desc, len(runs), runs)
	}
	want := "outcome:" + runs[0]
	final, err := w.store[1].Request(ctx, r.ID)
	if err != nil || final.Status != approval.StatusExecuted || final.Result != want {
		t.Fatalf("%s record = %+v, %v; want executed with %q", desc, final, err, want)
	}
	first := execs[0]
	if first.kind != "mcp" && (!first.won || first.err != nil) {
		t.Errorf("%s the first executor = %+v, want it to win", desc, first)
	}
	for i, e := range execs[1:] {
		i++
		switch {
		case e.won:
			t.Errorf("%s executor %d (%s) also won", desc, i, e.kind)
		case e.kind == "mcp":
			if e.err != nil || e.output != want {
				t.Errorf("%s MCP executor %d answered %q (%v), want the winner's %q", desc, i, e.output, e.err, want)
			}
		case !errors.Is(e.err, approval.ErrAlreadyClaimed) && !isAlreadyClaimed(e.err):
			t.Errorf("%s executor %d (%s) = %v, want already claimed", desc, i, e.kind, e.err)
		case i < split && e.status != string(approval.StatusExecuting):
			t.Errorf("%s executor %d (%s) saw %s while the winner ran, want executing", desc, i, e.kind, e.status)
		case i >= split && (e.status != string(approval.StatusExecuted) || e.output != want):
			t.Errorf("%s executor %d (%s) saw %s %q after the winner finished, want executed %q", desc, i, e.kind, e.status, e.output, want)
		}
	}
	entries, err := w.audit.Range(ctx, "", 100000)
	if err != nil {
		t.Fatal(err)
	}
	var executing int
	for _, e := range entries {
		if e.RequestID == r.ID && e.Event == approval.EventExecuting {
			executing++
		}
	}
	if executing != 1 {
		t.Errorf("%s executing audited %d times, want 1", desc, executing)
	}
}

func isAlreadyClaimed(err error) bool {
	var apiErr *client.Error
	return errors.As(err, &apiErr) && apiErr.HTTPStatus == 409 && apiErr.Code == "already_claimed"
}

// FuzzClaimInterleavings (issue 27, acceptance): for any interleaving of
// executors — the agent's Lifecycle.Claim, API clients over HTTP, MCP
// calls — across two processes on one Redis, claiming the same approved
// request, exactly one runs and every other gets the first one's
// outcome. The seeds run with go test; `go test -fuzz FuzzClaimInterleavings`
// explores more.
func FuzzClaimInterleavings(f *testing.F) {
	for seed := range uint64(24) {
		f.Add(seed)
	}
	w := newClaimWorld(f)
	f.Fuzz(func(t *testing.T, seed uint64) {
		w.checkClaimInterleaving(t, seed)
	})
}
