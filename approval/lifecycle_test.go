package approval_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// lifeFixture is a lifecycle owner over the records and audit
// stream, on a test clock.
type lifeFixture struct {
	life  *approval.Lifecycle
	rec   *approvaltest.Records
	audit *approvaltest.Auditor
	clock *clocktest.Clock
}

func mustLifecycle(tb testing.TB) lifeFixture {
	tb.Helper()
	clock := clocktest.New(clocktest.Opts{})
	f := lifeFixture{rec: approvaltest.NewRecords(clock.Now), audit: approvaltest.NewAuditor(clock.Now), clock: clock}
	// Edits (and claims) are judged again: the gate knows the refund tool.
	gate := mustRefundGate(tb)
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: approvaltest.NewLedger(f.rec, f.audit), Gate: gate, Now: clock.Now})
	if err != nil {
		tb.Fatalf("NewLifecycle: %v", err)
	}
	f.life = life
	return f
}

// mustRefundGate is a gate that knows the refund tool of these tests:
// edits and claims are judged against it.
func mustRefundGate(tb testing.TB) *approval.Gate {
	tb.Helper()
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {Risk: approval.RiskHigh, Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject}},
	}})
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return gate
}

// create makes a pending refund request through the lifecycle, due in an
// hour; mod adjusts it first.
func (f lifeFixture) create(tb testing.TB, mod func(r *approval.Request)) *approval.Request {
	tb.Helper()
	now := f.clock.Now()
	r := &approval.Request{ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: "U0ALICE",
		Tool: "issue_refund", Args: json.RawMessage(`{"order_id":"1234","amount":64}`),
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
		Quorum:    1, Created: now, Deadline: now.Add(time.Hour)}
	if mod != nil {
		mod(r)
	}
	got, err := f.life.Create(context.Background(), r)
	if err != nil {
		tb.Fatalf("Create: %v", err)
	}
	return got
}

// step is one transition tried on a case's request.
type step struct {
	do   string // approve, reject, respond, edit, cancel_verdict, stale, cancel, expire, advance, bind, claim, finish
	who  string
	arg  string          // edit: the new arguments; advance: a duration
	want error           // the refusal, nil for none
	n    int             // expire: how many requests the sweep ends
	then approval.Status // the request's status after the step
}

