package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/hook"
	mcpgw "github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// This file: issue 45's acceptance. A request approved under one policy is
// claimed by a process that holds a stricter one (two processes in turn
// on one Redis database, as a deploy or a rolling restart does): whoever
// executes — the agent's in-process claim, a /v1 caller, HumanLayer's
// hand-off, the MCP gateway, the Claude Code hook, the claim after a cancel
// window's clock or after Run now — nothing the policy in force refuses
// runs, no claim token is handed out, and the caller is told why.

const judgeKey = "csk_judge_policy_key"

// judgePolicy is the policy file of the tests: refund (always reviewed),
// rush (runs when its cancel window ends unless cancelled), lookup. refund
// and rush share schema and rules; change adds to each (a deny rule, a
// quorum_when, a tighter amount), keyTools are the key's tools.
func judgePolicy(amount, rules, keyTools string) string {
	tool := func(name, risk, review string) string {
		return fmt.Sprintf(`
  - name: %s
    risk: %s
    %s
    decisions: [approve, reject]
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number%s}
      required: [order_id, amount]
%s`, name, risk, review, amount, rules)
	}
	return `version: 1
slack:
  approvals_channel: G0APPROV1
tools:` + tool("refund", "high", "review: always") + tool("rush", "low", "review: after\n    cancel_window: 2m") + `
  - name: lookup
    risk: low
    review: never
api:
  keys:
    - name: judge
      sha256: ` + api.HashKey(judgeKey) + `
      tools: [` + keyTools + `]
      rate_per_minute: 100000
`
}

// judgeCase is one way the policy in force differs from the one a request
// was approved under.
type judgeCase struct {
	name string
	// policy is the second process's policy file.
	policy string
	// tamper, when set, rewrites the approved request in Redis before it
	// is claimed (someone with write access to Redis).
	tamper func(t *testing.T, w *judgeWorld, id string)
	// more: the policy in force asks more approvals (not a refusal): the
	// request goes back to pending and runs once the rest approve.
	more bool
	// why is in what the caller is told.
	why string
	// keyed: only requests of an outside caller's key are concerned.
	keyed bool
}

var judgeCases = []judgeCase{
	{name: "deny rule added", why: "refunds above $100 go through finance",
		policy: judgePolicy("", "    deny:\n      - {when: 'double(args.amount) > 100.0', reason: refunds above $100 go through finance}\n", "refund, rush, lookup")},
	{name: "quorum raised", more: true, why: "asks 2 approvals",
		policy: judgePolicy("", "    quorum_when:\n      - {when: 'double(args.amount) > 100.0', quorum: 2, reason: refund above $100}\n", "refund, rush, lookup")},
	{name: "schema tightened", why: "invalid",
		policy: judgePolicy(", maximum: 100", "", "refund, rush, lookup")},
	{name: "key's tools narrowed", why: "may no longer ask for", keyed: true,
		policy: judgePolicy("", "", "lookup")},
	{name: "arguments differ from the approval", why: "differ from the ones the approver saw",
		policy: judgePolicy("", "", "refund, rush, lookup"),
		tamper: func(t *testing.T, w *judgeWorld, id string) {
			t.Helper()
			// Consistent with itself (args and digest rewritten together),
			// so only the approvals' digests give it away.
			args := `{"order_id":"1234","amount":30000}`
			digest, err := approval.Digest(json.RawMessage(args))
			if err != nil {
				t.Fatal(err)
			}
			if err := w.hset(context.Background(), w.prefix+":req:{"+id+"}", "args", args, "digest", digest); err != nil {
				t.Fatal(err)
			}
		}},
}

// judgeArgs are the arguments every executor asks for: $300, approved
// under the first policy by one approver.
var judgeArgs = json.RawMessage(`{"order_id":"1234","amount":300}`)

// judgeProc is one Countersign process: its policy, store, lifecycle and
// HTTP API (/v1 and /humanlayer/v1).
type judgeProc struct {
	file   *policyfile.File
	store  *store.Store
	life   *approval.Lifecycle
	cards  *approvaltest.Cards
	v1     *client.Client
	hlBase string
}

// judgeWorld is two processes on one Redis: 0 holds the first policy
// (requests are made and approved there), 1 the policy in force (every
// claim goes there).
type judgeWorld struct {
	// hset writes fields of a Redis hash, as anyone with write access
	// to Redis can.
	hset   func(ctx context.Context, key string, values ...any) error
	prefix string
	audit  *store.Audit
	proc   [2]*judgeProc
	ran    atomic.Int64 // upstream runs of the MCP tool
}

