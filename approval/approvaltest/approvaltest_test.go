package approvaltest_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// TestDoublesAreTheStore: the records and the audit stream run on the
// test's clock (the store stamps the creation, the claim and each entry
// with it), the looks beside them read what the store holds (the claimant,
// the wake-ups oldest first, the entries in order), and a forgotten
// request is not found; two Records never see each other's requests.
func TestDoublesAreTheStore(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	clock := clocktest.New(clocktest.Opts{Start: start})
	rec, audit := approvaltest.NewRecords(clock.Now), approvaltest.NewAuditor(clock.Now)
	r := &approval.Request{ID: approval.NewID("req"), Requester: "U0ALICE", Tool: "issue_refund",
		Args: json.RawMessage(`{"amount":64}`), Decisions: []approval.Verdict{approval.VerdictApprove}, Deadline: start.Add(time.Hour)}
	if err := rec.CreateRequest(ctx, r); err != nil {
		t.Fatalf("CreateRequest = %v", err)
	}
	if !r.Created.Equal(start) {
		t.Errorf("Created = %v, want the clock's %v", r.Created, start)
	}
	clock.Advance(time.Minute)
	if _, err := rec.RecordDecision(ctx, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U0BOB", Digest: r.Digest}); err != nil {
		t.Fatalf("RecordDecision = %v", err)
	}
	if err := rec.Wake(ctx, r.ID, approval.StatusApproved); err != nil {
		t.Fatalf("Wake = %v", err)
	}
	if _, err := rec.Claim(ctx, r.ID, "agent", "", r.Digest); err != nil {
		t.Fatalf("Claim = %v", err)
	}
	if got, err := rec.Finish(ctx, r.ID, approval.StatusExecuted, "refunded"); err != nil || got.Status != approval.StatusExecuted {
		t.Fatalf("Finish = %v, %v; want executed", got, err)
	}
	if err := rec.Wake(ctx, r.ID, approval.StatusExecuted); err != nil {
		t.Fatalf("Wake = %v", err)
	}
	if got, want := rec.Woken(r.ID), []approval.Status{approval.StatusApproved, approval.StatusExecuted}; !slices.Equal(got, want) {
		t.Errorf("Woken = %v, want %v", got, want)
	}
	if got := rec.Claimant(r.ID); got != "agent" {
		t.Errorf("Claimant = %q, want agent", got)
	}
	for _, ev := range []approval.Event{approval.EventRequested, approval.EventDecided} {
		if _, err := audit.Append(ctx, approval.Record{Event: ev, RequestID: r.ID, Actor: "U0BOB"}); err != nil {
			t.Fatalf("Append(%s) = %v", ev, err)
		}
	}
	if got, want := audit.Events(r.ID), []approval.Event{approval.EventRequested, approval.EventDecided}; !slices.Equal(got, want) {
		t.Errorf("Events = %v, want %v", got, want)
	}
	entries := audit.Entries()
	if len(entries) != 2 || entries[1].PrevHash != entries[0].Hash || !entries[1].Time.Equal(start.Add(time.Minute)) {
		t.Errorf("Entries = %+v, want two chained, stamped %v", entries, start.Add(time.Minute))
	}
	if _, err := approvaltest.NewRecords(clock.Now).Request(ctx, r.ID); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("another Records' Request(%s) = %v, want ErrNotFound", r.ID, err)
	}
	if n := len(approvaltest.NewAuditor(clock.Now).Entries()); n != 0 {
		t.Errorf("another Auditor's Entries = %d, want none", n)
	}
	rec.Forget(r.ID)
	if _, err := rec.Request(ctx, r.ID); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Request after Forget = %v, want ErrNotFound", err)
	}
	if got := rec.Woken(r.ID); len(got) != 0 {
		t.Errorf("Woken after Forget = %v, want none", got)
	}
}
