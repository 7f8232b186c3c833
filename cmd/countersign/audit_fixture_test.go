package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// auditEnv is an audit stream for one test: Redis (real when REDIS_URL is
// set, miniredis otherwise), a unique stream key, and the environment set
// so that main.Run(ctx, {"audit", ...}) reads it.
type auditEnv struct {
	rdb    redis.UniversalClient
	url    string
	stream string
	audit  *store.Audit
	clock  *clocktest.Clock
}

// mustAuditEnv makes an auditEnv and points REDIS_URL and
// COUNTERSIGN_AUDIT_STREAM at it.
func mustAuditEnv(tb testing.TB) *auditEnv {
	tb.Helper()
	rdb, prefix := storetest.New(tb)
	url := storetestURL(tb, rdb)
	env := &auditEnv{rdb: rdb, url: url, stream: prefix + ":{audit}", clock: clocktest.New(clocktest.Opts{Start: time.Now()})}
	env.audit = store.NewAudit(rdb, store.AuditOptions{Stream: env.stream, Now: env.clock.Now})
	tb.Setenv("REDIS_URL", url)
	tb.Setenv("COUNTERSIGN_AUDIT_STREAM", env.stream)
	return env
}

// storetestURL is the URL of the Redis storetest connected rdb to.
func storetestURL(tb testing.TB, rdb redis.UniversalClient) string {
	tb.Helper()
	if storetest.Real() {
		return os.Getenv(storetest.EnvURL)
	}
	c, ok := rdb.(*redis.Client)
	if !ok {
		tb.Fatalf("storetest client is %T, want *redis.Client", rdb)
	}
	return fmt.Sprintf("redis://%s/%d", c.Options().Addr, c.Options().DB)
}

// runCLI runs the countersign command line and returns exit code, stdout
// and stderr.
func runCLI(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut strings.Builder
	code := main.Run(ctx, args, main.Stdio{Stdout: &out, Stderr: &errOut})
	return code, out.String(), errOut.String()
}

// append adds one record at time at.
func (env *auditEnv) append(tb testing.TB, at time.Time, r approval.Record) approval.Entry {
	tb.Helper()
	env.clock.Set(at)
	e, err := env.audit.Append(context.Background(), r)
	if err != nil {
		tb.Fatalf("Append(%s %s) = %v", r.Event, r.RequestID, err)
	}
	return e
}

// history is what recordHistory wrote.
type history struct {
	base    time.Time // first request of the recent part
	old     time.Time // the request ten days before
	entries []approval.Entry
	n       int
}

// Request ids of the recorded history.
const (
	reqOld      = "req_old00000000000000000000000" // 10 days ago: refund approved by carol in 1 s
	reqApprove  = "req_approve0000000000000000000" // refund: self-approval refused, alice approves after 4 s, executed in 200 ms
	reqEdit     = "req_edit000000000000000000000a" // refund: bob edits amount 64 → 50 after 60 s, executed in 150 ms
	reqReject   = "req_reject00000000000000000000" // send_email: alice rejects after 3 s
	reqExpire   = "req_expire00000000000000000000" // send_email: nobody decides, expires after 1 h
	reqFailed   = "req_failed00000000000000000000" // refund: alice approves after 2 s, tool fails
	reqQuorum   = "req_quorum00000000000000000000" // refund, quorum 2: bob votes at 20 s, bob's second click refused, alice decides at 30 s
	reqPending  = "req_pending0000000000000000000" // refund: still waiting
	reqBotShape = "req_botshape000000000000000000" // deploy, recorded as agent and bot write it: bob edits after 8 s
	requester   = "U0REQUESTER"
	alice       = "U0ALICE"
	bob         = "U0BOB"
	carol       = "U0CAROL"
	toolRefund  = "refund"
	toolEmail   = "send_email"
	toolDeploy  = "deploy"
	digestOf64  = "d64"
	digestOf50  = "d50"
	historyRun  = "run_fixture000000000000000000"
	emailSecret = "password"
)