func newJudgeWorld(t *testing.T, inForce string) *judgeWorld {
	t.Helper()
	ctx := context.Background()
	rdb, prefix := storetest.New(t)
	w := &judgeWorld{prefix: prefix, audit: store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}"}),
		hset: func(ctx context.Context, key string, values ...any) error { return rdb.HSet(ctx, key, values...).Err() }}
	for p, policy := range []string{judgePolicy("", "", "refund, rush, lookup"), inForce} {
		f, err := policyfile.Parse([]byte(policy))
		if err != nil {
			t.Fatalf("policy %d: %v", p, err)
		}
		gate, err := approval.NewGate(f.Policy)
		if err != nil {
			t.Fatal(err)
		}
		jp := &judgeProc{file: f, store: store.New(rdb, store.Options{Prefix: prefix}), cards: approvaltest.NewCards()}
		t.Cleanup(func() { _ = jp.store.Close() })
		if jp.life, err = approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(jp.store, w.audit), Cards: jp.cards, Gate: gate, Schemas: f, Scopes: f,
			Directory: approvaltest.Directory{Everyone: true}}); err != nil {
			t.Fatal(err)
		}
		secret, err := jp.store.Secret(ctx)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := api.New(api.Options{Lifecycle: jp.life, Requests: jp.store, Audit: w.audit, IDSecret: secret, Keys: f.API.Keys})
		if err != nil {
			t.Fatal(err)
		}
		v1 := httptest.NewServer(srv.Handler())
		t.Cleanup(v1.Close)
		hl := httptest.NewServer(srv.HumanLayerHandler())
		t.Cleanup(hl.Close)
		jp.v1, jp.hlBase = client.New(v1.URL, judgeKey), hl.URL
		w.proc[p] = jp
	}
	return w
}

// approve records an approval of request id by approver through the first
// process's lifecycle (the door a click uses).
func (w *judgeWorld) approve(t *testing.T, id, approver string, v approval.Verdict) *approval.Request {
	t.Helper()
	ctx := context.Background()
	cur, err := w.proc[0].store.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := w.proc[0].life.Decide(ctx, cur, approval.Decision{RequestID: id, Verdict: v, Approver: approver, At: time.Now(), Digest: cur.Digest}, approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide(%s by %s) = %v", v, approver, err)
	}
	return got
}

// ask makes a request through the first process's /v1.
func (w *judgeWorld) ask(t *testing.T, tool, callID string) *client.Request {
	t.Helper()
	r, err := w.proc[0].v1.Request(context.Background(), client.Call{Tool: tool, CallID: callID, Arguments: judgeArgs})
	if err != nil {
		t.Fatalf("Request(%s) = %v", tool, err)
	}
	if r.ID == "" || r.Status != client.Pending {
		t.Fatalf("Request(%s) = %+v, want a pending request", tool, r)
	}
	return r
}

// splitAPI is an outside executor's API client behind a load balancer in
// a rolling deploy: it asks and waits on the first process, and claims on
// the second, which holds the policy in force. claimed tells the test each
// claim's answer; beforeClaim runs first (the tamper of a case).
type splitAPI struct {
	w           *judgeWorld
	asked       chan string // request ids, as they are made
	claimed     chan error
	beforeClaim func(id string)
}

func (s *splitAPI) Request(ctx context.Context, c client.Call) (*client.Request, error) {
	r, err := s.w.proc[0].v1.Request(ctx, c)
	if err == nil && r.ID != "" {
		s.asked <- r.ID
	}
	return r, err
}

func (s *splitAPI) Get(ctx context.Context, id string, wait time.Duration) (*client.Request, error) {
	return s.w.proc[0].v1.Get(ctx, id, wait)
}

func (s *splitAPI) Wait(ctx context.Context, id string) (*client.Request, error) {
	return s.w.proc[0].v1.Wait(ctx, id)
}

func (s *splitAPI) Claim(ctx context.Context, id string) (*client.Claimed, error) {
	if s.beforeClaim != nil {
		s.beforeClaim(id)
	}
	c, err := s.w.proc[1].v1.Claim(ctx, id)
	s.claimed <- err
	return c, err
}

func (s *splitAPI) Result(ctx context.Context, id, token string, st client.Status, out string) (*client.Request, error) {
	return s.w.proc[1].v1.Result(ctx, id, token, st, out)
}