// TestLifecycleTransitions walks requests through the lifecycle over the
// records (the store on an embedded Redis): every refusal the store makes (first decision wins,
// one vote per approver, quorum, digest binding, a claim once, the
// deadline), the audit entries each transition writes, in order, and the
// wake-ups of the transitions that made a request final.
func TestLifecycleTransitions(t *testing.T) {
	quorum2 := func(r *approval.Request) { r.Quorum = 2 }
	after := func(r *approval.Request) { r.Mode, r.Decisions = approval.ModeAfter, nil }
	tests := []struct {
		name   string
		mod    func(r *approval.Request)
		steps  []step
		events []approval.Event
		woken  []approval.Status
	}{
		{"quorum of two, claimed once, finished", quorum2, []step{
			{do: "approve", who: "U0BOB", then: approval.StatusPending},
			{do: "approve", who: "U0BOB", want: approval.ErrAlreadyVoted, then: approval.StatusPending},
			{do: "approve", who: "U0CAROL", then: approval.StatusApproved},
			{do: "approve", who: "U0DAN", want: approval.ErrAlreadyDecided, then: approval.StatusApproved},
			{do: "claim", who: "agent-1", then: approval.StatusExecuting},
			{do: "claim", who: "agent-2", want: approval.ErrAlreadyClaimed, then: approval.StatusExecuting},
			{do: "finish", who: "agent-1", then: approval.StatusExecuted},
			{do: "finish", who: "agent-1", want: approval.ErrAlreadyClaimed, then: approval.StatusExecuted},
			{do: "claim", who: "agent-2", want: approval.ErrAlreadyClaimed, then: approval.StatusExecuted},
		}, []approval.Event{approval.EventRequested, approval.EventApprovalVote, approval.EventDecided, approval.EventExecuting, approval.EventExecuted},
			[]approval.Status{approval.StatusApproved}},
		{"first decision wins", nil, []step{
			{do: "reject", who: "U0BOB", then: approval.StatusRejected},
			{do: "approve", who: "U0CAROL", want: approval.ErrAlreadyDecided, then: approval.StatusRejected},
			{do: "claim", who: "agent-1", want: approval.ErrNotApproved, then: approval.StatusRejected},
		}, []approval.Event{approval.EventRequested, approval.EventDecided}, []approval.Status{approval.StatusRejected}},
		{"an approval is bound to the arguments shown", nil, []step{
			{do: "stale", who: "U0BOB", want: approval.ErrStaleArgs, then: approval.StatusPending},
			{do: "approve", who: "U0BOB", then: approval.StatusApproved},
		}, []approval.Event{approval.EventRequested, approval.EventDecided}, []approval.Status{approval.StatusApproved}},
		{"a verdict the request does not offer", nil, []step{
			{do: "respond", who: "U0BOB", want: approval.ErrVerdictNotAllowed, then: approval.StatusPending},
		}, []approval.Event{approval.EventRequested}, nil},
		{"an edit restarts the quorum with the editor", quorum2, []step{
			{do: "approve", who: "U0CAROL", then: approval.StatusPending},
			{do: "edit", who: "U0BOB", arg: `{"order_id":"1234","amount":10}`, then: approval.StatusPending},
			{do: "approve", who: "U0BOB", want: approval.ErrAlreadyVoted, then: approval.StatusPending},
			{do: "approve", who: "U0CAROL", then: approval.StatusApproved},
		}, []approval.Event{approval.EventRequested, approval.EventApprovalVote, approval.EventApprovalVote, approval.EventDecided},
			[]approval.Status{approval.StatusApproved}},
		{"nothing runs unclaimed or unapproved", nil, []step{
			{do: "claim", who: "agent-1", want: approval.ErrNotApproved, then: approval.StatusPending},
			{do: "approve", who: "U0BOB", then: approval.StatusApproved},
			{do: "finish", who: "agent-1", want: approval.ErrNotApproved, then: approval.StatusApproved},
		}, []approval.Event{approval.EventRequested, approval.EventDecided}, []approval.Status{approval.StatusApproved}},
		{"cancel", nil, []step{
			{do: "cancel", who: "agent", then: approval.StatusCancelled},
			{do: "cancel", who: "agent", want: approval.ErrAlreadyDecided, then: approval.StatusCancelled},
			{do: "approve", who: "U0BOB", want: approval.ErrAlreadyDecided, then: approval.StatusCancelled},
		}, []approval.Event{approval.EventRequested, approval.EventCancelled}, []approval.Status{approval.StatusCancelled}},
		{"expired by the sweep at the deadline", nil, []step{
			{do: "advance", arg: "59m", then: approval.StatusPending},
			{do: "expire", n: 0, then: approval.StatusPending},
			{do: "advance", arg: "1m", then: approval.StatusPending},
			{do: "expire", n: 1, then: approval.StatusExpired},
			{do: "expire", n: 0, then: approval.StatusExpired},
			{do: "approve", who: "U0BOB", want: approval.ErrExpired, then: approval.StatusExpired},
		}, []approval.Event{approval.EventRequested, approval.EventExpired}, []approval.Status{approval.StatusExpired}},
		{"a click at the deadline expires it (fail closed)", nil, []step{
			{do: "advance", arg: "1h", then: approval.StatusPending},
			{do: "approve", who: "U0BOB", want: approval.ErrExpired, then: approval.StatusExpired},
		}, []approval.Event{approval.EventRequested, approval.EventExpired}, []approval.Status{approval.StatusExpired}},
		{"a cancel window ends on its card: the call runs", after, []step{
			{do: "bind", then: approval.StatusPending},
			{do: "advance", arg: "1h", then: approval.StatusPending},
			{do: "expire", n: 1, then: approval.StatusApproved},
			{do: "claim", who: "agent-1", then: approval.StatusExecuting},
		}, []approval.Event{approval.EventRequested, approval.EventScheduled, approval.EventCardPosted, approval.EventWindowElapsed, approval.EventExecuting},
			[]approval.Status{approval.StatusApproved}},
		{"a cancel window whose card never posted expires", after, []step{
			{do: "advance", arg: "1h", then: approval.StatusPending},
			{do: "expire", n: 1, then: approval.StatusExpired},
		}, []approval.Event{approval.EventRequested, approval.EventScheduled, approval.EventExpired}, []approval.Status{approval.StatusExpired}},
		{"cancelled in its window", after, []step{
			{do: "bind", then: approval.StatusPending},
			{do: "approve", who: "U0BOB", want: approval.ErrVerdictNotAllowed, then: approval.StatusPending},
			{do: "cancel_verdict", who: "U0BOB", then: approval.StatusRejected},
			{do: "advance", arg: "1h", then: approval.StatusRejected},
			{do: "expire", n: 0, then: approval.StatusRejected},
		}, []approval.Event{approval.EventRequested, approval.EventScheduled, approval.EventCardPosted, approval.EventCancelled}, []approval.Status{approval.StatusRejected}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustLifecycle(t)
			ctx := context.Background()
			r := f.create(t, tt.mod)
			for i, s := range tt.steps {
				cur, err := f.rec.Request(ctx, r.ID)
				if err != nil {
					t.Fatalf("step %d: Request: %v", i, err)
				}
				d := approval.Decision{RequestID: r.ID, Verdict: approval.Verdict(s.do), Approver: s.who, At: f.clock.Now(), Digest: cur.Digest}
				switch s.do {
				case "approve", "reject", "respond":
					_, err = f.life.Decide(ctx, cur, d, approval.DecideOptions{})
				case "edit":
					d.Args = json.RawMessage(s.arg)
					_, err = f.life.Decide(ctx, cur, d, approval.DecideOptions{})
				case "cancel_verdict":
					d.Verdict = approval.VerdictCancel
					_, err = f.life.Decide(ctx, cur, d, approval.DecideOptions{})
				case "stale":
					d.Verdict, d.Digest = approval.VerdictApprove, "0000"
					_, err = f.life.Decide(ctx, cur, d, approval.DecideOptions{})
				case "cancel":
					_, err = f.life.Cancel(ctx, r.ID, s.who, "run stopped")
				case "expire":
					var n int
					n, err = f.life.ExpireDue(ctx)
					if n != s.n {
						t.Errorf("step %d: ExpireDue = %d, want %d", i, n, s.n)
					}
				case "advance":
					d, perr := time.ParseDuration(s.arg)
					if perr != nil {
						t.Fatal(perr)
					}
					f.clock.Advance(d)
				case "bind":
					err = f.life.BindCard(ctx, r, approval.CardRef{Channel: "G0APPROV", TS: "1.000001"})
				case "claim":
					_, err = f.life.Claim(ctx, r.ID, s.who)
				case "finish":
					_, err = f.life.Finish(ctx, r.ID, s.who, approval.Outcome{Status: approval.StatusExecuted, Result: `{"ok":true}`})
				default:
					t.Fatalf("step %d: unknown step %q", i, s.do)
				}
				if s.want == nil && err != nil || s.want != nil && !errors.Is(err, s.want) {
					t.Errorf("step %d (%s by %s) = %v, want %v", i, s.do, s.who, err, s.want)
				}
				if got, _ := f.rec.Request(ctx, r.ID); got.Status != s.then {
					t.Errorf("step %d (%s by %s): status %s, want %s", i, s.do, s.who, got.Status, s.then)
				}
			}
			if got := f.audit.Events(r.ID); !slices.Equal(got, tt.events) {
				t.Errorf("audit events = %v, want %v", got, tt.events)
			}
			if got := f.rec.Woken(r.ID); !slices.Equal(got, tt.woken) {
				t.Errorf("wake-ups = %v, want %v", got, tt.woken)
			}
			var v approval.ChainVerifier
			for _, e := range f.audit.Entries() {
				if err := v.Next(e); err != nil {
					t.Errorf("audit chain: %v", err)
				}
			}
		})
	}
}

