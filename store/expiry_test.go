package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

func TestExpireDue(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	soon := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Hour) })
	later := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(3 * time.Hour) })
	decided := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Hour) })
	if _, err := decide(ctx, f.s, decision(decided, approval.VerdictApprove, "U1")); err != nil {
		t.Fatal(err)
	}

	if got, err := expireDue(ctx, f.s, t0.Add(30*time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("ExpireDue(before deadline) = %v, %v; want none", idsOf(got), err)
	}
	ch := goWait(ctx, f.s, soon.ID)
	regs.await(t, soon.ID, 1)

	// Two processes run expiry at once: exactly one expires the request.
	now := t0.Add(2 * time.Hour)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // guards expired
		expired []string
	)
	start := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			<-start
			got, err := expireDue(ctx, f.s, now)
			if err != nil {
				t.Errorf("ExpireDue = %v", err)
			}
			mu.Lock()
			expired = append(expired, idsOf(got)...)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if len(expired) != 1 || expired[0] != soon.ID {
		t.Fatalf("ExpireDue x2 expired %v, want [%s] once", expired, soon.ID)
	}

	res := receive(t, ch, 5*time.Second)
	if res.err != nil {
		t.Fatalf("Wait = %v", res.err)
	}
	if d := res.r.Decision; res.r.Status != approval.StatusExpired || d == nil || d.Verdict != approval.VerdictExpire ||
		d.Approver != "system" || !d.At.Equal(now) || d.Verdict.Runs() {
		t.Errorf("Wait = %s %+v, want expired by system at %v", res.r.Status, d, now)
	}

	_, err := decide(ctx, f.s, decision(soon, approval.VerdictApprove, "U_LATE"))
	var de *approval.DecidedError
	if !errors.Is(err, approval.ErrExpired) || !errors.As(err, &de) || de.Status != approval.StatusExpired {
		t.Errorf("late Decide = %v, want ErrExpired", err)
	}
	if got, _ := f.s.Request(ctx, decided.ID); got.Status != approval.StatusApproved {
		t.Errorf("decided request status = %s, want approved (untouched)", got.Status)
	}
	pending, err := f.s.Pending(ctx)
	if err != nil || len(pending) != 1 || pending[0].ID != later.ID {
		t.Errorf("Pending = %v, %v; want [%s]", idsOf(pending), err, later.ID)
	}
}

func TestExpireDuePages(t *testing.T) {
	t.Parallel() // slow and independent (its own keys): overlaps with the rest of the package
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	store.SetPageSize(f.s, 50)
	const n = 110 // more than two pages of 50
	for i := range n {
		r := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Hour + time.Duration(i)*time.Second) })
		if i%10 == 0 { // some are decided already
			if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U1")); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(48 * time.Hour) })
	got, err := expireDue(ctx, f.s, t0.Add(24*time.Hour))
	if err != nil || len(got) != n-n/10 {
		t.Fatalf("ExpireDue = %d requests, %v; want %d", len(got), err, n-n/10)
	}
	if left, _ := f.rdb.ZCard(ctx, f.prefix+":deadlines").Result(); left != 1 {
		t.Errorf("deadline index size = %d, want 1", left)
	}
}

// TestRecordExpiriesLeaveWakeToCaller: RecordExpiries makes the expiry
// durable and wakes nobody (the lifecycle owner audits it first); Wake then
// delivers it to the waiter as a rejection.
func TestRecordExpiriesLeaveWakeToCaller(t *testing.T) {
	regs := newRegistrations()
	f := mustStore(t, store.Options{})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Minute) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	f.clock.Advance(2 * time.Minute)

	got, err := f.s.RecordExpiries(ctx, f.clock.Now())
	if err != nil || len(got) != 1 || got[0].ID != r.ID || got[0].Status != approval.StatusExpired {
		t.Fatalf("RecordExpiries = %v, %v; want %s expired", got, err, r.ID)
	}
	wake := f.prefix + ":req:{" + r.ID + "}:wake"
	if n := f.rdb.LLen(ctx, wake).Val(); n != 0 {
		t.Errorf("wake list holds %d elements after RecordExpiries, want 0", n)
	}
	select {
	case res := <-ch:
		t.Fatalf("Wait returned %+v before the wake-up", res)
	default:
	}
	if err := f.s.Wake(ctx, r.ID, approval.StatusExpired); err != nil {
		t.Fatalf("Wake = %v", err)
	}
	res := receive(t, ch, 5*time.Second)
	if res.err != nil || res.r.Status != approval.StatusExpired || res.r.Decision.Verdict != approval.VerdictExpire {
		t.Fatalf("Wait = %+v, %v; want the expiry", res.r, res.err)
	}
	if again, err := f.s.RecordExpiries(ctx, f.clock.Now()); err != nil || len(again) != 0 {
		t.Errorf("second RecordExpiries = %v, %v; want nothing (each expiry once)", again, err)
	}
}
