package replay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// world records a history through the real lifecycle (Propose, Decide,
// Claim, Finish, Feedback, as the surfaces call them) into a real audit
// stream (Redis when REDIS_URL is set, miniredis otherwise), on a test
// clock: the audit replay reads is the one production writes.
type world struct {
	life  *approval.Lifecycle
	audit *store.Audit
	rdb   redis.UniversalClient
	key   string
	recs  *approvaltest.Records
	clock *clocktest.Clock
	n     int
}

func mustWorld(tb testing.TB, p approval.Policy) *world {
	tb.Helper()
	rdb, prefix := storetest.New(tb)
	w := &world{clock: clocktest.New(clocktest.Opts{}), rdb: rdb, key: prefix + ":{audit}"}
	w.audit = store.NewAudit(rdb, store.AuditOptions{Stream: w.key, Now: w.clock.Now})
	gate, err := approval.NewGate(p)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	w.recs = approvaltest.NewRecords(w.clock.Now)
	w.life = w.lifecycle(tb, gate)
	return w
}

// lifecycle is a lifecycle over the world's records and audit judging
// with gate: a process that holds another policy.
func (w *world) lifecycle(tb testing.TB, gate *approval.Gate) *approval.Lifecycle {
	tb.Helper()
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: approvaltest.NewLedger(w.recs, w.audit), Memory: grantsOnly{w.recs},
		Gate: gate, Directory: approvaltest.Directory{Everyone: true}, Now: w.clock.Now})
	if err != nil {
		tb.Fatalf("NewLifecycle: %v", err)
	}
	return life
}

// propose proposes a call as an outside caller (the HTTP API does) and
// returns what became of it; a call let through is claimed and run.
func (w *world) propose(tb testing.TB, tool, requester, args string) approval.Proposed {
	tb.Helper()
	w.n++
	w.clock.Advance(time.Minute)
	id := approval.NewID("req")
	got, err := w.life.Propose(context.Background(), approval.Proposal{RequestID: id, CallID: id, Tool: tool,
		Args: json.RawMessage(args), Requester: requester, External: true, Settle: true,
		Caller: approval.Caller{Kind: "api", Name: requester}, Timeout: time.Hour})
	if err != nil {
		tb.Fatalf("Propose(%s %s) = %v", tool, args, err)
	}
	if got.Outcome == approval.ProposedAuto {
		w.run(tb, got.Request.ID)
	}
	return got
}

// decide has approver decide r after took; edit is the edited arguments.
func (w *world) decide(tb testing.TB, r *approval.Request, v approval.Verdict, approver string, took time.Duration, edit string) *approval.Request {
	tb.Helper()
	cur, err := w.life.Request(context.Background(), r.ID)
	if err != nil {
		tb.Fatalf("Request(%s) = %v", r.ID, err)
	}
	w.clock.Advance(took)
	d := approval.Decision{RequestID: r.ID, Verdict: v, Approver: approver, At: w.clock.Now(), Digest: cur.Digest}
	switch v {
	case approval.VerdictReject:
		d.Text = "no"
	case approval.VerdictEdit:
		d.Args = json.RawMessage(edit)
	}
	got, err := w.life.Decide(context.Background(), cur, d, approval.DecideOptions{})
	if err != nil {
		tb.Fatalf("Decide(%s %s) = %v", r.ID, v, err)
	}
	return got
}

// run claims and runs an approved request.
func (w *world) run(tb testing.TB, id string) {
	tb.Helper()
	if _, err := w.life.Claim(context.Background(), id, "caller"); err != nil {
		tb.Fatalf("Claim(%s) = %v", id, err)
	}
	if _, err := w.life.Finish(context.Background(), id, "caller", approval.Outcome{Status: approval.StatusExecuted, Result: "ok"}); err != nil {
		tb.Fatalf("Finish(%s) = %v", id, err)
	}
}

// markWrong marks a final request wrong.
func (w *world) markWrong(tb testing.TB, id, by string) {
	tb.Helper()
	if _, err := w.life.Feedback(context.Background(), id, approval.Feedback{Wrong: true, By: by, At: w.clock.Now(), Reason: "should not have run"}); err != nil {
		tb.Fatalf("Feedback(%s) = %v", id, err)
	}
}

