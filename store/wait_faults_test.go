package store_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// liveRounds returns a Round hook and a function that blocks until some
// lane reports at least n live subscriptions (or the test times out).
func liveRounds() (func(lane, keys int), func(tb testing.TB, n int)) {
	ch := make(chan int, 1024)
	hook := func(_, keys int) {
		select {
		case ch <- keys:
		default:
		}
	}
	await := func(tb testing.TB, n int) {
		tb.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case k := <-ch:
				if k >= n {
					return
				}
			case <-timeout:
				tb.Fatalf("no hub lane reported %d live subscriptions", n)
			}
		}
	}
	return hook, await
}

// TestWaitJoinsAtOnce: a Wait registered while the hub already blocks for
// another waiter is woken by a decision without waiting for a round. The
// block timeout is an hour, so a design where a new key joins the next
// round fails the 30 s bound.
func TestWaitJoinsAtOnce(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	round, awaitRound := liveRounds()
	f := mustStore(t, store.Options{BlockTimeout: time.Hour, WaitConns: 1})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook, Round: round})
	first := f.mustCreate(t, nil)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	firstDone := goWait(wctx, f.s, first.ID)
	regs.await(t, first.ID, 1)
	awaitRound(t, 1) // the hub waits for first

	late := f.mustCreate(t, nil)
	ch := goWait(ctx, f.s, late.ID)
	regs.await(t, late.ID, 1)
	if _, err := decide(ctx, f.s, decision(late, approval.VerdictReject, "U1")); err != nil {
		t.Fatalf("Decide(late) = %v", err)
	}
	// a correctness bound, far below the hour a round would take
	res := receive(t, ch, 30*time.Second)
	if res.err != nil || res.r.Status != approval.StatusRejected {
		t.Errorf("Wait(late) = %+v, %v; want rejected", res.r, res.err)
	}
	cancel()
	if res := receive(t, firstDone, 30*time.Second); !errors.Is(res.err, context.Canceled) {
		t.Errorf("Wait(first) after cancel = %v, want context.Canceled", res.err)
	}
}

// TestWaitIgnoresStrayWakeUps: hints and wake elements for unknown
// requests, for final requests nobody waits on, and for a waited request
// that is still pending change nothing; the real decision still wakes the
// waiter with the decided record.
func TestWaitIgnoresStrayWakeUps(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	round, awaitRound := liveRounds()
	f := mustStore(t, store.Options{WaitConns: 1})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook, Round: round})
	r := f.mustCreate(t, nil)
	done := f.mustCreate(t, nil)
	if _, err := decide(ctx, f.s, decision(done, approval.VerdictReject, "U1")); err != nil {
		t.Fatal(err)
	}
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	awaitRound(t, 1)

	wake := func(id string) string { return f.prefix + ":req:{" + id + "}:wake" }
	for _, key := range []string{wake("req_unknown"), wake(done.ID), wake(r.ID)} {
		if err := f.rdb.LPush(ctx, key, "approved").Err(); err != nil {
			t.Fatalf("LPUSH %s = %v", key, err)
		}
		if err := f.rdb.Publish(ctx, key, "approved").Err(); err != nil {
			t.Fatalf("PUBLISH %s = %v", key, err)
		}
		// SPUBLISH where the server has it (not miniredis)
		_ = f.rdb.SPublish(ctx, key, "garbage").Err()
		// hints that look like a record but carry none, or a broken one:
		// the hub reads the record itself (pending: nothing happens)
		for _, msg := range []string{"*", "*6:status8:appro", "*x:y"} {
			if err := f.rdb.Publish(ctx, key, msg).Err(); err != nil {
				t.Fatalf("PUBLISH %s %q = %v", key, msg, err)
			}
			_ = f.rdb.SPublish(ctx, key, msg).Err()
		}
	}
	// Hints on one connection arrive in order: the strays are handled
	// before the decision's own hint.
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
		t.Fatalf("Decide = %v", err)
	}
	res := receive(t, ch, 30*time.Second)
	if res.err != nil || res.r.Status != approval.StatusApproved || res.r.Decision.Approver != "U1" {
		t.Errorf("Wait = %+v, %v; want approved by U1", res.r, res.err)
	}
}

// proxied returns a client that reaches rdb's server through a proxy.
func proxied(tb testing.TB, rdb redis.UniversalClient) (*redis.Client, *storetest.Proxy) {
	tb.Helper()
	c, ok := rdb.(*redis.Client)
	if !ok {
		tb.Skip("the fault tests proxy one node; REDIS_URL names a Cluster")
	}
	p := storetest.NewProxy(tb, c.Options().Addr)
	o := *c.Options()
	o.Addr = p.Addr()
	o.MaxRetries = -1 // see every error
	pc := redis.NewClient(&o)
	tb.Cleanup(func() { _ = pc.Close() })
	return pc, p
}

