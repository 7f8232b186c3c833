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
	if _, err := f.s.Decide(ctx, decision(decided, approval.VerdictApprove, "U1")); err != nil {
		t.Fatal(err)
	}

	if got, err := f.s.ExpireDue(ctx, t0.Add(30*time.Minute)); err != nil || len(got) != 0 {
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
			got, err := f.s.ExpireDue(ctx, now)
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

	_, err := f.s.Decide(ctx, decision(soon, approval.VerdictApprove, "U_LATE"))
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
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	const n = 1100 // more than two pages
	for i := range n {
		r := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Hour + time.Duration(i)*time.Second) })
		if i%100 == 0 { // some are decided already
			if _, err := f.s.Decide(ctx, decision(r, approval.VerdictReject, "U1")); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(48 * time.Hour) })
	got, err := f.s.ExpireDue(ctx, t0.Add(24*time.Hour))
	if err != nil || len(got) != n-n/100 {
		t.Fatalf("ExpireDue = %d requests, %v; want %d", len(got), err, n-n/100)
	}
	if left, _ := f.rdb.ZCard(ctx, f.prefix+":deadlines").Result(); left != 1 {
		t.Errorf("deadline index size = %d, want 1", left)
	}
}

func TestRunExpiry(t *testing.T) {
	f := mustStore(t, store.Options{})
	tick := make(chan time.Time)
	stopped := make(chan struct{})
	s := store.New(f.rdb, store.Options{
		Prefix: f.prefix,
		Now:    f.clock.Now,
		Ticker: func(time.Duration) (<-chan time.Time, func()) { return tick, func() { close(stopped) } },
	})
	t.Cleanup(func() { _ = s.Close() })
	first := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Minute) })
	f.clock.Advance(2 * time.Minute)

	got := make(chan string, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.RunExpiry(ctx, time.Minute, func(r *approval.Request) { got <- r.ID }) }()
	if id := <-got; id != first.ID {
		t.Fatalf("first run expired %s, want %s", id, first.ID)
	}

	second := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(10 * time.Minute) })
	f.clock.Advance(10 * time.Minute)
	tick <- f.clock.Now()
	if id := <-got; id != second.ID {
		t.Fatalf("tick expired %s, want %s", id, second.ID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("RunExpiry = %v, want nil after cancel", err)
	}
	<-stopped
}

// TestRunExpiryCallbackBeforeWake: onExpired sees the request expired and
// durable while no waiter has been woken yet (the audit entry comes before
// the agent's reaction); the waiter then gets the expiry as a rejection.
func TestRunExpiryCallbackBeforeWake(t *testing.T) {
	regs := newRegistrations()
	f := mustStore(t, store.Options{})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Minute) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	f.clock.Advance(2 * time.Minute)

	wake := f.prefix + ":req:{" + r.ID + "}:wake"
	called := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- f.s.RunExpiry(ctx, time.Hour, func(got *approval.Request) {
			defer close(called)
			if got.ID != r.ID || got.Status != approval.StatusExpired {
				t.Errorf("onExpired(%s, %s), want %s expired", got.ID, got.Status, r.ID)
			}
			if n := f.rdb.LLen(ctx, wake).Val(); n != 0 {
				t.Errorf("wake list holds %d elements inside onExpired, want 0", n)
			}
			select {
			case res := <-ch:
				t.Errorf("Wait returned %+v inside onExpired, before the wake-up", res)
			default:
			}
		})
	}()
	<-called
	res := receive(t, ch, 5*time.Second)
	if res.err != nil || res.r.Status != approval.StatusExpired || res.r.Decision.Verdict != approval.VerdictExpire {
		t.Fatalf("Wait = %+v, %v; want the expiry", res.r, res.err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("RunExpiry = %v after cancel", err)
	}
}
