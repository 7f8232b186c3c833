package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// waitResult is what a Wait call in a goroutine returned.
type waitResult struct {
	r   *approval.Request
	err error
}

// goWait runs Wait in a goroutine and returns its result channel.
func goWait(ctx context.Context, s *store.Store, id string) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		r, err := s.Wait(ctx, id)
		ch <- waitResult{r, err}
	}()
	return ch
}

// receive returns the result or fails after bound.
func receive(tb testing.TB, ch <-chan waitResult, bound time.Duration) waitResult {
	tb.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(bound):
		tb.Fatalf("Wait did not return within %v", bound)
		return waitResult{}
	}
}

func TestWait(t *testing.T) {
	const block = time.Second
	tests := []struct {
		name    string
		waiters int
		// act runs with a Wait already registered (or, for before, none).
		before bool // decide before Wait starts
	}{
		{name: "decided before wait", waiters: 1, before: true},
		{name: "decided while waiting", waiters: 1},
		{name: "several waiters on one request", waiters: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			regs := newRegistrations()
			f := mustStore(t, store.Options{BlockTimeout: block})
			store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
			r := f.mustCreate(t, nil)
			if tt.before {
				if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
					t.Fatal(err)
				}
			}
			var chans []<-chan waitResult
			for range tt.waiters {
				chans = append(chans, goWait(ctx, f.s, r.ID))
			}
			if !tt.before {
				regs.await(t, r.ID, tt.waiters)
				if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
					t.Fatal(err)
				}
			}
			for i, ch := range chans {
				// a key registered mid-round joins the next BLPOP: allow a few rounds
				res := receive(t, ch, 5*block)
				if res.err != nil || res.r.Status != approval.StatusApproved || res.r.Decision.Approver != "U1" {
					t.Errorf("waiter %d: Wait = %+v, %v; want approved by U1", i, res.r, res.err)
				}
			}
		})
	}
}

func TestWaitDecisionWhileNobodyWaits(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, nil)

	// A process waits, then goes away (deploy, crash) before the decision.
	wctx, cancel := context.WithCancel(ctx)
	ch := goWait(wctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	cancel()
	if res := receive(t, ch, 5*time.Second); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", res.err)
	}
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U1")); err != nil {
		t.Fatal(err)
	}
	// A new process (a second Store on the same Redis) resumes the wait.
	resumed := mustStoreOn(t, f.rdb, f.prefix, store.Options{})
	got, err := resumed.s.Wait(ctx, r.ID)
	if err != nil || got.Status != approval.StatusRejected {
		t.Fatalf("Wait after restart = %+v, %v; want rejected", got, err)
	}
}

func TestWaitCancelReturnsWithinOneRound(t *testing.T) {
	tests := []struct {
		name  string
		block time.Duration
	}{
		{"whole seconds", time.Second},
		{"fractional", 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			regs := newRegistrations()
			f := mustStore(t, store.Options{BlockTimeout: tt.block})
			store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
			r := f.mustCreate(t, nil)
			ctx, cancel := context.WithCancel(context.Background())
			ch := goWait(ctx, f.s, r.ID)
			regs.await(t, r.ID, 1)
			cancel()
			// correctness bound, not a performance assertion
			res := receive(t, ch, 3*tt.block)
			if !errors.Is(res.err, context.Canceled) {
				t.Errorf("Wait = %v, want context.Canceled", res.err)
			}
			// the hub still works for the next waiter
			ch = goWait(context.Background(), f.s, r.ID)
			regs.await(t, r.ID, 2)
			if _, err := decide(context.Background(), f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
				t.Fatal(err)
			}
			if res := receive(t, ch, 5*tt.block); res.err != nil || res.r.Status != approval.StatusApproved {
				t.Errorf("Wait = %+v, %v; want approved", res.r, res.err)
			}
		})
	}
}

// TestWaitLostWakeElement: a decision whose wake element never arrives (it
// was popped elsewhere or expired) is still found by the periodic re-read.
func TestWaitLostWakeElement(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{BlockTimeout: 200 * time.Millisecond})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook, RecheckRounds: 2})
	r := f.mustCreate(t, nil)
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)

	// Write a final decision straight into the record, without a wake element.
	dec, _ := json.Marshal(approval.Decision{RequestID: r.ID, Verdict: approval.VerdictReject, Approver: "U1", At: t0})
	if err := f.rdb.HSet(ctx, f.prefix+":req:{"+r.ID+"}", "status", "rejected", "decision", dec).Err(); err != nil {
		t.Fatal(err)
	}
	res := receive(t, ch, 10*time.Second)
	if res.err != nil || res.r.Status != approval.StatusRejected {
		t.Errorf("Wait = %+v, %v; want rejected", res.r, res.err)
	}
}

func TestWaitClose(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{BlockTimeout: 200 * time.Millisecond})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, nil)
	var wg sync.WaitGroup
	chans := []<-chan waitResult{goWait(ctx, f.s, r.ID), goWait(ctx, f.s, r.ID)}
	regs.await(t, r.ID, 2)
	wg.Go(func() { _ = f.s.Close() })
	for _, ch := range chans {
		if res := receive(t, ch, 5*time.Second); !errors.Is(res.err, store.ErrClosed) {
			t.Errorf("Wait during Close = %v, want ErrClosed", res.err)
		}
	}
	wg.Wait()
	if _, err := f.s.Wait(ctx, r.ID); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Wait after Close = %v, want ErrClosed", err)
	}
	if _, err := f.s.Wait(ctx, "req_missing"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Wait(missing) = %v, want ErrNotFound", err)
	}
}