// trimOldest deletes the n oldest entries of the stream, as XADD MAXLEN
// does when a stream is capped (AuditOptions.MaxLen).
func (w *world) trimOldest(tb testing.TB, n int64) {
	tb.Helper()
	page, err := w.rdb.XRangeN(context.Background(), w.key, "-", "+", n).Result()
	if err != nil || int64(len(page)) != n {
		tb.Fatalf("XRANGE %s = %d entries, %v", w.key, len(page), err)
	}
	for _, m := range page {
		if err := w.rdb.XDel(context.Background(), w.key, m.ID).Err(); err != nil {
			tb.Fatalf("XDEL %s = %v", m.ID, err)
		}
	}
}

// cut deletes the stream entry at position i (from 0): an entry missing
// inside the period.
func (w *world) cut(tb testing.TB, i int64) {
	tb.Helper()
	page, err := w.rdb.XRangeN(context.Background(), w.key, "-", "+", i+1).Result()
	if err != nil || int64(len(page)) != i+1 {
		tb.Fatalf("XRANGE %s = %d entries, %v", w.key, len(page), err)
	}
	if err := w.rdb.XDel(context.Background(), w.key, page[i].ID).Err(); err != nil {
		tb.Fatalf("XDEL = %v", err)
	}
}

// proposeModel proposes a call as the agent loop does for its own model:
// the run's run_started (who asked) and the model's proposed entry, then
// the lifecycle's Propose.
func (w *world) proposeModel(tb testing.TB, tool, requester, args string, confidence *float64) approval.Proposed {
	tb.Helper()
	ctx := context.Background()
	w.clock.Advance(time.Minute)
	id, run := approval.NewID("req"), approval.NewID("run")
	for _, r := range []approval.Record{
		{Event: approval.EventRunStarted, RunID: run, Actor: requester, Data: approval.RunStartedEvent{Text: "please"}},
		{Event: approval.EventProposed, RequestID: id, RunID: run, Actor: "model", Tool: tool,
			Data: approval.ProposedEvent{CallID: id, Args: json.RawMessage(args), Confidence: confidence}},
	} {
		if _, err := w.audit.Append(ctx, r); err != nil {
			tb.Fatalf("Append(%s) = %v", r.Event, err)
		}
	}
	got, err := w.life.Propose(ctx, approval.Proposal{RequestID: id, RunID: run, CallID: id, Tool: tool,
		Args: json.RawMessage(args), Confidence: confidence, Requester: requester, Timeout: time.Hour})
	if err != nil {
		tb.Fatalf("Propose(%s %s) = %v", tool, args, err)
	}
	return got
}

// proposeIn proposes a call by the model in a task thread (where a grant
// can cover it) and, when a grant let it through, runs it.
func (w *world) proposeIn(tb testing.TB, origin approval.Origin, tool, requester, args string) approval.Proposed {
	tb.Helper()
	w.clock.Advance(time.Minute)
	id := approval.NewID("req")
	conf := 0.9
	if _, err := w.audit.Append(context.Background(), approval.Record{Event: approval.EventProposed, RequestID: id, Actor: "model", Tool: tool,
		Data: approval.ProposedEvent{CallID: id, Args: json.RawMessage(args), Confidence: &conf}}); err != nil {
		tb.Fatalf("Append(proposed) = %v", err)
	}
	got, err := w.life.Propose(context.Background(), approval.Proposal{RequestID: id, CallID: id, Tool: tool, Args: json.RawMessage(args),
		Confidence: &conf, Requester: requester, Origin: origin, Timeout: time.Hour})
	if err != nil {
		tb.Fatalf("Propose(%s %s) = %v", tool, args, err)
	}
	return got
}

// approveAllow approves r with "Approve + allow" (a grant).
func (w *world) approveAllow(tb testing.TB, r *approval.Request, approver string) {
	tb.Helper()
	w.clock.Advance(10 * time.Second)
	d := approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: approver, At: w.clock.Now(), Digest: r.Digest}
	if _, err := w.life.Decide(context.Background(), r, d, approval.DecideOptions{Allow: true}); err != nil {
		tb.Fatalf("Decide(allow %s) = %v", r.ID, err)
	}
}

// grantsOnly is the records' pre-authorisations as the
// lifecycle's Memory, without ask-once memory.
type grantsOnly struct{ *approvaltest.Records }

func (grantsOnly) Remember(context.Context, string, string, string, time.Duration) error { return nil }
func (grantsOnly) Remembered(context.Context, string, string, string) (bool, error) {
	return false, nil
}
