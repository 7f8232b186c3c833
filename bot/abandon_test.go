package bot_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestAbandonedWhenTheCallerHasGone (issue 27, point 5): an API caller's
// request is approved on its card, and nobody claims it. Just before the
// claim window ends the sweep leaves it approved; once the window ended
// the sweep abandons it: the record says abandoned, the audit has one
// abandoned entry with who approved and the window, the card says the
// approval came after the caller had gone and nothing ran, and a later
// claim is refused (with the token-less agent's claim too).
func TestAbandonedWhenTheCallerHasGone(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: "run-ext-9", CallID: "call-9", Requester: "api:support-bot",
		Caller: approval.Caller{Kind: approval.CallerAPI, Name: "support-bot"},
		Tool:   "issue_refund", Risk: approval.RiskHigh,
		Args:      json.RawMessage(`{"order_id":"1234","amount":400}`),
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}, Quorum: 1,
		Created: h.clock.Now(), Deadline: h.clock.Now().Add(time.Hour), Status: approval.StatusPending,
	}
	created, err := h.life.Create(h.ctx, r)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if created.ClaimWindow != approval.DefaultClaimWindow {
		t.Fatalf("ClaimWindow of an API request = %v, want the default %v", created.ClaimWindow, approval.DefaultClaimWindow)
	}
	if err := h.ws.Click(bob, approvals, created.Card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	approved := h.waitStatus(r.ID, approval.StatusApproved)
	approvedAt := approved.Decision.At

	h.clock.Advance(approval.DefaultClaimWindow - time.Millisecond)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 0 {
		t.Fatalf("ExpireDue inside the claim window = %d, %v; want 0", n, err)
	}
	if got := h.load(r.ID).Status; got != approval.StatusApproved {
		t.Fatalf("status inside the claim window = %s, want approved", got)
	}
	h.clock.Advance(time.Millisecond)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 1 {
		t.Fatalf("ExpireDue at the end of the claim window = %d, %v; want 1", n, err)
	}
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 0 {
		t.Fatalf("second sweep = %d, %v; want 0 (abandoned once)", n, err)
	}
	got := h.load(r.ID)
	if got.Status != approval.StatusAbandoned || got.Decision == nil || got.Decision.Approver != bob {
		t.Fatalf("request = %s (decision %+v), want abandoned keeping bob's approval", got.Status, got.Decision)
	}

	recs := h.audit.Records(approval.EventAbandoned)
	if len(recs) != 1 {
		t.Fatalf("abandoned audit entries = %d, want 1", len(recs))
	}
	want := approval.AbandonedEvent{Approver: bob, ApprovedAt: approvedAt, ClaimWindowMS: approval.DefaultClaimWindow.Milliseconds(),
		Caller: "api:support-bot", Created: r.Created}
	if d, ok := recs[0].Data.(approval.AbandonedEvent); !ok || d != want || recs[0].RequestID != r.ID || recs[0].Actor != "system" {
		t.Errorf("abandoned entry = %+v, want data %+v by system", recs[0], want)
	}

	h.waitWS("card of an abandoned request", func() bool {
		return strings.Contains(allText(h.card(created).Blocks), "the caller had gone, so nothing ran")
	})
	h.cardsIdle()
	card := allText(h.card(created).Blocks)
	if !strings.Contains(card, "*Approved* by <@"+bob+">") || !strings.Contains(card, "the caller had gone, so nothing ran") ||
		hasAction(h.card(created).Blocks, "cs_approve") {
		t.Errorf("card of an abandoned request:\n%s\nwant \"Approved by <@%s> … the caller had gone, so nothing ran\" and no buttons", card, bob)
	}

	late, token, err := h.life.ClaimToken(h.ctx, r.ID, "api:support-bot")
	if !errors.Is(err, approval.ErrAbandoned) || token != "" || late == nil || late.Status != approval.StatusAbandoned {
		t.Errorf("ClaimToken after the window = %v, %q, %v; want ErrAbandoned with the abandoned record and no token", late, token, err)
	}
	if _, err := h.life.Claim(h.ctx, r.ID, "agent"); !errors.Is(err, approval.ErrAbandoned) {
		t.Errorf("Claim after the window = %v, want ErrAbandoned", err)
	}
	if n := len(h.audit.Records(approval.EventExecuting)); n != 0 {
		t.Errorf("executing audited %d times for an abandoned request", n)
	}
}

// TestAgentRequestsAreNeverAbandoned: the agent's own requests have no
// claim window (their runs are durable and adopted): approved and left
// unclaimed long past any window, the sweep leaves them approved.
func TestAgentRequestsAreNeverAbandoned(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	h.waitStatus(r.ID, approval.StatusApproved)
	h.clock.Advance(24 * time.Hour)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 0 {
		t.Fatalf("ExpireDue = %d, %v; want 0", n, err)
	}
	if got := h.load(r.ID); got.Status != approval.StatusApproved || got.ClaimWindow != 0 {
		t.Errorf("agent request = %s (claim window %v), want approved with none", got.Status, got.ClaimWindow)
	}
}