func (s *splitAPI) Self(ctx context.Context) (*client.Key, error) { return s.w.proc[0].v1.Self(ctx) }

func (s *splitAPI) GiveUp(ctx context.Context, id string) (*client.Request, error) {
	return s.w.proc[0].v1.GiveUp(ctx, id)
}

// outcome is what an executor was told: ran says the tool ran (or the
// call was handed over to run), told what the caller reads.
type outcome struct {
	ran  bool
	told string
}

// executor claims request id on the second process its way, after the
// approval (and once more after the rest of the approvals when the first
// claim found the request pending again); more tells it that it should
// expect that. It returns what came of it.
type executorRun func(t *testing.T, w *judgeWorld, c judgeCase) outcome

// TestClaimJudgedByThePolicyInForce (issue 45): every executor × every way
// the policy in force differs from the approval's. Before this issue every
// executor but the agent was handed the call.
func TestClaimJudgedByThePolicyInForce(t *testing.T) {
	executors := []struct {
		name  string
		keyed bool // its requests are an outside caller's (a key's)
		after bool // a cancel window: no quorum
		run   executorRun
	}{
		{name: "agent", run: judgeAgent},
		{name: "v1", keyed: true, run: judgeV1},
		{name: "humanlayer", keyed: true, run: judgeHumanLayer},
		{name: "mcp", keyed: true, run: judgeMCP},
		{name: "hook", keyed: true, run: judgeHook},
		{name: "cancel window's clock", keyed: true, after: true, run: judgeWindow(false)},
		{name: "run now", keyed: true, after: true, run: judgeWindow(true)},
	}
	for _, c := range judgeCases {
		t.Run(c.name, func(t *testing.T) {
			for _, e := range executors {
				if (c.keyed && !e.keyed) || (c.more && e.after) {
					continue // no key to narrow; no vote in a cancel window
				}
				t.Run(e.name, func(t *testing.T) {
					w := newJudgeWorld(t, c.policy)
					got := e.run(t, w, c)
					switch {
					case c.more && !got.ran:
						t.Errorf("%s: not run after the second approval (told %q), want it run once the policy's quorum is met", e.name, got.told)
					case !c.more && got.ran:
						t.Errorf("%s: the call ran (told %q); the policy in force refuses it", e.name, got.told)
					case !c.more && !strings.Contains(got.told, c.why):
						t.Errorf("%s: told %q, want why (%q)", e.name, got.told, c.why)
					}
					w.checkAudit(t, c)
				})
			}
		})
	}
}

// checkAudit: a refusal is audited once as call_refused (with the deny
// rule when one refused), a reopening as reopened; nothing refused is
// ever executing.
func (w *judgeWorld) checkAudit(t *testing.T, c judgeCase) {
	t.Helper()
	entries, err := w.audit.Range(context.Background(), "", 100000)
	if err != nil {
		t.Fatal(err)
	}
	n := map[approval.Event]int{}
	for _, e := range entries {
		n[e.Event]++
		if e.Event == approval.EventCallRefused && c.name == "deny rule added" {
			if d, ok := approval.DecodeEvent(e).(*approval.CallErrorEvent); !ok || d.DenyRule == "" {
				t.Errorf("call_refused = %+v, want the deny rule named", approval.DecodeEvent(e))
			}
		}
	}
	switch {
	case c.more && (n[approval.EventReopened] != 1 || n[approval.EventExecuting] != 1):
		t.Errorf("audit: %d reopened, %d executing; want 1 and 1", n[approval.EventReopened], n[approval.EventExecuting])
	case !c.more && (n[approval.EventCallRefused] != 1 || n[approval.EventExecuting] != 0):
		t.Errorf("audit: %d call_refused, %d executing; want 1 and 0", n[approval.EventCallRefused], n[approval.EventExecuting])
	}
}

