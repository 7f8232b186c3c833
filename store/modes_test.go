package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// afterRequest makes a request a review-after one whose card is up: its
// deadline is the end of its cancel window.
func afterRequest(r *approval.Request) {
	r.Mode, r.Risk, r.Decisions = approval.ModeAfter, approval.RiskLow, nil
	r.Deadline = r.Created.Add(5 * time.Minute)
	r.Card = approval.CardRef{Channel: "C0APPROVALS", TS: "1700000000.000001"}
}

// TestReviewAfterDecide: in a cancel window only cancel and run now count,
// and a click at or after the window's end finds the call approved by the
// clock.
func TestReviewAfterDecide(t *testing.T) {
	tests := []struct {
		name        string
		verdict     approval.Verdict
		at          time.Duration // after creation; the window is 5m
		wantStatus  approval.Status
		wantVerdict approval.Verdict
		wantErr     error
	}{
		{"cancel in the window", approval.VerdictCancel, 4 * time.Minute, approval.StatusRejected, approval.VerdictCancel, nil},
		{"run now in the window", approval.VerdictRunNow, time.Minute, approval.StatusApproved, approval.VerdictRunNow, nil},
		{"approve is not a window verdict", approval.VerdictApprove, time.Minute, approval.StatusPending, "", approval.ErrVerdictNotAllowed},
		{"reject is not a window verdict", approval.VerdictReject, time.Minute, approval.StatusPending, "", approval.ErrVerdictNotAllowed},
		{"cancel at the window's end", approval.VerdictCancel, 5 * time.Minute, approval.StatusApproved, approval.VerdictWindowElapsed, approval.ErrAlreadyDecided},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustStore(t, store.Options{})
			r := f.mustCreate(t, afterRequest)
			d := decision(r, tc.verdict, "U_APP")
			d.At = r.Created.Add(tc.at)
			got, err := f.s.RecordDecision(context.Background(), d)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("RecordDecision(%s) error = %v, want %v", tc.verdict, err, tc.wantErr)
			}
			if got == nil {
				t.Fatalf("RecordDecision(%s) returned no record", tc.verdict)
			}
			if got.Status != tc.wantStatus {
				t.Errorf("status = %s, want %s", got.Status, tc.wantStatus)
			}
			if tc.wantVerdict != "" && (got.Decision == nil || got.Decision.Verdict != tc.wantVerdict) {
				t.Errorf("decision = %+v, want verdict %s", got.Decision, tc.wantVerdict)
			}
		})
	}
}

// TestReviewAfterExpiry: the sweep approves a review-after request whose
// window ended (it runs), and expires an ordinary one, and a review-after
// one whose card was never posted (fail closed).
func TestReviewAfterExpiry(t *testing.T) {
	f := mustStore(t, store.Options{})
	after := f.mustCreate(t, afterRequest)
	plain := f.mustCreate(t, func(r *approval.Request) { r.Deadline = after.Deadline })
	// Its card never posted, nobody could cancel: it fails closed.
	unposted := f.mustCreate(t, func(r *approval.Request) { afterRequest(r); r.Card = approval.CardRef{} })
	got, err := f.s.RecordExpiries(context.Background(), after.Deadline)
	if err != nil || len(got) != 3 {
		t.Fatalf("RecordExpiries = %d requests, %v; want 3", len(got), err)
	}
	want := map[string]approval.Status{after.ID: approval.StatusApproved, plain.ID: approval.StatusExpired, unposted.ID: approval.StatusExpired}
	for _, r := range got {
		if r.Status != want[r.ID] {
			t.Errorf("request %s status = %s, want %s", r.ID, r.Status, want[r.ID])
		}
	}
	if ttl := f.rdb.TTL(context.Background(), f.prefix+":req:{"+after.ID+"}").Val(); ttl > 0 {
		t.Errorf("approved record TTL = %v, want none (it runs next)", ttl)
	}
}

