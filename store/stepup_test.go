package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// A step-up link is read as often as the page is shown and taken once;
// it carries the key's TTL to its expiry; a fresh confirmation reads back
// its end; passkeys are kept and removed by id.
func TestStepUpKeys(t *testing.T) {
	f := mustStore(t, store.Options{})
	ctx := context.Background()
	link := approval.StepUpLink{Purpose: approval.PurposeVote, User: "U0CAROL01", Nonce: "n",
		Decision: approval.Decision{RequestID: "req_1", Verdict: approval.VerdictApprove, Approver: "U0CAROL01", Digest: "d"},
		Expires:  f.clock.Now().Add(approval.StepUpLinkTTL)}
	if err := f.s.SaveStepUpLink(ctx, "k1", link); err != nil {
		t.Fatalf("SaveStepUpLink: %v", err)
	}
	if ttl := f.rdb.TTL(ctx, f.prefix+":stepup:link:k1").Val(); ttl <= 0 || ttl > approval.StepUpLinkTTL {
		t.Errorf("the link's TTL = %v, want (0, %v]", ttl, approval.StepUpLinkTTL)
	}
	for range 2 {
		got, err := f.s.StepUpLink(ctx, "k1")
		if err != nil || got.Decision.RequestID != "req_1" || got.User != "U0CAROL01" {
			t.Fatalf("StepUpLink = %+v, %v", got, err)
		}
	}
	if _, err := f.s.TakeStepUpLink(ctx, "k1"); err != nil {
		t.Fatalf("TakeStepUpLink = %v", err)
	}
	if _, err := f.s.TakeStepUpLink(ctx, "k1"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("TakeStepUpLink(taken) = %v, want ErrNotFound", err)
	}
	if err := f.s.SaveStepUpLink(ctx, "k2", approval.StepUpLink{Expires: f.clock.Now().Add(-time.Second)}); err == nil {
		t.Errorf("SaveStepUpLink(expired) = nil, want an error")
	}

	if until, err := f.s.SteppedUp(ctx, "U0CAROL01"); err != nil || !until.IsZero() {
		t.Errorf("SteppedUp(never) = %v, %v; want zero", until, err)
	}
	end := f.clock.Now().Add(10 * time.Minute)
	if err := f.s.NoteStepUp(ctx, "U0CAROL01", end); err != nil {
		t.Fatal(err)
	}
	if until, err := f.s.SteppedUp(ctx, "U0CAROL01"); err != nil || !until.Equal(end.Truncate(time.Millisecond)) {
		t.Errorf("SteppedUp = %v, %v; want %v", until, err, end)
	}

	if err := f.s.AddPasskey(ctx, "U0CAROL01", "id1", []byte(`{"id":"1"}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := f.s.Passkeys(ctx, "U0CAROL01"); err != nil || len(got) != 1 || string(got[0]) != `{"id":"1"}` {
		t.Errorf("Passkeys = %q, %v", got, err)
	}
	if ok, err := f.s.RemovePasskey(ctx, "U0CAROL01", "id1"); !ok || err != nil {
		t.Errorf("RemovePasskey = %v, %v; want true", ok, err)
	}
	if ok, _ := f.s.RemovePasskey(ctx, "U0CAROL01", "id1"); ok {
		t.Errorf("RemovePasskey(removed) = true, want false")
	}
	if err := f.s.SaveStepUpSession(ctx, "s", []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if b, err := f.s.TakeStepUpSession(ctx, "s"); err != nil || string(b) != "x" {
		t.Errorf("TakeStepUpSession = %q, %v", b, err)
	}
	if _, err := f.s.TakeStepUpSession(ctx, "s"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("TakeStepUpSession(taken) = %v, want ErrNotFound", err)
	}
}
