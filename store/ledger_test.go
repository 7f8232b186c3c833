package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// TestLedgerOneWayOrAnother: whether the ledger sends a transition's entry
// and wake-up in the transition's round trip (an *Audit on the store's
// client, a single node) or one after the other (any other auditor, as on
// a Cluster), every transition through the lifecycle writes the same
// entries, in the same order, and wakes the same requests: an approval
// that completes the quorum, one that only counts toward it, a rejection,
// a click after the deadline (which expires the request), the sweep of a
// deadline, a cancel, and a claim and its finish.
func TestLedgerOneWayOrAnother(t *testing.T) {
	type outcome struct {
		events [][]approval.Event // per step's request, in order
		woken  []bool
	}
	run := func(t *testing.T, oneTrip bool) outcome {
		f := mustStore(t, store.Options{})
		audit := store.NewAudit(f.rdb, store.AuditOptions{Stream: f.prefix + ":{audit}", Now: f.clock.Now, Wakes: f.s})
		var au approval.Auditor = audit
		if !oneTrip {
			au = struct{ approval.Auditor }{audit} // not this package's: one write at a time
		}
		l, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true},
			Records: store.NewLedger(f.s, au), Now: f.clock.Now, Gate: refundGate(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		create := func(edit func(*approval.Request)) *approval.Request {
			r, err := l.Create(ctx, request(t, func(r *approval.Request) {
				r.Args = json.RawMessage(`{"amount":12.5}`)
				if edit != nil {
					edit(r)
				}
			}))
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			return r
		}
		decide := func(r *approval.Request, v approval.Verdict, who string) {
			d := decision(r, v, who)
			d.At = f.clock.Now()
			if _, err := l.Decide(ctx, r, d, approval.DecideOptions{}); err != nil && v != approval.VerdictApprove {
				t.Fatalf("Decide(%s): %v", v, err)
			}
		}
		var ids []string
		approved := create(nil)
		decide(approved, approval.VerdictApprove, "U_A")
		counted := create(func(r *approval.Request) { r.Quorum = 2 })
		decide(counted, approval.VerdictApprove, "U_A")
		rejected := create(nil)
		decide(rejected, approval.VerdictReject, "U_A")
		late := create(func(r *approval.Request) { r.Deadline = f.clock.Now().Add(time.Second) })
		swept := create(func(r *approval.Request) { r.Deadline = f.clock.Now().Add(time.Second) })
		cancelled := create(nil)
		if _, err := l.Cancel(ctx, cancelled.ID, "agent", "the run stopped"); err != nil {
			t.Fatal(err)
		}
		f.clock.Set(f.clock.Now().Add(2 * time.Second))
		decide(late, approval.VerdictApprove, "U_A") // expires it
		if _, err := l.ExpireDue(ctx); err != nil {
			t.Fatal(err)
		}
		ran, err := l.Request(ctx, approved.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.ClaimRequest(ctx, ran, "proc-1"); err != nil {
			t.Fatalf("ClaimRequest: %v", err)
		}
		if _, err := l.Finish(ctx, ran.ID, "proc-1", approval.Outcome{Status: approval.StatusExecuted, Result: "ok"}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, approved.ID, counted.ID, rejected.ID, late.ID, swept.ID, cancelled.ID)

		entries, err := audit.Range(ctx, "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := audit.Verify(ctx); err != nil || n != len(entries) {
			t.Fatalf("Verify = %d, %v; want %d entries chained", n, err, len(entries))
		}
		var out outcome
		for _, id := range ids {
			var evs []approval.Event
			for _, e := range entries {
				if e.RequestID == id {
					evs = append(evs, e.Event)
				}
			}
			out.events = append(out.events, evs)
			out.woken = append(out.woken, woken(t, f, id))
		}
		return out
	}
	one, other := run(t, true), run(t, false)
	names := []string{"approved", "counted", "rejected", "late click", "swept", "cancelled"}
	for i, name := range names {
		if !slices.Equal(one.events[i], other.events[i]) {
			t.Errorf("%s: entries in one trip %v, one at a time %v", name, one.events[i], other.events[i])
		}
		if one.woken[i] != other.woken[i] {
			t.Errorf("%s: woken in one trip %v, one at a time %v", name, one.woken[i], other.woken[i])
		}
	}
	// What each should be, whichever way.
	want := [][]approval.Event{
		{approval.EventRequested, approval.EventDecided, approval.EventExecuting, approval.EventExecuted},
		{approval.EventRequested, approval.EventApprovalVote},
		{approval.EventRequested, approval.EventDecided},
		{approval.EventRequested, approval.EventExpired},
		{approval.EventRequested, approval.EventExpired},
		{approval.EventRequested, approval.EventCancelled},
	}
	wantWoken := []bool{true, false, true, true, true, true}
	for i, name := range names {
		if !slices.Equal(one.events[i], want[i]) {
			t.Errorf("%s: entries %v, want %v", name, one.events[i], want[i])
		}
		if one.woken[i] != wantWoken[i] {
			t.Errorf("%s: woken %v, want %v", name, one.woken[i], wantWoken[i])
		}
	}
}