// TestCancelRacesWindowEnd: an approver's cancel on one process and the
// sweep at the window's end on another, on the same Redis — at the same
// instant, and in each order: exactly one of them changes the request, and the audit stream has
// exactly one outcome (cancelled or window_elapsed). The cancel is made
// just before the window's end, and at its very end (then it can only
// lose, but it may be the call that ends the window).
func TestCancelRacesWindowEnd(t *testing.T) {
	rounds := 25
	for _, cancelAt := range []time.Duration{-time.Millisecond, 0} {
		t.Run("cancel at window end "+cancelAt.String(), func(t *testing.T) {
			var opts redis.UniversalOptions
			rdbA, prefix := storetest.NewWith(t, func(o *redis.UniversalOptions) { opts = *o })
			rdbB := redis.NewUniversalClient(&opts)
			t.Cleanup(func() { _ = rdbB.Close() })
			a, b := mustStoreOn(t, rdbA, prefix, store.Options{}), mustStoreOn(t, rdbB, prefix, store.Options{})
			audit := store.NewAudit(rdbA, store.AuditOptions{Stream: prefix + ":{audit}"})
			outcomes := map[approval.Status]int{}
			for round := range rounds {
				r := a.mustCreate(t, afterRequest)
				end := r.Deadline
				lifeA, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(a.s, audit), Gate: refundGate(t), Now: func() time.Time { return end }})
				if err != nil {
					t.Fatal(err)
				}
				lifeB, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(b.s, store.NewAudit(rdbB, store.AuditOptions{Stream: prefix + ":{audit}"})), Gate: refundGate(t),
					Now: func() time.Time { return end }})
				if err != nil {
					t.Fatal(err)
				}
				var (
					wg        sync.WaitGroup
					start     = make(chan struct{})
					cancelErr error
					swept     int
					sweepErr  error
				)
				cancel := func() {
					d := decision(r, approval.VerdictCancel, "U_APP")
					d.At, d.Text = end.Add(cancelAt), "not now"
					_, cancelErr = lifeA.Decide(context.Background(), r, d, approval.DecideOptions{})
				}
				sweep := func() { swept, sweepErr = lifeB.ExpireDue(context.Background()) }
				switch round % 3 {
				case 0: // at the same instant
					wg.Add(2)
					go func() { defer wg.Done(); <-start; cancel() }()
					go func() { defer wg.Done(); <-start; sweep() }()
					close(start)
					wg.Wait()
				case 1: // the sweep first: the cancel arrives too late
					sweep()
					cancel()
				case 2: // the cancel first: the sweep finds nothing due
					cancel()
					sweep()
				}
				if sweepErr != nil {
					t.Fatalf("ExpireDue = %v", sweepErr)
				}
				var de *approval.DecidedError
				cancelWon := cancelErr == nil
				cancelEnded := errors.As(cancelErr, &de) && de.Now
				if cancelErr != nil && !errors.As(cancelErr, &de) {
					t.Fatalf("Decide(cancel) = %v, want nil or a DecidedError", cancelErr)
				}
				if changed := btoi(cancelWon) + btoi(cancelEnded) + swept; changed != 1 {
					t.Fatalf("round on %s: cancel won %v, cancel ended the window %v, sweep changed %d: %d transitions, want exactly 1",
						r.ID, cancelWon, cancelEnded, swept, changed)
				}
				cur, err := a.s.Request(context.Background(), r.ID)
				if err != nil {
					t.Fatal(err)
				}
				outcomes[cur.Status]++
				if cur.Status != approval.StatusApproved && cur.Status != approval.StatusRejected {
					t.Errorf("round %d: status %s, want approved (the window ended) or rejected (cancelled)", round, cur.Status)
				}
				if cancelAt == 0 && cur.Status != approval.StatusApproved {
					t.Errorf("a cancel at the window's end left status %s, want approved", cur.Status)
				}
			}
			entries, err := audit.Range(context.Background(), "", 10000)
			if err != nil {
				t.Fatal(err)
			}
			perRequest := map[string]int{}
			for _, e := range entries {
				if e.Event == approval.EventCancelled || e.Event == approval.EventWindowElapsed {
					perRequest[e.RequestID]++
				}
			}
			if len(perRequest) != rounds {
				t.Errorf("requests with an outcome in the audit = %d, want %d", len(perRequest), rounds)
			}
			for id, n := range perRequest {
				if n != 1 {
					t.Errorf("request %s has %d outcomes in the audit, want 1", id, n)
				}
			}
			t.Logf("outcomes over %d rounds: %v", rounds, outcomes)
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRecordFeedback: mark as wrong counts once, on a request a person or
// a sample settled; "looks right" only before any feedback.
func TestRecordFeedback(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	executed := func(tb testing.TB) *approval.Request {
		r := f.mustCreate(tb, nil)
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U_APP")); err != nil {
			tb.Fatal(err)
		}
		if _, err := f.s.Claim(ctx, r.ID, "p1", "", ""); err != nil {
			tb.Fatal(err)
		}
		if _, err := f.s.Finish(ctx, r.ID, approval.StatusExecuted, "ok"); err != nil {
			tb.Fatal(err)
		}
		return r
	}
	rejected := func(tb testing.TB) *approval.Request {
		r := f.mustCreate(tb, nil)
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U_APP")); err != nil {
			tb.Fatal(err)
		}
		return r
	}
	expired := func(tb testing.TB) *approval.Request {
		r := f.mustCreate(tb, nil)
		if _, err := expireDue(ctx, f.s, r.Deadline); err != nil {
			tb.Fatal(err)
		}
		return r
	}
	sampled := func(tb testing.TB) *approval.Request {
		r := request(tb, func(r *approval.Request) {
			r.Mode, r.Status, r.Result, r.Decisions, r.Deadline = approval.ModeSampled, approval.StatusExecuted, "done", nil, time.Time{}
		})
		if err := f.s.CreateRequest(ctx, r); err != nil {
			tb.Fatal(err)
		}
		return r
	}
	wrong := approval.Feedback{Wrong: true, By: "U_APP", Reason: "refunded the wrong order"}
	right := approval.Feedback{By: "U_APP"}
	tests := []struct {
		name  string
		make  func(testing.TB) *approval.Request
		marks []approval.Feedback
		want  []error // per mark
	}{
		{"executed: wrong once", executed, []approval.Feedback{wrong, wrong}, []error{nil, approval.ErrAlreadyMarked}},
		{"rejected: wrong", rejected, []approval.Feedback{wrong}, []error{nil}},
		{"pending: not final", func(tb testing.TB) *approval.Request { return f.mustCreate(tb, nil) }, []approval.Feedback{wrong}, []error{approval.ErrNotFinal}},
		{"expired: nobody decided", expired, []approval.Feedback{wrong}, []error{approval.ErrNotFinal}},
		{"sampled: right, then wrong overrules", sampled, []approval.Feedback{right, right, wrong}, []error{nil, approval.ErrAlreadyMarked, nil}},
		{"sampled: wrong, then right refused", sampled, []approval.Feedback{wrong, right}, []error{nil, approval.ErrAlreadyMarked}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.make(t)
			for i, m := range tc.marks {
				got, err := f.s.RecordFeedback(ctx, r.ID, m)
				if !errors.Is(err, tc.want[i]) || (tc.want[i] == nil && err != nil) {
					t.Fatalf("RecordFeedback #%d (wrong %v) = %v, want %v", i, m.Wrong, err, tc.want[i])
				}
				if err == nil && (got.Feedback == nil || got.Feedback.Wrong != m.Wrong || got.Feedback.Reason != m.Reason) {
					t.Errorf("feedback after #%d = %+v, want %+v", i, got.Feedback, m)
				}
			}
		})
	}
	s := sampled(t)
	if got, err := f.s.Request(ctx, s.ID); err != nil || got.Status != approval.StatusExecuted || got.Result != "done" || got.Mode != approval.ModeSampled {
		t.Errorf("sampled record = %+v, %v", got, err)
	}
	pend, err := f.s.Pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pend {
		if p.ID == s.ID {
			t.Errorf("Pending lists sampled request %s; a sampled request is never pending", s.ID)
		}
	}
	if n := f.rdb.ZScore(ctx, f.prefix+":deadlines", s.ID).Val(); n != 0 {
		t.Errorf("sampled request in the deadline index")
	}
}

