package agent_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
)

const refundArgs = `{"order_id":"1234","amount":64,"reason":"damaged in transit","confidence":0.9}`

// TestSingleGatedCall: approve → the system of record is hit once with the
// original arguments and the request id as Idempotency-Key; edit → hit once
// with the edited arguments and the model is told what changed and by
// whom; reject → never hit, the reason verbatim to the model; respond →
// never hit, the approver's text is the tool result.
func TestSingleGatedCall(t *testing.T) {
	tests := []struct {
		name      string
		tool      string
		args      string
		verdict   approval.Verdict
		text      string
		edit      string
		wantHits  int
		wantBody  map[string]any
		wantTool  func(t *testing.T, content string, r *approval.Request)
		wantCount func(res approval.RunResult) int
	}{
		{
			name: "approve", tool: "issue_refund", args: refundArgs, verdict: approval.VerdictApprove,
			wantHits: 1, wantBody: map[string]any{"order_id": "1234", "amount": 64.0, "reason": "damaged in transit"},
			wantTool: func(t *testing.T, content string, r *approval.Request) {
				if content != `{"id":"RF-1","status":"refunded"}` {
					t.Errorf("tool message = %q, want the refund response", content)
				}
			},
			wantCount: func(res approval.RunResult) int { return res.Approved },
		},
		{
			name: "edit", tool: "issue_refund", args: refundArgs, verdict: approval.VerdictEdit,
			edit:     `{"order_id":"1234","amount":40,"reason":"damaged in transit"}`,
			wantHits: 1, wantBody: map[string]any{"order_id": "1234", "amount": 40.0, "reason": "damaged in transit"},
			wantTool: func(t *testing.T, content string, r *approval.Request) {
				for _, want := range []string{"<@U_APPROVER> edited the issue_refund arguments", "amount: 64 → 40", `Result: {"id":"RF-1"`} {
					if !strings.Contains(content, want) {
						t.Errorf("tool message = %q, want it to contain %q", content, want)
					}
				}
			},
			wantCount: func(res approval.RunResult) int { return res.Edited },
		},
		{
			name: "reject", tool: "issue_refund", args: refundArgs, verdict: approval.VerdictReject,
			text: "Refunds over $50 need a photo of the damage — ask for one first.",
			wantTool: func(t *testing.T, content string, r *approval.Request) {
				if !strings.Contains(content, "Reason: Refunds over $50 need a photo of the damage — ask for one first.") {
					t.Errorf("tool message = %q, want the reason verbatim", content)
				}
			},
			wantCount: func(res approval.RunResult) int { return res.Rejected },
		},
		{
			name: "respond", tool: "send_email", verdict: approval.VerdictRespond,
			args: `{"to":"dana@example.com","subject":"Sorry","body":"We are sorry.","confidence":0.8}`,
			text: "I called Dana instead; no email needed.",
			wantTool: func(t *testing.T, content string, r *approval.Request) {
				// The model learns that nothing ran, who answered, and the answer.
				if content != "Not run: <@U_APPROVER> answered instead of running send_email. Their answer: I called Dana instead; no email needed." {
					t.Errorf("tool message = %q, want that nothing ran, by whom, and the response text", content)
				}
			},
			wantCount: func(res approval.RunResult) int { return res.Responded },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			p := w.start()
			w.model.Enqueue(
				scripted.Reply{ToolCalls: []scripted.Call{call("call_1", tc.tool, tc.args)}},
				scripted.Reply{Content: "All done."},
			)
			p.handle(t, task("please handle it"))
			card := recv(t, p.notify.cards, "the approval card")
			if card.Tool != tc.tool || card.Status != approval.StatusPending || card.RunID == "" {
				t.Fatalf("card = %+v, want a pending %s request", card, tc.tool)
			}
			if _, has := argsJSON(t, card.Args)["confidence"]; has {
				t.Errorf("request args %s still carry confidence", card.Args)
			}
			if card.Confidence == nil {
				t.Errorf("request confidence = nil, want the model's value")
			}
			w.decide(card, tc.verdict, tc.text, json.RawMessage(tc.edit))
			res := recv(t, p.notify.results, "the run result")
			if res.Status != approval.RunDone || res.Answer != "All done." {
				t.Errorf("result = %+v, want done with the model's answer", res)
			}
			if got := tc.wantCount(res); got != 1 {
				t.Errorf("count for %s = %d, want 1 (result %+v)", tc.verdict, got, res)
			}
			path := "POST /refunds"
			if tc.tool == "send_email" {
				path = "POST /emails"
			}
			hits := w.sor.requests(path)
			if len(hits) != tc.wantHits {
				t.Fatalf("%s hits = %d, want %d", path, len(hits), tc.wantHits)
			}
			if tc.wantHits == 1 {
				var body map[string]any
				if err := json.Unmarshal([]byte(hits[0].Body), &body); err != nil {
					t.Fatalf("body %q: %v", hits[0].Body, err)
				}
				if fmt.Sprint(body) != fmt.Sprint(tc.wantBody) {
					t.Errorf("body = %v, want %v", body, tc.wantBody)
				}
				if hits[0].Key != card.ID {
					t.Errorf("Idempotency-Key = %q, want the request id %q", hits[0].Key, card.ID)
				}
				if hits[0].Auth != "Bearer sor-secret-token" {
					t.Errorf("Authorization = %q, want the env secret", hits[0].Auth)
				}
			}
			tools := toolMessages(w.lastRequest())
			if len(tools) != 1 || tools[0].ToolCallID != "call_1" {
				t.Fatalf("tool messages = %+v, want one for call_1", tools)
			}
			final := w.request(card.ID)
			tc.wantTool(t, tools[0].Content, final)
			var seq []string
			for _, e := range w.events() {
				if e.RequestID == card.ID {
					seq = append(seq, string(e.Event))
				}
			}
			// card_posted is the lifecycle's, once the card writer's post
			// is bound; decided is the approver's, through the lifecycle,
			// before anything runs.
			wantSeq := "proposed,assessed,requested,card_posted,decided"
			if tc.wantHits == 1 {
				wantSeq += ",executing,executed"
			}
			if got := strings.Join(seq, ","); got != wantSeq {
				t.Errorf("audit events of the request = %s, want %s", got, wantSeq)
			}
			for _, e := range w.events() {
				if strings.Contains(string(e.Data), "sor-secret-token") {
					t.Errorf("audit entry %s contains the env secret", e.Event)
				}
				if tc.tool == "issue_refund" && strings.Contains(string(e.Data), "damaged in transit") {
					t.Errorf("audit entry %s contains the secret argument", e.Event)
				}
			}
		})
	}
}

