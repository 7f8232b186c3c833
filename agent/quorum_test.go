package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// quorumPolicy is testPolicy with issue_refund needing two approvers.
var quorumPolicy = strings.Replace(testPolicy,
	"    decisions: [approve, edit, reject]\n    secret: [reason]\n",
	"    decisions: [approve, edit, reject]\n    quorum: 2\n    secret: [reason]\n", 1)

// TestQuorumEditThenApprove: with quorum 2 an edit resets the approvals to
// the editor and a second approver completes the quorum with an approve.
// The arguments that run are still an approver's edit: they are validated
// against the schema, and the model is told what changed and by whom.
func TestQuorumEditThenApprove(t *testing.T) {
	if !strings.Contains(quorumPolicy, "quorum: 2") {
		t.Fatal("quorumPolicy: issue_refund not found in testPolicy")
	}
	tests := []struct {
		name string
		edit string
		// refusal is how the door refuses the edit (nil: it accepts it);
		// a refused edit is recorded as a record older than the policy
		// would hold it, and the agent's own check must stop it.
		refusal   error
		wantHits  int
		wantState approval.Status
		wantTool  string
		wantTally func(approval.RunResult) bool
	}{
		{name: "invalid edit never runs", edit: `{"order_id":"1234","amount":-5,"reason":"x"}`, refusal: approval.ErrInvalidArgs,
			wantHits: 0, wantState: approval.StatusRefused, wantTool: "Not run: the arguments U_EDITOR entered are invalid",
			wantTally: func(r approval.RunResult) bool { return r.Refused == 1 && r.Approved == 0 && r.Edited == 0 }},
		{name: "valid edit runs and is reported as an edit", edit: `{"order_id":"1234","amount":40,"reason":"x"}`,
			wantHits: 1, wantState: approval.StatusExecuted, wantTool: "amount: 64 → 40",
			wantTally: func(r approval.RunResult) bool { return r.Edited == 1 && r.Approved == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorldPolicy(t, quorumPolicy)
			p := w.start()
			w.model.Enqueue(
				scripted.Reply{ToolCalls: []scripted.Call{call("q1", "issue_refund", refundArgs)}},
				scripted.Reply{Content: "ok"},
			)
			p.handle(t, task("refund"))
			card := recv(t, p.notify.cards, "the card")
			if card.Quorum != 2 {
				t.Fatalf("card quorum = %d, want 2", card.Quorum)
			}
			var edited *approval.Request
			if tt.refusal != nil {
				edited = w.decideUnjudged("U_EDITOR", card, json.RawMessage(tt.edit), tt.refusal)
			} else {
				edited = w.decideAs("U_EDITOR", card, approval.VerdictEdit, "", json.RawMessage(tt.edit))
			}
			if edited.Status != approval.StatusPending {
				t.Fatalf("after the edit: status %s, want pending (quorum 2)", edited.Status)
			}
			final := w.decideAs("U_SECOND", edited, approval.VerdictApprove, "", nil)
			if final.Status != approval.StatusApproved || final.Decision.Verdict != approval.VerdictApprove {
				t.Fatalf("after the second approval: %s %+v, want approved by approve", final.Status, final.Decision)
			}
			res := recv(t, p.notify.results, "the run result")
			if n := w.sor.count("POST /refunds"); n != tt.wantHits {
				t.Errorf("POST /refunds hits = %d, want %d", n, tt.wantHits)
			}
			if got := w.request(card.ID).Status; got != tt.wantState {
				t.Errorf("request status = %s, want %s", got, tt.wantState)
			}
			tools := toolMessages(w.lastRequest())
			if len(tools) != 1 || !strings.Contains(tools[0].Content, tt.wantTool) {
				t.Errorf("tool messages = %+v, want one containing %q", tools, tt.wantTool)
			}
			if !tt.wantTally(res) {
				t.Errorf("run result = %+v", res)
			}
		})
	}
}