// TestWakeHintCarriesRecord: the hint a wake-up publishes carries the
// record byte for byte (fields and values holding the encoding's own
// characters, newlines, multi-byte text, empty values), so the hub hands
// it to the waiter without reading it again.
func TestWakeHintCarriesRecord(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, func(r *approval.Request) {
		r.Args = json.RawMessage(`{"note":"*3:a:b\n12:","who":"Zoë ☃","empty":""}`)
		r.Reason = "line one\nline two: *1:x"
	})
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
		t.Fatalf("Decide = %v", err)
	}
	if err := f.rdb.HSet(ctx, f.prefix+":req:{"+r.ID+"}", "empty", "", "odd:*9:", "12:x").Err(); err != nil {
		t.Fatal(err)
	}
	want, err := f.rdb.HGetAll(ctx, f.prefix+":req:{"+r.ID+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := store.Snapshot(ctx, f.s, r.ID)
	if err != nil || !ok {
		t.Fatalf("Snapshot(%s) = %v, %v, %v", r.ID, got, ok, err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("Snapshot(%s) = %q, want %q", r.ID, got, want)
	}
	for _, msg := range []string{"approved", "", "*5:ab", "*-1:", "*1:a"} {
		if f, ok := store.DecodeSnapshot(msg); ok {
			t.Errorf("DecodeSnapshot(%q) = %q, true; want false", msg, f)
		}
	}
}

// watchResult records what Watch's ready was called with, and how often.
type watchResult struct {
	mu    sync.Mutex
	calls int
	r     *approval.Request
	err   error
	ch    chan struct{} // closed at the first call
}

func newWatchResult() *watchResult { return &watchResult{ch: make(chan struct{})} }

func (w *watchResult) ready(r *approval.Request, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	if w.calls == 1 {
		w.r, w.err = r, err
		close(w.ch)
	}
}

func (w *watchResult) result() (int, *approval.Request, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls, w.r, w.err
}

// TestWatch: Watch is Wait without a goroutine. A request final already
// comes back at once; a decision is handed to ready exactly once, beside
// Waits on the same request; a stopped watch is never called; Close fails
// the watches left with ErrClosed.
func TestWatch(t *testing.T) {
	ctx := context.Background()

	t.Run("final already", func(t *testing.T) {
		f := mustStore(t, store.Options{})
		r := f.mustCreate(t, nil)
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
			t.Fatal(err)
		}
		w := newWatchResult()
		final, stop, err := f.s.Watch(ctx, r.ID, w.ready)
		if err != nil || final == nil || final.Status != approval.StatusApproved || stop != nil {
			t.Fatalf("Watch(decided) = %+v, stop %v, %v; want the approved request and no watch", final, stop != nil, err)
		}
		if _, _, err := f.s.Watch(ctx, "req_missing", w.ready); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("Watch(missing) = %v, want ErrNotFound", err)
		}
		_ = f.s.Close()
		if n, _, _ := w.result(); n != 0 {
			t.Errorf("ready called %d times, want never", n)
		}
	})

	t.Run("decided while watched", func(t *testing.T) {
		regs := newRegistrations()
		f := mustStore(t, store.Options{})
		store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
		r := f.mustCreate(t, nil)
		w := newWatchResult()
		final, stop, err := f.s.Watch(ctx, r.ID, w.ready)
		if err != nil || final != nil || stop == nil {
			t.Fatalf("Watch(pending) = %+v, stop %v, %v; want a watch", final, stop != nil, err)
		}
		ch := goWait(ctx, f.s, r.ID)
		regs.await(t, r.ID, 2)
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U1")); err != nil {
			t.Fatal(err)
		}
		if res := receive(t, ch, 10*time.Second); res.err != nil || res.r.Status != approval.StatusRejected {
			t.Errorf("Wait beside the watch = %+v, %v; want rejected", res.r, res.err)
		}
		select {
		case <-w.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("ready not called within 10s of the decision")
		}
		stop() // after the delivery: harmless
		_ = f.s.Close()
		if n, got, err := w.result(); n != 1 || err != nil || got.Status != approval.StatusRejected || got.Decision.Approver != "U1" {
			t.Errorf("ready called %d times with %+v, %v; want once, rejected by U1", n, got, err)
		}
	})

	t.Run("stopped", func(t *testing.T) {
		regs := newRegistrations()
		f := mustStore(t, store.Options{})
		store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
		r := f.mustCreate(t, nil)
		w := newWatchResult()
		_, stop, err := f.s.Watch(ctx, r.ID, w.ready)
		if err != nil {
			t.Fatal(err)
		}
		ch := goWait(ctx, f.s, r.ID)
		regs.await(t, r.ID, 2)
		stop()
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
			t.Fatal(err)
		}
		if res := receive(t, ch, 10*time.Second); res.err != nil {
			t.Fatal(res.err)
		}
		_ = f.s.Close() // the hub's deliveries are over when Close returns
		if n, _, _ := w.result(); n != 0 {
			t.Errorf("ready of a stopped watch called %d times, want never", n)
		}
	})

	t.Run("closed", func(t *testing.T) {
		regs := newRegistrations()
		f := mustStore(t, store.Options{})
		store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
		r := f.mustCreate(t, nil)
		w := newWatchResult()
		if _, _, err := f.s.Watch(ctx, r.ID, w.ready); err != nil {
			t.Fatal(err)
		}
		regs.await(t, r.ID, 1)
		_ = f.s.Close()
		if n, _, err := w.result(); n != 1 || !errors.Is(err, store.ErrClosed) {
			t.Errorf("ready after Close: %d calls, %v; want one, ErrClosed", n, err)
		}
	})
}