// TestBatchOfFive: 2 ungated and 3 gated calls in one reply, the gated
// ones decided in reverse order (approve, reject, edit) → five tool
// messages in the original order, tools hit exactly as decided.
func TestBatchOfFive(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{
			call("c1", "lookup_order", `{"order_id":"1234"}`),
			call("c2", "send_email", `{"to":"dana@example.com","subject":"Sorry","body":"Sorry about the table.","confidence":0.9}`),
			call("c3", "lookup_order", `{"order_id":"5678"}`),
			call("c4", "issue_refund", refundArgs),
			call("c5", "delete_customer", `{"customer_id":"C-200","confidence":0.95}`),
		}},
		scripted.Reply{Content: "Batch handled."},
	)
	p.handle(t, task("do all five"))
	cards := map[string]*approval.Request{}
	for range 3 {
		c := recv(t, p.notify.cards, "a card")
		cards[c.Tool] = c
	}
	// Reverse order: the last gated call first.
	w.decide(cards["delete_customer"], approval.VerdictApprove, "", nil)
	w.decide(cards["issue_refund"], approval.VerdictReject, "not this one", nil)
	w.decide(cards["send_email"], approval.VerdictEdit, "", json.RawMessage(`{"to":"dana@example.com","subject":"Sorry","body":"Edited body."}`))
	res := recv(t, p.notify.results, "the run result")
	if res.AutoRun != 2 || res.Approved != 1 || res.Rejected != 1 || res.Edited != 1 {
		t.Errorf("counts = %+v, want 2 auto, 1 approved, 1 rejected, 1 edited", res)
	}
	if len(res.RejectionReasons) != 1 || !strings.Contains(res.RejectionReasons[0], "not this one") {
		t.Errorf("rejection reasons = %q", res.RejectionReasons)
	}
	tools := toolMessages(w.lastRequest())
	var ids []string
	for _, m := range tools {
		ids = append(ids, m.ToolCallID)
	}
	if got := strings.Join(ids, ","); got != "c1,c2,c3,c4,c5" {
		t.Fatalf("tool message ids = %s, want c1,c2,c3,c4,c5", got)
	}
	if !strings.Contains(tools[0].Content, `"id":"1234"`) || !strings.Contains(tools[2].Content, `"id":"5678"`) {
		t.Errorf("lookup results = %q / %q", tools[0].Content, tools[2].Content)
	}
	if !strings.Contains(tools[1].Content, "edited the send_email arguments") {
		t.Errorf("email result = %q, want the edit note", tools[1].Content)
	}
	if !strings.Contains(tools[3].Content, "Reason: not this one") {
		t.Errorf("refund result = %q, want the rejection", tools[3].Content)
	}
	if tools[4].Content != `{"deleted":true}` {
		t.Errorf("delete result = %q", tools[4].Content)
	}
	for path, want := range map[string]int{
		"GET /orders/1234": 1, "GET /orders/5678": 1, "POST /emails": 1, "POST /refunds": 0, "DELETE /customers/C-200": 1,
	} {
		if got := w.sor.count(path); got != want {
			t.Errorf("%s hits = %d, want %d", path, got, want)
		}
	}
	if got := w.sor.requests("POST /emails"); len(got) == 1 && !strings.Contains(got[0].Body, "Edited body.") {
		t.Errorf("email body = %s, want the edited one", got[0].Body)
	}
}

// TestModelErrorsFailClosed: unknown tool, malformed JSON, a schema
// violation, NaN and a huge number → nothing executes, each is refused and
// audited, the model gets an error result for each.
func TestModelErrorsFailClosed(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{
			call("u1", "format_disk", `{}`),
			call("u2", "issue_refund", `{"order_id":"1234","amount":64,`),
			call("u3", "issue_refund", `{"order_id":"1234","amount":"lots","reason":"x"}`),
			call("u4", "issue_refund", `{"order_id":"1234","amount":NaN,"reason":"x"}`),
			call("u5", "issue_refund", `{"order_id":"1234","amount":1e400,"reason":"x"}`),
			call("u6", "issue_refund", `{"order_id":"1234","amount":5,"reason":"x","confidence":7}`),
		}},
		scripted.Reply{Content: "Nothing could be done."},
	)
	p.handle(t, task("break things"))
	res := recv(t, p.notify.results, "the run result")
	if res.Refused != 6 {
		t.Errorf("refused = %d, want 6 (%+v)", res.Refused, res)
	}
	select {
	case c := <-p.notify.cards:
		t.Fatalf("a card was posted for a refused call: %+v", c)
	default:
	}
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Errorf("POST /refunds hits = %d, want 0", n)
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 6 {
		t.Fatalf("tool messages = %d, want 6", len(tools))
	}
	wants := []string{"unknown tool \"format_disk\"", "not a JSON object", "do not match the issue_refund schema", "not a JSON object", "out of range", "confidence must be a number between 0 and 1"}
	for i, m := range tools {
		if !strings.HasPrefix(m.Content, "error: ") || !strings.Contains(m.Content, wants[i]) || !strings.Contains(m.Content, "not executed") {
			t.Errorf("tool message %s = %q, want an error containing %q", m.ToolCallID, m.Content, wants[i])
		}
	}
	if got := w.countEvents(approval.EventCallRefused); got != 6 {
		t.Errorf("call_refused audit entries = %d, want 6", got)
	}
	if got := w.countEvents(approval.EventExecuting); got != 0 {
		t.Errorf("executing audit entries = %d, want 0", got)
	}
}