// TestWaitSurvivesOutage: the hub's connection drops, a decision is made
// (by another process) while it is down, and Redis comes back: the waiter
// gets the decision, the outage is logged once with the number of waits
// it affects, and the hub backs off between attempts instead of spinning.
func TestWaitSurvivesOutage(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := storetest.New(t)
	pc, p := proxied(t, rdb)
	logs := &warnings{}
	regs := newRegistrations()
	round, awaitRound := liveRounds()
	var (
		mu     sync.Mutex // guards pauses
		pauses []time.Duration
	)
	backedOff := make(chan struct{}, 1)
	const block = 200 * time.Millisecond
	f := mustStoreOn(t, pc, prefix, store.Options{BlockTimeout: block, WaitConns: 1, Logger: slog.New(logs)})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook, Round: round, Backoff: func(_ int, d time.Duration) {
		mu.Lock()
		pauses = append(pauses, d)
		mu.Unlock()
		select {
		case backedOff <- struct{}{}:
		default:
		}
	}})
	other := mustStoreOn(t, rdb, prefix, store.Options{}) // another process, direct

	rs := []*approval.Request{f.mustCreate(t, nil), f.mustCreate(t, nil)}
	var chans []<-chan waitResult
	for _, r := range rs {
		chans = append(chans, goWait(ctx, f.s, r.ID))
		regs.await(t, r.ID, 1)
	}
	awaitRound(t, 2)

	p.Cut()
	select {
	case <-backedOff: // the hub noticed
	case <-time.After(30 * time.Second):
		t.Fatal("the hub did not notice the outage")
	}
	// Decided while the hub is disconnected: the hint is lost.
	for _, r := range rs {
		if _, err := decide(ctx, other.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
			t.Fatalf("Decide(%s) = %v", r.ID, err)
		}
	}
	// Let a few more attempts fail before Redis comes back.
	for range 3 {
		select {
		case <-backedOff:
		case <-time.After(30 * time.Second):
			t.Fatal("the hub stopped retrying")
		}
	}
	p.Restore()
	for i, ch := range chans {
		res := receive(t, ch, 30*time.Second)
		if res.err != nil || res.r.Status != approval.StatusApproved {
			t.Errorf("Wait(%d) after the outage = %+v, %v; want approved", i, res.r, res.err)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	for i, d := range pauses {
		if d < 10*time.Millisecond || d > block {
			t.Errorf("pause %d = %v, want within [10ms, BlockTimeout %v]", i, d, block)
		}
	}
	var lost, back int
	for _, m := range logs.all() {
		switch {
		case strings.Contains(m, "wake hub lost Redis"):
			lost++
			if !strings.Contains(m, "waits=2") {
				t.Errorf("outage log %q, want waits=2", m)
			}
		case strings.Contains(m, "wake hub reconnected"):
			back++
		}
	}
	if lost != 1 || back != 1 {
		t.Errorf("outage logged %d times, recovery %d times; want once each (logs: %q)", lost, back, logs.all())
	}
}

// TestWaitHonoursContextWhileRedisIsDown: with Redis unreachable a Wait
// already waiting returns when its ctx ends, a new Wait fails instead of
// hanging, and Close returns.
func TestWaitHonoursContextWhileRedisIsDown(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := storetest.New(t)
	pc, p := proxied(t, rdb)
	regs := newRegistrations()
	round, awaitRound := liveRounds()
	backedOff := make(chan struct{}, 1)
	f := mustStoreOn(t, pc, prefix, store.Options{BlockTimeout: 200 * time.Millisecond, WaitConns: 1})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook, Round: round, Backoff: func(int, time.Duration) {
		select {
		case backedOff <- struct{}{}:
		default:
		}
	}})
	r := f.mustCreate(t, nil)
	wctx, cancel := context.WithCancel(ctx)
	ch := goWait(wctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	awaitRound(t, 1)

	p.Cut()
	select {
	case <-backedOff:
	case <-time.After(30 * time.Second):
		t.Fatal("the hub did not notice the outage")
	}
	cancel()
	if res := receive(t, ch, 10*time.Second); !errors.Is(res.err, context.Canceled) {
		t.Errorf("Wait during the outage after cancel = %v, want context.Canceled", res.err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
	defer tcancel()
	if res := receive(t, goWait(tctx, f.s, r.ID), 10*time.Second); res.err == nil {
		t.Errorf("Wait started during the outage = %+v, want an error", res.r)
	}
	closed := make(chan struct{})
	go func() {
		_ = f.s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Error("Close during the outage did not return")
	}
}