// TestLeaseLostBeforeClaim: the run's lease lapsed (a whole TTL passed
// without a renewal) and another process took the run over, but this
// process's heartbeat has not ticked since. The decision it then wakes up
// to must not be executed here: the claim is fenced by the lease.
func TestLeaseLostBeforeClaim(t *testing.T) {
	w := newWorld(t)
	tick := make(chan time.Time) // never ticks: the heartbeat cannot notice
	stopped := &logSignal{match: "run stopped", ch: make(chan string, 4)}
	waiting := make(chan string, 4)
	var (
		mu  sync.Mutex // guards now
		now = time.Now()
	)
	p1 := w.start(func(o *agent.Options) {
		o.LeaseTTL = time.Minute
		o.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		o.Ticker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
		o.Logger = slog.New(stopped)
		o.Requests = waitSignal{Requests: o.Requests, ch: waiting}
	})
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("ll", "issue_refund", refundArgs)}})
	p1.handle(t, task("refund"))
	card := recv(t, p1.notify.cards, "the card")
	recv(t, waiting, "the run to wait") // checkpointed as waiting, lease still ours
	ctx := context.Background()
	lease := w.prefix + ":run:{" + card.RunID + "}:lease"
	mu.Lock()
	now = now.Add(time.Minute + time.Second) // the lease's TTL passed unrenewed
	mu.Unlock()
	w.rdb.Set(ctx, lease, "other-process", time.Minute)

	w.decide(card, approval.VerdictApprove, "", nil)
	recv(t, stopped.ch, "the run to stop")
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Fatalf("POST /refunds hits = %d on a process that lost its lease, want 0", n)
	}
	if got := w.request(card.ID).Status; got != approval.StatusApproved {
		t.Errorf("request = %s, want approved and unclaimed (the new owner runs it)", got)
	}
	if owner := w.rdb.Get(ctx, lease).Val(); owner != "other-process" {
		t.Errorf("lease owner = %q, want other-process", owner)
	}
}

// waitSignal is agent.Requests that says when Wait is called.
type waitSignal struct {
	agent.Requests
	ch chan string
}

func (ws waitSignal) Wait(ctx context.Context, id string) (*approval.Request, error) {
	ws.ch <- id
	return ws.Requests.Wait(ctx, id)
}

// createFails is the lifecycle's approval.Records whose CreateRequest
// writes the record and then fails, as the store does when its index
// commands fail.
type createFails struct{ *store.Ledger }

func (cf createFails) CreateRequest(ctx context.Context, r *approval.Request, entries func(*approval.Request) []approval.Record) error {
	if err := cf.Ledger.CreateRequest(ctx, r, entries); err != nil {
		return err
	}
	return errors.New("create request: index: connection reset")
}

// withCreateFails makes the process's lifecycle save through createFails.
func withCreateFails(tb testing.TB) processOption {
	return func(o *agent.Options) {
		gate, _ := o.Gate.(*approval.Gate)
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true},
			Records: createFails{store.NewLedger(o.Requests.(*store.Store), o.Auditor)}, Cards: o.Notifier.(approval.Cards), Gate: gate,
		})
		if err != nil {
			tb.Fatalf("NewLifecycle: %v", err)
		}
		o.Lifecycle = life
	}
}

// TestCreateRequestErrorLeavesNothingPending: a request whose save failed
// is reported to the model as not run; if the record got written anyway it
// is cancelled, never left pending for a late click.
func TestCreateRequestErrorLeavesNothingPending(t *testing.T) {
	w := newWorld(t)
	p := w.start(withCreateFails(t))
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{call("cf", "issue_refund", refundArgs)}},
		scripted.Reply{Content: "ok"},
	)
	p.handle(t, task("refund"))
	recv(t, p.notify.results, "the run result")
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.Contains(tools[0].Content, "could not be saved") {
		t.Fatalf("tool messages = %+v, want the not-saved note", tools)
	}
	pending, err := w.store.Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Errorf("Pending() = %d requests (%s: %s), want none", len(pending), pending[0].ID, pending[0].Status)
	}
	var id string
	for _, e := range w.events() {
		if e.Event == approval.EventProposed {
			id = e.RequestID
		}
	}
	r := w.request(id)
	if _, err := w.life.Decide(context.Background(), r, approval.Decision{RequestID: id, Verdict: approval.VerdictApprove, Approver: "U_LATE", Digest: r.Digest, At: time.Now()}, approval.DecideOptions{}); !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Errorf("late Decide = %v, want ErrAlreadyDecided (request %s)", err, r.Status)
	}
}