// TestInvalidEditFailsClosed: an approver's edit that violates the schema
// does not run; the request ends refused and the refusal is audited.
func TestInvalidEditFailsClosed(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{call("e1", "issue_refund", refundArgs)}},
		scripted.Reply{Content: "ok"},
	)
	p.handle(t, task("refund"))
	card := recv(t, p.notify.cards, "the card")
	w.decideUnjudged("U_APPROVER", card, json.RawMessage(`{"order_id":"1234","amount":-5,"reason":"x"}`), approval.ErrInvalidArgs)
	recv(t, p.notify.results, "the run result")
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Fatalf("POST /refunds hits = %d, want 0", n)
	}
	if got := w.request(card.ID).Status; got != approval.StatusRefused {
		t.Errorf("request status = %s, want refused", got)
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.Contains(tools[0].Content, "Not run: the arguments U_APPROVER entered are invalid") {
		t.Errorf("tool messages = %+v, want the invalid-edit note", tools)
	}
	found := false
	for _, e := range w.events() {
		if e.Event == approval.EventCallRefused && e.Actor == "U_APPROVER" && e.RequestID == card.ID {
			found = true
		}
	}
	if !found {
		t.Error("no call_refused audit entry for the invalid edit")
	}
}

// TestCrashSafety: the process stops while 3 calls wait; one is decided
// while nothing runs; a new process resumes the run, the decided call
// executes exactly once and the others keep waiting.
func TestCrashSafety(t *testing.T) {
	w := newWorld(t)
	p1 := w.start()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{
			call("k1", "send_email", `{"to":"dana@example.com","subject":"Sorry","body":"Sorry.","confidence":0.9}`),
			call("k2", "issue_refund", refundArgs),
			call("k3", "delete_customer", `{"customer_id":"C-300"}`),
		}},
		scripted.Reply{Content: "resumed and finished"},
	)
	p1.handle(t, task("three things"))
	cards := map[string]*approval.Request{}
	for range 3 {
		c := recv(t, p1.notify.cards, "a card")
		cards[c.Tool] = c
	}
	// The process's context ends (shutdown): nothing is rejected.
	if err := p1.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, c := range cards {
		if got := w.request(c.ID).Status; got != approval.StatusPending {
			t.Fatalf("%s after shutdown = %s, want pending", c.Tool, got)
		}
	}
	// Decided while no process runs the run.
	w.decide(cards["issue_refund"], approval.VerdictApprove, "", nil)
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Fatalf("refund ran with no process: %d hits", n)
	}

	p2 := w.start()
	n, err := p2.agent.Resume(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v, want 1 run adopted", n, err)
	}
	upd := recv(t, p2.notify.updates, "the refund's outcome")
	for upd.Status == approval.StatusExecuting { // the claim is redrawn too
		upd = recv(t, p2.notify.updates, "the refund's outcome")
	}
	if upd.ID != cards["issue_refund"].ID || upd.Status != approval.StatusExecuted {
		t.Fatalf("update = %s %s, want the refund executed", upd.Tool, upd.Status)
	}
	if n := w.sor.count("POST /refunds"); n != 1 {
		t.Fatalf("POST /refunds hits = %d, want exactly 1", n)
	}
	for _, tool := range []string{"send_email", "delete_customer"} {
		if got := w.request(cards[tool].ID).Status; got != approval.StatusPending {
			t.Errorf("%s = %s, want still pending", tool, got)
		}
	}
	if n, _ := p2.agent.Resume(context.Background()); n != 0 {
		t.Errorf("second Resume adopted %d runs, want 0 (already owned)", n)
	}
	// The others are decided later; the run completes on the new process.
	w.decide(cards["send_email"], approval.VerdictReject, "no", nil)
	w.decide(cards["delete_customer"], approval.VerdictReject, "never", nil)
	res := recv(t, p2.notify.results, "the run result")
	if res.Approved != 1 || res.Rejected != 2 || res.Answer != "resumed and finished" {
		t.Errorf("result = %+v", res)
	}
	if n := w.sor.count("POST /refunds"); n != 1 {
		t.Errorf("POST /refunds hits = %d, want exactly 1", n)
	}
	if tools := toolMessages(w.lastRequest()); len(tools) != 3 {
		t.Errorf("tool messages = %d, want 3", len(tools))
	}
}

// TestHardCrashLeaseLapses: a process dies without releasing its lease;
// no one adopts the run until the lease lapses, then exactly one of two
// processes resuming at once does.
func TestHardCrashLeaseLapses(t *testing.T) {
	w := newWorld(t)
	p1 := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("h1", "issue_refund", refundArgs)}})
	p1.handle(t, task("refund"))
	card := recv(t, p1.notify.cards, "the card")
	// A hard crash: the connection goes away first, so the lease stays.
	_ = p1.rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p1.agent.Close(ctx)

	lease := w.prefix + ":run:{" + card.RunID + "}:lease"
	if n, err := w.rdb.Exists(context.Background(), lease).Result(); err != nil || n != 1 {
		t.Fatalf("lease %s exists = %d, %v; want it held", lease, n, err)
	}
	p2, p3 := w.start(), w.start()
	if n, _ := p2.agent.Resume(context.Background()); n != 0 {
		t.Fatalf("Resume while the lease is held adopted %d runs", n)
	}
	// The lease lapses (what PX expiry does after LeaseTTL).
	w.rdb.Del(context.Background(), lease)
	var (
		wg    sync.WaitGroup
		total [2]int
	)
	for i, p := range []*process{p2, p3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := p.agent.Resume(context.Background())
			if err != nil {
				t.Errorf("Resume: %v", err)
			}
			total[i] = n
		}()
	}
	wg.Wait()
	if total[0]+total[1] != 1 {
		t.Fatalf("runs adopted by two processes at once = %v, want exactly one in all", total)
	}
	owner := p2
	if total[1] == 1 {
		owner = p3
	}
	w.model.Enqueue(scripted.Reply{Content: "done after crash"})
	w.decide(card, approval.VerdictApprove, "", nil)
	res := recv(t, owner.notify.results, "the run result")
	if res.Answer != "done after crash" || w.sor.count("POST /refunds") != 1 {
		t.Errorf("result = %+v, refunds = %d; want done and exactly one refund", res, w.sor.count("POST /refunds"))
	}
}