// unconfirmedClaims refuses the first claims as a store whose replicas do
// not confirm them does: withdrawn (the record untouched),
// ErrClaimNotConfirmed.
type unconfirmedClaims struct {
	*approvaltest.Ledger
	refuse int
}

func (u *unconfirmedClaims) Claim(ctx context.Context, id, owner, tokenHash, digest string, p approval.Prepared) (*approval.Request, error) {
	if u.refuse > 0 {
		u.refuse--
		return nil, fmt.Errorf("claim %s: 0 of 1 replicas: %w", id, approval.ErrClaimNotConfirmed)
	}
	return u.Ledger.Claim(ctx, id, owner, tokenHash, digest, p)
}

// TestNotRunClaimsAgainWhenNotConfirmed: a call that must not run is
// claimed and failed so it never runs later; when the store's replicas do
// not confirm that claim (withdrawn), NotRun pauses and claims again
// instead of leaving the request approved while the run says "not run".
// It gives up after four claims, the request then left approved.
func TestNotRunClaimsAgainWhenNotConfirmed(t *testing.T) {
	for _, tc := range []struct {
		refuse int
		want   approval.Status
		pauses int
	}{
		{refuse: 2, want: approval.StatusFailed, pauses: 2},
		{refuse: 10, want: approval.StatusApproved, pauses: 3},
	} {
		t.Run(fmt.Sprintf("%d unconfirmed", tc.refuse), func(t *testing.T) {
			f := mustLifecycle(t)
			recs := &unconfirmedClaims{Ledger: approvaltest.NewLedger(f.rec, f.audit), refuse: tc.refuse}
			var pauses []time.Duration
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: recs, Now: f.clock.Now,
				Sleep: func(ctx context.Context, d time.Duration) error { pauses = append(pauses, d); return ctx.Err() }})
			if err != nil {
				t.Fatal(err)
			}
			r := f.create(t, nil)
			ctx := context.Background()
			r, err = f.life.Decide(ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U0BOB", At: f.clock.Now(), Digest: r.Digest}, approval.DecideOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := life.NotRun(ctx, r, "agent", "the tool is not available in this process")
			cur, err := f.rec.Request(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if cur.Status != tc.want || got.Status != tc.want {
				t.Errorf("after NotRun: stored %s, returned %s; want %s", cur.Status, got.Status, tc.want)
			}
			if len(pauses) != tc.pauses {
				t.Errorf("pauses = %v, want %d", pauses, tc.pauses)
			}
		})
	}
}