// settled asserts the request's record after a refusal: refused, why its
// result, and the card (the second process's card writer) asked to show it.
func (w *judgeWorld) settled(t *testing.T, c judgeCase, id string) {
	t.Helper()
	if c.more {
		return
	}
	r, err := w.proc[1].store.Request(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != approval.StatusRefused || !strings.Contains(r.Result, c.why) {
		t.Errorf("record = %s %q, want refused saying %q", r.Status, r.Result, c.why)
	}
	if got := w.proc[1].cards.Last(id); got == nil || got.Status != approval.StatusRefused {
		t.Errorf("card redrawn as %+v, want refused", got)
	}
}

// reopened asserts the request is pending again, its card asking for the
// rest, then has a second approver approve it.
func (w *judgeWorld) reopened(t *testing.T, id string) {
	t.Helper()
	r, err := w.proc[1].store.Request(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != approval.StatusPending || r.Reopened == nil || r.Reopened.Need != 2 || r.Quorum != 2 {
		t.Fatalf("record = %s quorum %d reopened %+v, want pending again needing 2", r.Status, r.Quorum, r.Reopened)
	}
	if got := w.proc[1].cards.Last(id); got == nil || got.Status != approval.StatusPending || got.Reopened == nil {
		t.Errorf("card redrawn as %+v, want pending again with why", got)
	}
	w.approve(t, id, "U0CAROL01", approval.VerdictApprove)
}

func judgeAgent(t *testing.T, w *judgeWorld, c judgeCase) outcome {
	ctx := context.Background()
	r := w.ask(t, "refund", approval.NewID("agent"))
	w.approve(t, r.ID, "U0BOB0001", approval.VerdictApprove)
	if c.tamper != nil {
		c.tamper(t, w, r.ID)
	}
	for try := 0; ; try++ {
		known, err := w.proc[1].store.Request(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.proc[1].life.ClaimRequest(ctx, known, "agent")
		if err == nil {
			if _, err := w.proc[1].life.Finish(ctx, r.ID, "agent", approval.Outcome{Status: approval.StatusExecuted}); err != nil {
				t.Fatal(err)
			}
			return outcome{ran: true}
		}
		if errors.Is(err, approval.ErrNeedsApprovals) && try == 0 && c.more {
			w.reopened(t, r.ID)
			continue
		}
		var refused *approval.RefusedError
		if !errors.As(err, &refused) || got == nil {
			t.Errorf("ClaimRequest = %v, want a refusal with the request", err)
		}
		w.settled(t, c, r.ID)
		return outcome{told: err.Error()}
	}
}

func judgeV1(t *testing.T, w *judgeWorld, c judgeCase) outcome {
	r := w.ask(t, "refund", approval.NewID("v1"))
	w.approve(t, r.ID, "U0BOB0001", approval.VerdictApprove)
	if c.tamper != nil {
		c.tamper(t, w, r.ID)
	}
	return w.claimV1(t, c, r.ID)
}

// claimV1 claims id on the second process through /v1 as a caller does:
// needs_approvals waits for the rest, then claims again.
func (w *judgeWorld) claimV1(t *testing.T, c judgeCase, id string) outcome {
	ctx := context.Background()
	for try := 0; ; try++ {
		claim, err := w.proc[1].v1.Claim(ctx, id)
		if err == nil {
			if claim.Token == "" {
				t.Error("a claim won with no token")
			}
			return outcome{ran: true}
		}
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusConflict {
			t.Fatalf("Claim = %v, want 409", err)
		}
		if apiErr.Code == "needs_approvals" && try == 0 && c.more {
			if apiErr.Request == nil || apiErr.Request.Status != client.Pending {
				t.Errorf("needs_approvals with request %+v, want it pending", apiErr.Request)
			}
			w.reopened(t, id)
			continue
		}
		if apiErr.Code != "refused" || apiErr.Request == nil || apiErr.Request.Status != client.Refused {
			t.Errorf("Claim = %s (%+v), want refused with the request refused", apiErr.Code, apiErr.Request)
		}
		w.settled(t, c, id)
		return outcome{told: apiErr.Message}
	}
}

func judgeHumanLayer(t *testing.T, w *judgeWorld, c judgeCase) outcome {
	callID := approval.NewID("hl")
	post := func(base, method, path string, body any) map[string]any {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		req.Header.Set("Authorization", "Bearer "+judgeKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode >= 300 {
			t.Fatalf("%s %s = %d, %v", method, path, resp.StatusCode, err)
		}
		return out
	}
	post(w.proc[0].hlBase, http.MethodPost, "/humanlayer/v1/function_calls", map[string]any{"run_id": "run_hl", "call_id": callID,
		"spec": map[string]any{"fn": "refund", "kwargs": judgeArgs}})
	r := w.requestByCall(t, callID)
	w.approve(t, r, "U0BOB0001", approval.VerdictApprove)
	if c.tamper != nil {
		c.tamper(t, w, r)
	}
	for try := 0; ; try++ {
		got := post(w.proc[1].hlBase, http.MethodGet, "/humanlayer/v1/function_calls/"+callID, nil)
		st, _ := got["status"].(map[string]any)
		approved, decided := st["approved"].(bool)
		comment, _ := st["comment"].(string)
		switch {
		case decided && approved:
			return outcome{ran: true}
		case !decided && try == 0 && c.more:
			w.reopened(t, r)
			continue
		case !decided:
			t.Fatalf("hand-off answered %v, want a decision", st)
		}
		w.settled(t, c, r)
		return outcome{told: comment}
	}
}

// requestByCall finds the request of a HumanLayer call id in the audit.
func (w *judgeWorld) requestByCall(t *testing.T, callID string) string {
	t.Helper()
	entries, err := w.audit.Range(context.Background(), "", 100000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if d, ok := approval.DecodeEvent(e).(*approval.RequestedEvent); ok && e.Event == approval.EventRequested && d.CallID == callID {
			return e.RequestID
		}
	}
	t.Fatalf("no request for call %s", callID)
	return ""
}

func judgeMCP(t *testing.T, w *judgeWorld, c judgeCase) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	up.AddTool(&mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			w.ran.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "refunded"}}}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	sp := &splitAPI{w: w, asked: make(chan string, 1), claimed: make(chan error, 2)}
	if c.tamper != nil {
		sp.beforeClaim = func(id string) { c.tamper(t, w, id) }
	}
	g, err := mcpgw.New(ctx, mcpgw.Options{Upstreams: []mcpgw.Upstream{{Name: "orders", Transport: ct}},
		API: func(string) mcpgw.API { return sp }, FollowEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, gc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() { // exits when the call is answered (or ctx ends)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: judgeArgs})
		done <- answer{res, err}
	}()
	id := <-sp.asked
	w.approve(t, id, "U0BOB0001", approval.VerdictApprove)
	if err := <-sp.claimed; c.more {
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Code != "needs_approvals" {
			t.Fatalf("the gateway's claim = %v, want needs_approvals", err)
		}
		w.reopened(t, id)
		<-sp.claimed
	}
	a := <-done
	if a.err != nil {
		t.Fatalf("CallTool = %v", a.err)
	}
	w.settled(t, c, id)
	return outcome{ran: w.ran.Load() > 0 && !a.res.IsError, told: resultString(a.res)}
}

func judgeHook(t *testing.T, w *judgeWorld, c judgeCase) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sp := &splitAPI{w: w, asked: make(chan string, 1), claimed: make(chan error, 2)}
	if c.tamper != nil {
		sp.beforeClaim = func(id string) { c.tamper(t, w, id) }
	}
	done := make(chan hook.Answer, 1)
	go func() { // exits when the hook answers (or ctx ends)
		done <- hook.Decide(ctx, hook.Input{HookEventName: "PreToolUse", SessionID: "s1", ToolName: "refund", ToolInput: judgeArgs,
			ToolUseID: approval.NewID("toolu")}, hook.Options{API: sp})
	}()
	id := <-sp.asked
	w.approve(t, id, "U0BOB0001", approval.VerdictApprove)
	if err := <-sp.claimed; c.more {
		var apiErr *client.Error
		if !errors.As(err, &apiErr) || apiErr.Code != "needs_approvals" {
			t.Fatalf("the hook's claim = %v, want needs_approvals", err)
		}
		w.reopened(t, id)
		<-sp.claimed
	}
	a := <-done
	w.settled(t, c, id)
	return outcome{ran: a.PermissionDecision == hook.Allow, told: a.PermissionDecisionReason}
}

// judgeWindow is the claim of a cancel window's call: approved by its
// clock (the window ended uncancelled), or by an approver's Run now.
func judgeWindow(runNow bool) executorRun {
	return func(t *testing.T, w *judgeWorld, c judgeCase) outcome {
		ctx := context.Background()
		r := w.ask(t, "rush", approval.NewID("win"))
		if runNow {
			w.approve(t, r.ID, "U0BOB0001", approval.VerdictRunNow)
		} else {
			late := time.Now().Add(3 * time.Minute)
			clock, err := approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(w.proc[0].store, w.audit), Now: func() time.Time { return late }})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := clock.ExpireDue(ctx); err != nil || n != 1 {
				t.Fatalf("ExpireDue = %d, %v; want the window ended", n, err)
			}
		}
		if c.tamper != nil {
			c.tamper(t, w, r.ID)
		}
		return w.claimV1(t, c, r.ID)
	}
}
