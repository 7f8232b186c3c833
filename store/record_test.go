package store_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestRecordDecisionLeavesWakeToCaller: RecordDecision makes the decision
// durable and wakes nobody, so the lifecycle owner can audit it before the
// agent reacts; Wake then delivers it. A decision arriving after the
// deadline expires the request in the same step and says so (Now).
func TestRecordDecisionLeavesWakeToCaller(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{BlockTimeout: time.Second})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, nil)
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)

	after, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U1"))
	if err != nil || after.Status != approval.StatusApproved {
		t.Fatalf("RecordDecision = %v, %v; want approved", after, err)
	}
	if cur, err := f.s.Request(ctx, r.ID); err != nil || cur.Status != approval.StatusApproved {
		t.Fatalf("durable record = %v, %v; want approved", cur, err)
	}
	wake := f.prefix + ":req:{" + r.ID + "}:wake"
	if n := f.rdb.LLen(ctx, wake).Val(); n != 0 {
		t.Errorf("wake list holds %d elements after RecordDecision, want 0 (no waiter may wake yet)", n)
	}
	select {
	case res := <-ch:
		t.Fatalf("Wait returned %+v before the wake-up", res)
	default:
	}
	if err := f.s.Wake(ctx, r.ID, after.Status); err != nil {
		t.Fatalf("Wake = %v", err)
	}
	if res := receive(t, ch, 5*time.Second); res.err != nil || res.r.Status != approval.StatusApproved {
		t.Fatalf("Wait = %+v, %v; want approved after Wake", res.r, res.err)
	}

	// A refusal changes nothing.
	r2 := f.mustCreate(t, nil)
	stale := decision(r2, approval.VerdictApprove, "U1")
	stale.Digest = "not-the-digest"
	if _, err := f.s.RecordDecision(ctx, stale); !errors.Is(err, approval.ErrStaleArgs) {
		t.Fatalf("RecordDecision(stale) = %v, want ErrStaleArgs", err)
	}

	// Past the deadline: expired right there, reported with Now.
	r3 := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Minute) })
	late := decision(r3, approval.VerdictApprove, "U1")
	late.At = t0.Add(2 * time.Minute)
	got, err := f.s.RecordDecision(ctx, late)
	var de *approval.DecidedError
	if !errors.As(err, &de) || !de.Now || !errors.Is(err, approval.ErrExpired) || got == nil || got.Status != approval.StatusExpired {
		t.Fatalf("RecordDecision(late) = %v, %v; want the request expired now (DecidedError.Now)", got, err)
	}
	// The clock's decision is what is recorded, not the late click's.
	if d := got.Decision; d == nil || d.Verdict != approval.VerdictExpire || d.Approver != "system" || !d.At.Equal(late.At) ||
		d.RequestID != r3.ID || d.Text != "no decision before the deadline" || len(got.Approvals) != 0 {
		t.Fatalf("RecordDecision(late) recorded %+v (approvals %v), want the expiry at %v", got.Decision, got.Approvals, late.At)
	}
	if cur, err := f.s.Request(ctx, r3.ID); err != nil || !reflect.DeepEqual(cur, got) {
		t.Fatalf("durable record = %+v, %v; want %+v", cur, err, got)
	}
	again, err := f.s.RecordDecision(ctx, late)
	if !errors.As(err, &de) || de.Now || again.Status != approval.StatusExpired {
		t.Fatalf("RecordDecision(late, again) = %v, %v; want already expired, not now", again, err)
	}
}

// TestWaitStartedBetweenRecordAndWake: a Wait that starts after a decision
// was recorded but before its owner woke the waiters (the owner audits in
// between) does not return the decision at once: it returns with the
// wake-up, so that what the waiter does next (executing) is audited after
// the decision, also for a run resumed in that instant.
func TestWaitStartedBetweenRecordAndWake(t *testing.T) {
	ctx := context.Background()
	regs := newRegistrations()
	f := mustStore(t, store.Options{BlockTimeout: time.Second})
	store.SetHubHooks(f.s, store.HubHooks{Registered: regs.hook})
	r := f.mustCreate(t, nil)
	after, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U1"))
	if err != nil {
		t.Fatal(err)
	}
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1) // it waits with the hub instead of returning
	select {
	case res := <-ch:
		t.Fatalf("Wait returned %+v before the wake-up", res)
	default:
	}
	if err := f.s.Wake(ctx, r.ID, after.Status); err != nil {
		t.Fatal(err)
	}
	if res := receive(t, ch, 5*time.Second); res.err != nil || res.r.Status != approval.StatusApproved {
		t.Fatalf("Wait = %+v, %v; want approved after Wake", res.r, res.err)
	}
	// Once woken, a later Wait returns at once.
	if got, err := f.s.Wait(ctx, r.ID); err != nil || got.Status != approval.StatusApproved {
		t.Fatalf("Wait after the wake-up = %+v, %v", got, err)
	}
}