// recordHistory appends a known sequence of audit entries through
// store.Audit: one request ten days ago, then seven requests from an hour
// ago covering every outcome. The tests below know its numbers.
func recordHistory(tb testing.TB, env *auditEnv) history {
	tb.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	h := history{base: now.Add(-2 * time.Hour), old: now.Add(-10 * 24 * time.Hour)}
	at := func(t time.Time, r approval.Record) {
		h.entries = append(h.entries, env.append(tb, t, r))
	}
	args64 := map[string]any{"order": "1234", "amount": 64}
	args50 := map[string]any{"order": "1234", "amount": 50}
	requested := func(id, tool string, t time.Time, args map[string]any, quorum int) {
		at(t, approval.Record{Event: approval.EventRequested, RequestID: id, RunID: historyRun, Actor: requester, Tool: tool,
			Secret: []string{emailSecret},
			Data: map[string]any{
				"args": args, "digest": digestOf64, "requester": requester,
				"preview":   approval.Preview{Summary: "Refund order 1234", Facts: []approval.Fact{{Label: "Order total", Value: "$64.00"}}, Source: "demo SoR"},
				"signals":   []approval.Signal{{Code: "sensitive_capability", Text: "capability spend_money is sensitive"}},
				"decisions": []string{"approve", "edit", "reject"}, "quorum": quorum,
				"deadline": t.Add(time.Hour).Format(time.RFC3339), "reason": "customer asked for it",
			}})
	}
	decided := func(id, tool, actor string, t time.Time, data map[string]any) {
		at(t, approval.Record{Event: approval.EventDecided, RequestID: id, RunID: historyRun, Actor: actor, Tool: tool, Data: data})
	}
	executed := func(id, tool string, t time.Time, ms int, result string) {
		at(t, approval.Record{Event: approval.EventExecuting, RequestID: id, RunID: historyRun, Tool: tool})
		at(t.Add(time.Duration(ms)*time.Millisecond), approval.Record{Event: approval.EventExecuted, RequestID: id, RunID: historyRun, Tool: tool,
			Data: map[string]any{"result": result, "duration_ms": ms}})
	}

	// Ten days ago.
	o := h.old
	requested(reqOld, toolRefund, o, args64, 1)
	decided(reqOld, toolRefund, carol, o.Add(time.Second), map[string]any{"verdict": "approve", "digest": digestOf64, "decision_ms": 1000})

	b := h.base
	at(b, approval.Record{Event: approval.EventRunStarted, RunID: historyRun, Actor: requester, Data: map[string]any{"channel": "C0TASKS"}})
	at(b, approval.Record{Event: approval.EventAutoApproved, RunID: historyRun, Tool: "lookup_order", Data: map[string]any{"args": map[string]any{"order": "1234"}}})

	// approve, with a refused self-approval first.
	requested(reqApprove, toolRefund, b, args64, 1)
	at(b.Add(time.Second), approval.Record{Event: approval.EventCardPosted, RequestID: reqApprove, RunID: historyRun, Tool: toolRefund,
		Data: map[string]any{"channel": "C0APPROVALS", "ts": "1700000000.000100"}})
	at(b.Add(2*time.Second), approval.Record{Event: approval.EventDecisionRefuse, RequestID: reqApprove, RunID: historyRun, Actor: requester, Tool: toolRefund,
		Data: map[string]any{"verdict": "approve", "reason": "self_approval"}})
	decided(reqApprove, toolRefund, alice, b.Add(4*time.Second), map[string]any{
		"verdict": "approve", "digest": digestOf64, "created": b.Format(time.RFC3339Nano)})
	executed(reqApprove, toolRefund, b.Add(5*time.Second), 200, "refunded $64.00")

	// edit.
	e := b.Add(10 * time.Second)
	requested(reqEdit, toolRefund, e, args64, 1)
	decided(reqEdit, toolRefund, bob, e.Add(time.Minute), map[string]any{
		"verdict": "edit", "reason": "partial refund only", "digest": digestOf50,
		"args": args50, "original_args": args64, "decision_ms": 60000})
	executed(reqEdit, toolRefund, e.Add(61*time.Second), 150, "refunded $50.00")

	// reject.
	r := b.Add(100 * time.Second)
	requested(reqReject, toolEmail, r, map[string]any{"to": "someone@example.com", emailSecret: "hunter2"}, 1)
	decided(reqReject, toolEmail, alice, r.Add(3*time.Second), map[string]any{
		"verdict": "reject", "reason": "wrong customer", "digest": digestOf64, "decision_ms": 3000})

	// expire.
	x := b.Add(200 * time.Second)
	requested(reqExpire, toolEmail, x, map[string]any{"to": "other@example.com"}, 1)

	// failed.
	f := b.Add(300 * time.Second)
	requested(reqFailed, toolRefund, f, args64, 1)
	decided(reqFailed, toolRefund, alice, f.Add(2*time.Second), map[string]any{"verdict": "approve", "digest": digestOf64, "decision_ms": 2000})
	at(f.Add(3*time.Second), approval.Record{Event: approval.EventExecuting, RequestID: reqFailed, RunID: historyRun, Tool: toolRefund})
	at(f.Add(3*time.Second+80*time.Millisecond), approval.Record{Event: approval.EventFailed, RequestID: reqFailed, RunID: historyRun, Tool: toolRefund,
		Data: map[string]any{"error": "upstream returned 500", "duration_ms": 80}})

	// quorum 2.
	q := b.Add(400 * time.Second)
	requested(reqQuorum, toolRefund, q, args64, 2)
	at(q.Add(20*time.Second), approval.Record{Event: approval.EventApprovalVote, RequestID: reqQuorum, RunID: historyRun, Actor: bob, Tool: toolRefund,
		Data: map[string]any{"verdict": "approve", "digest": digestOf64, "decision_ms": 20000}})
	at(q.Add(25*time.Second), approval.Record{Event: approval.EventDecisionRefuse, RequestID: reqQuorum, RunID: historyRun, Actor: bob, Tool: toolRefund,
		Data: map[string]any{"verdict": "approve", "reason": "already_voted"}})
	decided(reqQuorum, toolRefund, alice, q.Add(30*time.Second), map[string]any{"verdict": "approve", "digest": digestOf64, "decision_ms": 30000})
	executed(reqQuorum, toolRefund, q.Add(31*time.Second), 100, "refunded $64.00")

	// pending.
	requested(reqPending, toolRefund, b.Add(500*time.Second), args64, 1)

	// Recorded with the data agent/loop.go and bot/interactions.go write:
	// the model's reason on proposed, the requester only on run_started, a
	// decision without created/decision_ms/original_args, an outcome
	// without duration_ms.
	g := b.Add(600 * time.Second)
	v1 := map[string]any{"service": "api", "version": "1.2.3"}
	v2 := map[string]any{"service": "api", "version": "1.2.4"}
	at(g, approval.Record{Event: approval.EventProposed, RequestID: reqBotShape, RunID: historyRun, Actor: "model", Tool: toolDeploy,
		Data: map[string]any{"call_id": "call_1", "args": v1, "reason": "release is green", "confidence": 0.9}})
	at(g, approval.Record{Event: approval.EventRequested, RequestID: reqBotShape, RunID: historyRun, Actor: "agent", Tool: toolDeploy,
		Data: map[string]any{"call_id": "call_1", "args": v1, "digest": "dv1", "deadline": g.Add(time.Hour), "quorum": 1,
			"signals": []approval.Signal{{Code: "risk_high", Text: "tool deploy is high risk"}}, "preview_error": "preview unavailable: status 503"}})
	at(g.Add(time.Second), approval.Record{Event: approval.EventCardPosted, RequestID: reqBotShape, RunID: historyRun, Actor: "bot", Tool: toolDeploy,
		Data: map[string]string{"channel": "C0APPROVALS", "ts": "1700000000.000200"}})
	decided(reqBotShape, toolDeploy, bob, g.Add(8*time.Second), map[string]any{
		"verdict": "edit", "digest": "dv1", "status": "approved", "text": "pin to v1.2.4", "args": v2, "new_digest": "dv2"})
	at(g.Add(9*time.Second), approval.Record{Event: approval.EventExecuting, RequestID: reqBotShape, RunID: historyRun, Actor: "owner-1", Tool: toolDeploy,
		Data: map[string]any{"call_id": "call_1", "args": v2, "gated": true, "retry": false}})
	at(g.Add(9*time.Second+300*time.Millisecond), approval.Record{Event: approval.EventExecuted, RequestID: reqBotShape, RunID: historyRun, Actor: "owner-1", Tool: toolDeploy,
		Data: map[string]any{"call_id": "call_1", "result": "deployed v1.2.4"}})

	// The expiry comes last, an hour after its request.
	at(x.Add(time.Hour), approval.Record{Event: approval.EventExpired, RequestID: reqExpire, RunID: historyRun, Tool: toolEmail,
		Data: map[string]any{"deadline": x.Add(time.Hour).Format(time.RFC3339)}})

	at(b.Add(time.Hour+5*time.Minute), approval.Record{Event: approval.EventRunFinished, RunID: historyRun, Data: map[string]any{"status": "done"}})
	h.n = len(h.entries)
	return h
}

// entryOf returns the first history entry with event ev for request id.
func (h history) entryOf(tb testing.TB, id string, ev approval.Event) approval.Entry {
	tb.Helper()
	for _, e := range h.entries {
		if e.RequestID == id && e.Event == ev {
			return e
		}
	}
	tb.Fatalf("history has no %s entry for %s", ev, id)
	return approval.Entry{}
}

// decodeJSONLines decodes JSON Lines into maps.
func decodeJSONLines(tb testing.TB, s string) []map[string]any {
	tb.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			tb.Fatalf("not JSON: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
