package store_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// TestLimiterLeases: a busy key's calls are spent from leases (a tenth of
// a second's worth taken in one round trip) and the shared budget is never
// overspent: two processes spend exactly the budget between them, each
// call of a lease counted once, and a lease not spent in time is lost to
// the budget, not spent later.
func TestLimiterLeases(t *testing.T) {
	rdb, prefix := storetest.New(t)
	ctx := context.Background()
	clock := clocktest.New(clocktest.Opts{})
	a := store.New(rdb, store.Options{Prefix: prefix, Now: clock.Now}).Limiter()
	b := store.New(rdb, store.Options{Prefix: prefix, Now: clock.Now}).Limiter()
	const perMinute = 6000 // leases of 10
	left := func() float64 {
		v, err := rdb.HGet(ctx, prefix+":rate:{k}", "tokens").Result()
		if err != nil {
			t.Fatal(err)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	take := func(l *store.Limiter) bool {
		t.Helper()
		_, ok, err := l.Take(ctx, "k", perMinute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for range 3 {
		if !take(a) {
			t.Fatal("a's call refused with the budget full")
		}
	}
	if got := left(); got != perMinute-10 {
		t.Errorf("after a's three calls the budget has %v left, want %d: one lease of 10 taken, in one round trip", got, perMinute-10)
	}
	spent := 3
	for take(b) {
		spent++
	}
	for take(a) { // the seven left of a's lease
		spent++
	}
	if spent != perMinute {
		t.Errorf("the two processes spent %d calls of a budget of %d, want all of it and no more", spent, perMinute)
	}

	// A lease not spent within its time is lost, never spent late: the
	// call after it expired is a round trip (the budget's time moves).
	clock.Advance(time.Minute) // the budget is full again
	if !take(a) {
		t.Fatal("a's call refused with the budget full again")
	}
	at := func() string { return rdb.HGet(ctx, prefix+":rate:{k}", "at").Val() }
	first := at()
	clock.Advance(10 * time.Millisecond)
	if !take(a) || at() != first {
		t.Errorf("a's call within its lease: budget's time %s, want %s (no round trip)", at(), first)
	}
	clock.Advance(time.Second)
	if !take(a) {
		t.Fatal("a's call refused")
	}
	if at() == first {
		t.Error("a call after a's lease expired was spent from it: the budget was not asked")
	}
}

// TestLimiterRefillsAhead: a steady stream of calls on a busy key waits
// for Redis once, for its first lease: each next lease is taken ahead,
// once half of the one before is spent, and a call that finds the lease
// empty while the refill is on its way waits for it rather than asking
// too. The budget holds at most the calls spent and two leases.
func TestLimiterRefillsAhead(t *testing.T) {
	rdb, prefix := storetest.New(t)
	ctx := context.Background()
	clock := clocktest.New(clocktest.Opts{})
	l := store.New(rdb, store.Options{Prefix: prefix, Now: clock.Now}).Limiter()
	var asks atomic.Int32
	store.SetAskHook(l, func() { asks.Add(1) })
	const perMinute, calls = 6000, 200 // leases of 10
	for i := range calls {
		if _, ok, err := l.Take(ctx, "k", perMinute); err != nil || !ok {
			t.Fatalf("call %d = %v, %v; want let through", i, ok, err)
		}
	}
	if n := asks.Load(); n != 1 {
		t.Errorf("%d calls asked Redis themselves, want 1 (the first): the next leases are taken ahead", n)
	}
	v, err := rdb.HGet(ctx, prefix+":rate:{k}", "tokens").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if taken := perMinute - v; taken < calls || taken > calls+2*10 {
		t.Errorf("%v calls taken from the budget for %d spent, want between %d and %d", taken, calls, calls, calls+20)
	}
}