// extendFails is agent.Runs whose Extend fails while fail is set.
type extendFails struct {
	agent.Runs
	fail *atomic.Bool
}

func (ef extendFails) Extend(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	if ef.fail.Load() {
		return false, errors.New("extend: i/o timeout")
	}
	return ef.Runs.Extend(ctx, id, owner, ttl)
}

// TestHeartbeatErrorsStopTheRun: when the lease cannot be renewed for a
// whole TTL it has lapsed, whatever the error: the run stops (and leaves
// the lease alone) instead of waiting on as if it still owned the run.
func TestHeartbeatErrorsStopTheRun(t *testing.T) {
	w := newWorld(t)
	tick := make(chan time.Time) // unbuffered: a send returns once the heartbeat took it
	stopped := &logSignal{match: "run stopped", ch: make(chan string, 4)}
	waiting := make(chan string, 4)
	var (
		fail atomic.Bool
		mu   sync.Mutex // guards now
		now  = time.Now()
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	p := w.start(func(o *agent.Options) {
		o.LeaseTTL = time.Minute
		o.Now = clock
		o.Ticker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
		o.Logger = slog.New(stopped)
		o.Requests = waitSignal{Requests: o.Requests, ch: waiting}
		o.Runs = extendFails{Runs: o.Runs, fail: &fail}
	})
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("hf", "issue_refund", refundArgs)}})
	p.handle(t, task("refund"))
	recv(t, p.notify.cards, "the card")
	recv(t, waiting, "the run to wait")

	fail.Store(true)
	advance(30 * time.Second)
	tick <- time.Now()
	tick <- time.Now() // the first failed extension (half a TTL) is done
	advance(30 * time.Second)
	tick <- time.Now() // a whole TTL without renewal: the lease has lapsed
	recv(t, stopped.ch, "the run to stop")
}

// countExtends is agent.Runs that counts Extend calls.
type countExtends struct {
	agent.Runs
	n *atomic.Int64
}

func (ce countExtends) Extend(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	ce.n.Add(1)
	return ce.Runs.Extend(ctx, id, owner, ttl)
}

// TestFenceTrustsFreshLease: a decision that arrives while the heartbeat's
// last renewal is less than half a TTL old is claimed without asking Redis
// for the lease again (it cannot have lapsed); one that arrives later is
// fenced by a renewal first.
func TestFenceTrustsFreshLease(t *testing.T) {
	for _, tt := range []struct {
		name        string
		after       time.Duration // from the renewal to the decision
		wantExtends int64         // the heartbeat's two, and the fence's
	}{
		{"fresh", 29 * time.Second, 2},
		{"half a TTL old", 31 * time.Second, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t)
			tick := make(chan time.Time) // unbuffered: a send returns once the heartbeat took it
			waiting := make(chan string, 4)
			var (
				extends atomic.Int64
				mu      sync.Mutex // guards now
				now     = time.Now()
			)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			p := w.start(func(o *agent.Options) {
				o.LeaseTTL = time.Minute
				o.Now = clock
				o.Ticker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
				o.Requests = waitSignal{Requests: o.Requests, ch: waiting}
				o.Runs = countExtends{Runs: o.Runs, n: &extends}
			})
			w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("fl", "issue_refund", refundArgs)}}, scripted.Reply{Content: "done"})
			p.handle(t, task("refund"))
			card := recv(t, p.notify.cards, "the card")
			recv(t, waiting, "the run to wait")
			tick <- time.Now()
			tick <- time.Now() // the first renewal is done, the second under way
			mu.Lock()
			now = now.Add(tt.after)
			mu.Unlock()
			w.decide(card, approval.VerdictApprove, "", nil)
			recv(t, p.notify.results, "the run result")
			if n := w.sor.count("POST /refunds"); n != 1 {
				t.Fatalf("POST /refunds hits = %d, want 1", n)
			}
			if got := extends.Load(); got != tt.wantExtends {
				t.Errorf("Extend calls = %d, want %d", got, tt.wantExtends)
			}
		})
	}
}