// TestSettledRequest: a call the gate settled without a human
// (approval.ModeSettled) is saved final with its status and reason, never
// indexed as pending, due or among the requester's requests for
// approval, and takes no decision; a settled request that is not approved
// or rejected is refused.
func TestSettledRequest(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := request(t, func(r *approval.Request) {
		r.Mode, r.Status, r.Result, r.Decisions = approval.ModeSettled, approval.StatusRejected, "refused by policy: too much", nil
	})
	if err := f.s.CreateRequest(ctx, r); err != nil {
		t.Fatalf("CreateRequest(settled): %v", err)
	}
	got, err := f.s.Request(ctx, r.ID)
	if err != nil || got.Status != approval.StatusRejected || got.Result != "refused by policy: too much" || got.Mode != approval.ModeSettled {
		t.Fatalf("settled record = %+v, %v; want rejected with the gate's reason", got, err)
	}
	pend, err := f.s.Pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pend {
		if p.ID == r.ID {
			t.Errorf("Pending lists settled request %s", r.ID)
		}
	}
	if n := f.rdb.ZScore(ctx, f.prefix+":deadlines", r.ID).Val(); n != 0 {
		t.Errorf("settled request in the deadline index")
	}
	recent, err := f.s.RecentByRequester(ctx, r.Requester, 10)
	if err != nil || len(recent) != 0 {
		t.Errorf("RecentByRequester = %d requests, %v; want none (nobody was asked)", len(recent), err)
	}
	if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP")); !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Errorf("RecordDecision on a settled request = %v, want ErrAlreadyDecided", err)
	}
	bad := request(t, func(r *approval.Request) { r.Mode, r.Status = approval.ModeSettled, approval.StatusPending })
	if err := f.s.CreateRequest(ctx, bad); !errors.Is(err, approval.ErrInvalidArgs) {
		t.Errorf("CreateRequest(settled, pending) = %v, want ErrInvalidArgs", err)
	}
}
