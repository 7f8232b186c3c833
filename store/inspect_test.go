package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestWakeUps: the wake-ups pushed for a request are read back oldest
// first, whoever pushed them (Store.Wake after a decision, or again by a
// second owner); a request never woken has none.
func TestWakeUps(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, nil)
	quiet := f.mustCreate(t, nil)
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U_BOB")); err != nil {
		t.Fatalf("decide(%s) = %v", r.ID, err)
	}
	if err := f.s.Wake(ctx, r.ID, approval.StatusExecuted); err != nil {
		t.Fatalf("Wake(%s) = %v", r.ID, err)
	}
	got, err := store.WakeUps(ctx, f.s, r.ID)
	if want := []approval.Status{approval.StatusApproved, approval.StatusExecuted}; err != nil || !slices.Equal(got, want) {
		t.Errorf("WakeUps(%s) = %v, %v; want %v", r.ID, got, err, want)
	}
	if got, err := store.WakeUps(ctx, f.s, quiet.ID); err != nil || len(got) != 0 {
		t.Errorf("WakeUps(%s) = %v, %v; want none", quiet.ID, got, err)
	}
}

// TestForgetRequest: a forgotten request is gone as after a loss of
// Redis's data — not found, not pending, not among its requester's
// recent requests, its wake-ups gone — and the others stay.
func TestForgetRequest(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	lost := f.mustCreate(t, nil)
	kept := f.mustCreate(t, nil)
	if err := f.s.Wake(ctx, lost.ID, approval.StatusLost); err != nil {
		t.Fatalf("Wake(%s) = %v", lost.ID, err)
	}
	if err := store.ForgetRequest(ctx, f.s, lost.ID); err != nil {
		t.Fatalf("ForgetRequest(%s) = %v", lost.ID, err)
	}
	if _, err := f.s.Request(ctx, lost.ID); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Request(%s) after ForgetRequest = %v, want ErrNotFound", lost.ID, err)
	}
	if _, err := f.s.RecordDecision(ctx, decision(lost, approval.VerdictApprove, "U_BOB")); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("RecordDecision(%s) after ForgetRequest = %v, want ErrNotFound", lost.ID, err)
	}
	if n, err := f.s.PendingCount(ctx); err != nil || n != 1 {
		t.Errorf("PendingCount = %d, %v; want 1 (%s only)", n, err, kept.ID)
	}
	recent, err := f.s.RecentByRequester(ctx, lost.Requester, 10)
	if err != nil || len(recent) != 1 || recent[0].ID != kept.ID {
		t.Errorf("RecentByRequester(%s) = %v, %v; want %s only", lost.Requester, recent, err, kept.ID)
	}
	if got, err := store.WakeUps(ctx, f.s, lost.ID); err != nil || len(got) != 0 {
		t.Errorf("WakeUps(%s) after ForgetRequest = %v, %v; want none", lost.ID, got, err)
	}
	if err := store.ForgetRequest(ctx, f.s, lost.ID); err != nil {
		t.Errorf("ForgetRequest(%s) again = %v, want nil (nothing left to drop)", lost.ID, err)
	}
}
