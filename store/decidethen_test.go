package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestDecideThenAuditsBeforeWake: DecideThen's callback runs after the
// decision is durable and before any waiter can be woken, so whatever it
// records (the bot's audit entry) precedes what the woken agent does.
// Refusals never call it.
func TestDecideThenAuditsBeforeWake(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{BlockTimeout: time.Second})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, nil)
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)

	wake := f.prefix + ":req:{" + r.ID + "}:wake"
	var called int
	after, err := f.s.DecideThen(ctx, decision(r, approval.VerdictApprove, "U1"), func(got *approval.Request) {
		called++
		if got.Status != approval.StatusApproved {
			t.Errorf("then saw status %s, want approved", got.Status)
		}
		if cur, err := f.s.Request(ctx, r.ID); err != nil || cur.Status != approval.StatusApproved {
			t.Errorf("durable record in then = %v, %v; want approved", cur, err)
		}
		if n := f.rdb.LLen(ctx, wake).Val(); n != 0 {
			t.Errorf("wake list holds %d elements inside then, want 0 (no waiter may wake yet)", n)
		}
		select {
		case res := <-ch:
			t.Errorf("Wait returned %+v inside then, before the wake-up", res)
		default:
		}
	})
	if err != nil || after.Status != approval.StatusApproved || called != 1 {
		t.Fatalf("DecideThen = %v, %v (then called %d times); want approved, then once", after, err, called)
	}
	if res := receive(t, ch, 5*time.Second); res.err != nil || res.r.Status != approval.StatusApproved {
		t.Fatalf("Wait = %+v, %v; want approved after DecideThen returned", res.r, res.err)
	}

	// A refusal does not call then.
	r2 := f.mustCreate(t, nil)
	stale := decision(r2, approval.VerdictApprove, "U1")
	stale.Digest = "not-the-digest"
	if _, err := f.s.DecideThen(ctx, stale, func(*approval.Request) { t.Error("then called for a refused decision") }); !errors.Is(err, approval.ErrStaleArgs) {
		t.Fatalf("DecideThen(stale) = %v, want ErrStaleArgs", err)
	}
}