// blockingTool is a library tool that is not idempotent; Run blocks until
// released.
type blockingTool struct {
	started chan struct{}
	release chan struct{}
	mu      sync.Mutex // guards runs
	runs    int
}

func (b *blockingTool) Name() string        { return "wire_money" }
func (b *blockingTool) Description() string { return "Wire money." }
func (b *blockingTool) Schema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"amount":{"type":"number"}},"required":["amount"]}`)
}
func (b *blockingTool) Risk() approval.Risk    { return approval.RiskHigh }
func (b *blockingTool) Capabilities() []string { return []string{"spend_money"} }
func (b *blockingTool) Preview(ctx context.Context, args json.RawMessage) (approval.Preview, error) {
	return approval.Preview{Facts: []approval.Fact{{Label: "Account", Value: "ACME"}}}, nil
}
func (b *blockingTool) Run(ctx context.Context, inv agent.Invocation) (string, error) {
	b.mu.Lock()
	b.runs++
	b.mu.Unlock()
	b.started <- struct{}{}
	<-b.release
	return "wired", nil
}

func (b *blockingTool) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs
}

// TestOutcomeUnknownNotRunTwice: the process stops while a non-idempotent
// tool runs; the process that adopts the run marks the outcome unknown,
// tells the model and the thread, and never runs it again.
func TestOutcomeUnknownNotRunTwice(t *testing.T) {
	w := newWorld(t)
	tool := &blockingTool{started: make(chan struct{}, 4), release: make(chan struct{})}
	p1 := w.start(withTools(tool))
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("w1", "wire_money", `{"amount":100,"confidence":0.99}`)}})
	p1.handle(t, task("wire it"))
	card := recv(t, p1.notify.cards, "the card")
	w.decide(card, approval.VerdictApprove, "", nil)
	recv(t, tool.started, "the tool to start")
	// The process dies mid-execution: nothing recorded, lease abandoned.
	_ = p1.rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p1.agent.Close(ctx)
	w.rdb.Del(context.Background(), w.prefix+":run:{"+card.RunID+"}:lease") // the lease lapses

	w.model.Enqueue(scripted.Reply{Content: "told the user"})
	p2 := w.start(withTools(tool))
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	say := recv(t, p2.notify.says, "the outcome-unknown note")
	if !strings.Contains(say, "unknown") || !strings.Contains(say, card.ID) {
		t.Errorf("thread note = %q", say)
	}
	res := recv(t, p2.notify.results, "the run result")
	if res.Answer != "told the user" {
		t.Errorf("result = %+v", res)
	}
	if got := w.request(card.ID).Status; got != approval.StatusUnknown {
		t.Errorf("request status = %s, want unknown", got)
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.HasPrefix(tools[0].Content, "Outcome unknown: wire_money") {
		t.Errorf("tool messages = %+v, want the outcome-unknown note", tools)
	}
	if got := w.countEvents(approval.EventOutcomeUnknown); got != 1 {
		t.Errorf("outcome_unknown audit entries = %d, want 1", got)
	}
	close(tool.release) // the old process's call returns; its outcome is refused
	if got := tool.count(); got != 1 {
		t.Errorf("wire_money ran %d times, want 1", got)
	}
}

// TestHTTPToolRetriedAfterCrash: an HTTP tool claimed by a process that
// stopped before recording the outcome is sent again with the same
// Idempotency-Key (the system of record de-duplicates).
func TestHTTPToolRetriedAfterCrash(t *testing.T) {
	w := newWorld(t)
	p1 := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("r1", "issue_refund", refundArgs)}})
	p1.handle(t, task("refund"))
	card := recv(t, p1.notify.cards, "the card")
	if err := p1.agent.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	// A process claimed it and died before its outcome was recorded.
	if _, err := w.store.Claim(context.Background(), card.ID, "dead-process", "", ""); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	w.model.Enqueue(scripted.Reply{Content: "retried"})
	p2 := w.start()
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	recv(t, p2.notify.results, "the run result")
	hits := w.sor.requests("POST /refunds")
	if len(hits) != 1 || hits[0].Key != card.ID {
		t.Fatalf("refund requests = %+v, want one with key %s", hits, card.ID)
	}
	if got := w.request(card.ID).Status; got != approval.StatusExecuted {
		t.Errorf("status = %s, want executed", got)
	}
}

// TestModelRetries: transient model errors are retried with backoff (no
// real sleeping); after the attempts run out the run fails with a clear
// message and nothing executes.
func TestModelRetries(t *testing.T) {
	t.Run("recovers", func(t *testing.T) {
		w := newWorld(t)
		p := w.start()
		w.model.Enqueue(scripted.Reply{Status: 503}, scripted.Reply{Status: 429}, scripted.Reply{Content: "third time lucky"})
		p.handle(t, task("hello"))
		res := recv(t, p.notify.results, "the run result")
		if res.Status != approval.RunDone || res.Answer != "third time lucky" {
			t.Errorf("result = %+v", res)
		}
		if got := fmt.Sprint(*p.sleeps); got != "[1s 2s]" {
			t.Errorf("backoff sleeps = %s, want [1s 2s]", got)
		}
	})
	t.Run("gives up", func(t *testing.T) {
		w := newWorld(t)
		p := w.start()
		w.model.Enqueue(scripted.Reply{Status: 500}, scripted.Reply{Status: 502}, scripted.Reply{Status: 503}, scripted.Reply{Content: "never asked"})
		p.handle(t, task("hello"))
		res := recv(t, p.notify.results, "the run result")
		if res.Status != approval.RunFailed || !strings.Contains(res.Answer, "did not answer after 3 attempt(s)") || !strings.Contains(res.Answer, "Nothing was executed") {
			t.Errorf("result = %+v, want a clear failure", res)
		}
		if n := len(w.model.Requests()); n != 3 {
			t.Errorf("model requests = %d, want 3", n)
		}
	})
}

// TestMaxSteps ends a run that keeps calling tools.
func TestMaxSteps(t *testing.T) {
	w := newWorld(t)
	p := w.start(func(o *agent.Options) { o.MaxSteps = 2 })
	for i := range 3 {
		w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call(fmt.Sprintf("m%d", i), "lookup_order", `{"order_id":"1234"}`)}})
	}
	p.handle(t, task("loop forever"))
	res := recv(t, p.notify.results, "the run result")
	if res.Status != approval.RunMaxSteps || !strings.Contains(res.Answer, "max_steps = 2") {
		t.Errorf("result = %+v, want max_steps", res)
	}
	if n := w.sor.count("GET /orders/1234"); n != 2 {
		t.Errorf("lookups = %d, want 2", n)
	}
}

// TestConfidenceOffered: every tool offered to the model has optional
// confidence and reason properties (the reason under another name when the
// tool has its own "reason" argument); they reach the request, not the
// tool.
func TestConfidenceOffered(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{call("cf", "issue_refund",
			`{"order_id":"1234","amount":64,"reason":"damaged","confidence":0.42,"rationale":"the customer sent photos"}`)}},
		scripted.Reply{Content: "ok"},
	)
	p.handle(t, task("refund"))
	card := recv(t, p.notify.cards, "the card")
	req := w.model.Requests()[0]
	if len(req.Tools) != 4 {
		t.Fatalf("tools offered = %d, want the 4 HTTP tools", len(req.Tools))
	}
	for _, tool := range req.Tools {
		b, _ := json.Marshal(tool.Function.Parameters)
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
			Required   []string                  `json:"required"`
		}
		_ = json.Unmarshal(b, &schema)
		c, ok := schema.Properties["confidence"]
		if !ok || c["type"] != "number" || c["minimum"] != 0.0 || c["maximum"] != 1.0 || c["description"] != agent.ConfidenceDescription {
			t.Errorf("%s: confidence property = %v", tool.Function.Name, c)
		}
		reasonProp := "reason"
		if tool.Function.Name == "issue_refund" {
			reasonProp = "rationale" // the tool has its own reason argument
		}
		if r := schema.Properties[reasonProp]; r["description"] != agent.ReasonDescription {
			t.Errorf("%s: %s property = %v, want the agent's reason", tool.Function.Name, reasonProp, r)
		}
		for _, r := range schema.Required {
			if r == "confidence" || r == reasonProp {
				t.Errorf("%s: %s must stay optional", tool.Function.Name, r)
			}
		}
	}
	if card.Confidence == nil || *card.Confidence != 0.42 || card.Reason != "the customer sent photos" {
		t.Errorf("request confidence/reason = %v / %q", card.Confidence, card.Reason)
	}
	args := argsJSON(t, card.Args)
	if _, has := args["rationale"]; has || args["reason"] != "damaged" {
		t.Errorf("request args = %s, want the tool's own reason and no rationale", card.Args)
	}
	w.decide(card, approval.VerdictReject, "no", nil)
	recv(t, p.notify.results, "the run result")
}

// TestPreview: facts come from the system of record, named by the
// preview's label (never its URL); when it is down the card says so
// plainly and still goes out.
func TestPreview(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("p1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "ok"})
	p.handle(t, task("refund"))
	card := recv(t, p.notify.cards, "the card")
	want := []approval.Fact{{Label: "Customer", Value: "Dana Whitfield"}, {Label: "Shipping paid", Value: "64.00"}, {Label: "Missing", Value: "(not in the system of record)"}}
	if fmt.Sprint(card.Preview.Facts) != fmt.Sprint(want) || card.Preview.Summary != "Refund 64 to Dana Whitfield" || card.Preview.Error != "" ||
		card.Preview.Source != "the order system" {
		t.Errorf("preview = %+v, want facts %v from the order system", card.Preview, want)
	}
	w.decide(card, approval.VerdictReject, "no", nil)
	recv(t, p.notify.results, "the run result")

	w.sor.setPreviewDown(true)
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("p2", "issue_refund", refundArgs)}}, scripted.Reply{Content: "ok"})
	p.handle(t, task("refund again"))
	card = recv(t, p.notify.cards, "the card")
	wantErr := "preview unavailable: GET " + w.sor.srv.URL + "/preview/orders/1234 returned 503"
	if card.Preview.Error != wantErr || len(card.Preview.Facts) != 0 {
		t.Errorf("preview = %+v, want error %q", card.Preview, wantErr)
	}
	w.decide(card, approval.VerdictReject, "no", nil)
	recv(t, p.notify.results, "the run result")
}

// TestCardFailureCancels: a card that cannot be posted cancels the request
// (fail closed) and the model is told.
func TestCardFailureCancels(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	p.notify.failCard = func(*approval.Request) error { return fmt.Errorf("slack is down") }
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("f1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "could not ask"})
	p.handle(t, task("refund"))
	res := recv(t, p.notify.results, "the run result")
	if res.Expired != 1 || w.sor.count("POST /refunds") != 0 {
		t.Errorf("result = %+v, refunds = %d; want the call not run", res, w.sor.count("POST /refunds"))
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.Contains(tools[0].Content, "was cancelled: the approval card could not be posted") {
		t.Errorf("tool messages = %+v", tools)
	}
}

// TestStopOnRejection ends the turn at the first rejection and cancels the
// other pending requests of the batch.
func TestStopOnRejection(t *testing.T) {
	w := newWorld(t)
	p := w.start(func(o *agent.Options) { o.StopOnRejection = true })
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{
		call("s1", "issue_refund", refundArgs),
		call("s2", "delete_customer", `{"customer_id":"C-1"}`),
	}})
	p.handle(t, task("two things"))
	cards := map[string]*approval.Request{}
	for range 2 {
		c := recv(t, p.notify.cards, "a card")
		cards[c.Tool] = c
	}
	w.decide(cards["issue_refund"], approval.VerdictReject, "stop everything", nil)
	res := recv(t, p.notify.results, "the run result")
	if res.Status != approval.RunStopped || !strings.Contains(res.Answer, "stop everything") {
		t.Errorf("result = %+v, want stopped with the reason", res)
	}
	if got := w.request(cards["delete_customer"].ID).Status; got != approval.StatusCancelled {
		t.Errorf("other request = %s, want cancelled", got)
	}
	if n := len(w.model.Requests()); n != 1 {
		t.Errorf("model requests = %d, want 1 (no further step)", n)
	}
}

// TestStopOnRejectionNamesTheApprover: the answer of a run stopped by a
// rejection, and the reason its other requests were cancelled with, name
// the approver as a Slack mention (shown as their name), never a bare id.
// The thread is told each decision before the answer.
func TestStopOnRejectionNamesTheApprover(t *testing.T) {
	w := newWorld(t)
	p := w.start(func(o *agent.Options) { o.StopOnRejection = true })
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{
		call("s1", "issue_refund", refundArgs),
		call("s2", "delete_customer", `{"customer_id":"C-1"}`),
	}})
	p.handle(t, task("two things"))
	cards := map[string]*approval.Request{}
	for range 2 {
		c := recv(t, p.notify.cards, "a card")
		cards[c.Tool] = c
	}
	w.decideAs("U0BOB0001", cards["issue_refund"], approval.VerdictReject, "stop everything", nil)
	res := recv(t, p.notify.results, "the run result")
	bare := strings.ReplaceAll(res.Answer, "<@U0BOB0001>", "")
	if !strings.Contains(res.Answer, "rejected by <@U0BOB0001>") || strings.Contains(bare, "U0BOB0001") {
		t.Errorf("answer = %q, want the approver as a mention only", res.Answer)
	}
	other := w.request(cards["delete_customer"].ID)
	if other.Decision == nil || !strings.Contains(other.Decision.Text, "rejected by <@U0BOB0001>") {
		t.Errorf("cancelled request's reason = %+v, want the approver as a mention", other.Decision)
	}
	p.notify.mu.Lock()
	decided := p.notify.decided
	p.notify.mu.Unlock()
	if len(decided) != 2 {
		t.Errorf("thread told %d decisions before the answer, want 2 (the rejection, the cancellation)", len(decided))
	}
}

// TestFollowUpContinuesThread: a second task in the same thread continues
// the conversation.
func TestFollowUpContinuesThread(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(scripted.Reply{Content: "first answer"}, scripted.Reply{Content: "second answer"})
	first := task("first question")
	p.handle(t, first)
	if res := recv(t, p.notify.results, "first result"); res.Answer != "first answer" {
		t.Fatalf("first = %+v", res)
	}
	follow := first
	follow.Text = "and a follow-up"
	p.handle(t, follow)
	res := recv(t, p.notify.results, "second result")
	if res.Answer != "second answer" {
		t.Fatalf("second = %+v", res)
	}
	var roles []string
	for _, m := range w.lastRequest().Messages {
		roles = append(roles, m.Role+":"+m.Content)
	}
	want := "user:first question,assistant:first answer,user:and a follow-up"
	if got := strings.Join(roles, ","); got != want {
		t.Errorf("conversation = %s, want %s", got, want)
	}
}

// TestScriptedDefaultRules drives the documented demo through the rules:
// lookup first, then email and refund in one batch, then a truthful
// summary, which does not repeat the rejection's reason (the model was
// told it; the task thread's line about the rejection says it once).
func TestScriptedDefaultRules(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	p.handle(t, task("Order 1234 arrived damaged: apologise by email and refund the shipping"))
	cards := map[string]*approval.Request{}
	for range 2 {
		c := recv(t, p.notify.cards, "a card")
		cards[c.Tool] = c
	}
	if got := argsJSON(t, cards["issue_refund"].Args)["amount"]; got != 64.0 {
		t.Errorf("refund amount = %v, want the shipping cost 64", got)
	}
	if got := argsJSON(t, cards["send_email"].Args)["to"]; got != "dana@example.com" {
		t.Errorf("email to = %v, want the customer's address from the lookup", got)
	}
	if cards["issue_refund"].CallID == "" || cards["send_email"].RunID != cards["issue_refund"].RunID {
		t.Errorf("cards not from one batch: %+v", cards)
	}
	w.decide(cards["send_email"], approval.VerdictApprove, "", nil)
	w.decide(cards["issue_refund"], approval.VerdictReject, "Shipping was already refunded last week.", nil)
	res := recv(t, p.notify.results, "the run result")
	const reason = "Shipping was already refunded last week."
	for _, want := range []string{"lookup_order: done", "send_email: done", "issue_refund: Not run: <@U_APPROVER> rejected"} {
		if !strings.Contains(res.Answer, want) {
			t.Errorf("answer = %q, want it to contain %q", res.Answer, want)
		}
	}
	if strings.Contains(res.Answer, reason) {
		t.Errorf("answer = %q, repeats the rejection's reason", res.Answer)
	}
	reqs := w.model.Requests()
	if len(reqs) != 3 {
		t.Fatalf("model requests = %d, want 3 (lookup, batch, answer)", len(reqs))
	}
	var batch []openai.ToolCall
	told := false
	for _, m := range reqs[2].Messages {
		if m.Role == openai.ChatMessageRoleAssistant && len(m.ToolCalls) > 1 {
			batch = m.ToolCalls
		}
		told = told || m.Role == openai.ChatMessageRoleTool && strings.Contains(m.Content, reason)
	}
	if !told {
		t.Errorf("the model was not told the rejection's reason")
	}
	if len(batch) != 2 {
		t.Errorf("parallel batch = %+v, want email and refund together", batch)
	}
}

// TestAskOnce: after an approval, an identical call by the same requester
// runs without a human while the memory lasts.
func TestAskOnce(t *testing.T) {
	w := newWorld(t)
	pol := w.file.Policy
	tp := pol.Tools["issue_refund"]
	tp.Remember = 3600e9
	pol.Tools["issue_refund"] = tp
	gate, err := approval.NewGate(pol)
	if err != nil {
		t.Fatal(err)
	}
	p := w.start(func(o *agent.Options) { o.Gate = gate })
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("a1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "one"})
	th := task("refund")
	p.handle(t, th)
	card := recv(t, p.notify.cards, "the card")
	w.decide(card, approval.VerdictApprove, "", nil)
	recv(t, p.notify.results, "first result")
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("a2", "issue_refund", refundArgs)}}, scripted.Reply{Content: "two"})
	th.Text = "again"
	p.handle(t, th)
	res := recv(t, p.notify.results, "second result")
	if res.AutoRun != 1 {
		t.Errorf("second turn = %+v, want the call run without a human", res)
	}
	if n := w.sor.count("POST /refunds"); n != 2 {
		t.Errorf("refunds = %d, want 2", n)
	}
	if got := w.countEvents(approval.EventRemembered); got != 1 {
		t.Errorf("remembered audit entries = %d, want 1", got)
	}
}

// TestDenyRules: a call a deny rule matches is refused without a card and
// the model is told the policy's reason; an approver's edit that walks
// into a deny rule is refused before it runs.
func TestDenyRules(t *testing.T) {
	const why = "refused by policy: refunds on a disputed charge go through finance"
	t.Run("proposed", func(t *testing.T) {
		w := newWorld(t)
		p := w.start()
		w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("d1", "issue_refund", `{"order_id":"1234","amount":64,"reason":"chargeback opened","confidence":0.9}`)}},
			scripted.Reply{Content: "finance has to do it"})
		p.handle(t, task("refund"))
		res := recv(t, p.notify.results, "the run result")
		if res.Denied != 1 || res.Refused != 0 || w.sor.count("POST /refunds") != 0 || len(p.notify.cards) != 0 {
			t.Fatalf("result = %+v, refunds = %d, cards = %d; want denied by policy (not counted as invalid), none run, no card", res, w.sor.count("POST /refunds"), len(p.notify.cards))
		}
		tools := toolMessages(w.lastRequest())
		if len(tools) != 1 || !strings.Contains(tools[0].Content, why) {
			t.Errorf("tool messages = %+v, want %q", tools, why)
		}
		assertDenialAudited(t, w, "gate")
		if say := recv(t, p.notify.says, "a note in the task thread"); !strings.Contains(say, "issue_refund was refused by policy: refunds on a disputed charge go through finance") {
			t.Errorf("task thread note = %q", say)
		}
	})
	t.Run("edited", func(t *testing.T) {
		w := newWorld(t)
		p := w.start()
		w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("d2", "issue_refund", refundArgs)}}, scripted.Reply{Content: "not refunded"})
		p.handle(t, task("refund"))
		card := recv(t, p.notify.cards, "the card")
		w.decideUnjudged("U_APPROVER", card, json.RawMessage(`{"order_id":"1234","amount":64,"reason":"chargeback"}`), approval.ErrDenied)
		res := recv(t, p.notify.results, "the run result")
		if w.sor.count("POST /refunds") != 0 {
			t.Fatalf("refunds = %d, want 0", w.sor.count("POST /refunds"))
		}
		tools := toolMessages(w.lastRequest())
		if len(tools) != 1 || !strings.Contains(tools[0].Content, "the arguments U_APPROVER entered are "+why) {
			t.Errorf("tool messages = %+v, result %+v", tools, res)
		}
		if got := w.request(card.ID).Status; got != approval.StatusRefused {
			t.Errorf("status = %s, want refused (never runs later)", got)
		}
		assertDenialAudited(t, w, "gate")
	})
}

func assertDenialAudited(t *testing.T, w *world, actor string) {
	t.Helper()
	for _, e := range w.events() {
		if e.Event == approval.EventCallRefused && e.Actor == actor && strings.Contains(string(e.Data), `"deny_rule":"args.reason.contains(\"chargeback\")"`) {
			return
		}
	}
	t.Errorf("no call_refused entry by %s naming the deny rule", actor)
}

// TestPreauthorization: once an approver granted "approve and allow" on a
// refund, the next refund in the same task thread by the same requester
// runs without a card (audited as preauthorized); a refund in another
// thread still gets a card.
func TestPreauthorization(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	first := task("refund order 1234")
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("g1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "refunded"})
	p.handle(t, first)
	card := recv(t, p.notify.cards, "the first card")
	now := time.Now()
	g := &approval.Grant{ID: "grant_t", Tool: "issue_refund", Requester: card.Requester, Origin: card.Origin,
		GrantedBy: "U_APPROVER", RequestID: card.ID, Created: now, Expires: now.Add(time.Hour)}
	if err := w.store.PutGrant(context.Background(), g); err != nil {
		t.Fatalf("PutGrant = %v", err)
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	recv(t, p.notify.results, "the first result")

	follow := first
	follow.EventID = approval.NewID("ev")
	follow.Text = "and refund the other item too"
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("g2", "issue_refund", `{"order_id":"1234","amount":12,"reason":"second item","confidence":0.9}`)}},
		scripted.Reply{Content: "both refunded"})
	p.handle(t, follow)
	res := recv(t, p.notify.results, "the follow-up result")
	if res.Preauthorized != 1 || res.AutoRun != 0 || !slices.Equal(res.PreauthorizedBy, []string{"U_APPROVER"}) || len(p.notify.cards) != 0 || w.sor.count("POST /refunds") != 2 {
		t.Fatalf("follow-up = %+v, cards %d, refunds %d; want it run under U_APPROVER's grant (not counted as unreviewed), no card",
			res, len(p.notify.cards), w.sor.count("POST /refunds"))
	}
	var found bool
	for _, e := range w.events() {
		if e.Event == approval.EventPreauthorized && e.Actor == "gate" && strings.Contains(string(e.Data), `"grant_id":"grant_t"`) &&
			strings.Contains(string(e.Data), `"granted_by":"U_APPROVER"`) {
			found = true
		}
	}
	if !found {
		t.Error("no preauthorized audit entry naming the grant and who gave it")
	}
	if say := recv(t, p.notify.says, "a note in the granting card's thread"); !strings.Contains(say, "under this pre-authorisation") || !strings.Contains(say, `"amount":12`) {
		t.Errorf("note = %q, want the call that ran under the grant", say)
	}

	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("g3", "issue_refund", refundArgs)}}, scripted.Reply{Content: "asked"})
	p.handle(t, task("refund order 1234 again, elsewhere"))
	other := recv(t, p.notify.cards, "a card in another thread")
	w.decide(other, approval.VerdictReject, "not here", nil)
	recv(t, p.notify.results, "the other thread's result")
}

// TestHTTPErrorIsAResult: a non-2xx answer is an error result for the
// model, and the request is recorded failed.
func TestHTTPErrorIsAResult(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("x1", "issue_refund", `{"order_id":"1234","amount":9999,"reason":"x"}`)}}, scripted.Reply{Content: "ok"})
	p.handle(t, task("refund"))
	card := recv(t, p.notify.cards, "the card")
	w.decide(card, approval.VerdictApprove, "", nil)
	recv(t, p.notify.results, "the run result")
	tools := toolMessages(w.lastRequest())
	want := "error: POST " + w.sor.srv.URL + "/refunds returned 422"
	if len(tools) != 1 || !strings.HasPrefix(tools[0].Content, want) {
		t.Errorf("tool messages = %+v, want %q…", tools, want)
	}
	if got := w.request(card.ID).Status; got != approval.StatusFailed {
		t.Errorf("status = %s, want failed", got)
	}
}

// approveRefund has the model propose one refund, then answer "All
// done.", and an approver approve the refund's card, which it returns.
func approveRefund(t *testing.T, w *world, p *process) *approval.Request {
	t.Helper()
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{call("call_1", "issue_refund", refundArgs)}},
		scripted.Reply{Content: "All done."},
	)
	p.handle(t, task("please handle it"))
	card := recv(t, p.notify.cards, "the approval card")
	w.decide(card, approval.VerdictApprove, "", nil)
	return card
}

// TestDecisionLineAfterClaim: the task thread's decision line of an
// approved call is posted once the call is claimed and its execution
// audited, not beside the claim: on the way from the click to the tool
// the Slack post (and, against the local workspace, all it sets off)
// does not share the machine with the claim's round trips.
func TestDecisionLineAfterClaim(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	type seen struct {
		status    approval.Status
		executing bool
		err       error
	}
	at := make(chan seen, 4)
	p.notify.onDecided = func(r *approval.Request) {
		if r.Status != approval.StatusApproved {
			return
		}
		var s seen
		cur, err := w.store.Request(context.Background(), r.ID)
		if err != nil {
			s.err = err
		} else {
			s.status = cur.Status
		}
		es, err := w.audit.Range(context.Background(), "", 10000)
		s.err = cmp.Or(s.err, err)
		for _, e := range es {
			s.executing = s.executing || e.Event == approval.EventExecuting && e.RequestID == r.ID
		}
		at <- s
	}
	approveRefund(t, w, p)
	got := recv(t, at, "the decision line")
	claimed := got.status == approval.StatusExecuting || got.status == approval.StatusExecuted // the tool may be done already
	if got.err != nil || !claimed || !got.executing {
		t.Errorf("when the decision line was posted: status %s, executing audited %v (err %v); want claimed (executing or executed), audited", got.status, got.executing, got.err)
	}
	if res := recv(t, p.notify.results, "the run result"); res.Status != approval.RunDone {
		t.Errorf("result = %+v, want done", res)
	}
}

// TestToolRunsWhileTheDecisionLineIsPosted: an approved call is claimed and
// run without waiting for the task thread's decision line (a Slack post,
// 100 ms and more), and the run goes on, to its answer, only once that
// line is posted: the thread still reads decision, then the run's answer.
func TestToolRunsWhileTheDecisionLineIsPosted(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	hold := make(chan struct{})
	p.notify.holdApproved = hold
	calls := make(chan sorHit, 4)
	w.sor.mu.Lock()
	w.sor.calls = calls
	w.sor.mu.Unlock()
	approveRefund(t, w, p)
	hit := recv(t, calls, "the refund at the system of record while the decision line is being posted")
	if hit.Method != "POST" || hit.Key == "" {
		t.Errorf("tool call = %+v, want a POST with an Idempotency-Key", hit)
	}
	select {
	case res := <-p.notify.results:
		t.Fatalf("run result %+v before the decision line was posted", res)
	default:
	}
	close(hold)
	res := recv(t, p.notify.results, "the run result")
	if res.Status != approval.RunDone || res.Approved != 1 {
		t.Errorf("result = %+v, want done with one approved call", res)
	}
	p.notify.mu.Lock()
	defer p.notify.mu.Unlock()
	if len(p.notify.decided) == 0 || p.notify.decided[0].Status != approval.StatusApproved {
		t.Errorf("Decided was told %d requests, want the approval first", len(p.notify.decided))
	}
}
