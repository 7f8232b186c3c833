package bot_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// afterCard posts a review-after request of alice's with a 5 minute
// cancel window.
func (h *harness) afterCard() *approval.Request {
	h.t.Helper()
	return h.request(func(r *approval.Request) {
		r.Mode, r.Risk, r.Decisions, r.Signals = approval.ModeAfter, approval.RiskLow, nil,
			[]approval.Signal{{Code: approval.SignalReviewAfter, Text: "runs after a cancel window unless an approver cancels it"}}
		r.Created = h.clock.Now()
		r.Deadline = r.Created.Add(5 * time.Minute)
	})
}

// waitCardText waits until r's card shows text.
func (h *harness) waitCardText(r *approval.Request, text string) {
	h.t.Helper()
	h.waitWS("card of "+r.ID+" showing "+text, func() bool { return strings.Contains(allText(h.card(r).Blocks), text) })
	h.cardsIdle()
}

// TestCancelWindowCard: the card of a review-after call says when it runs
// and offers Run now and Cancel, not Approve; Cancel (reason optional)
// stops the call, audited as cancelled and shown on the card and in the
// task thread.
func TestCancelWindowCard(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.afterCard()
	card := h.card(r)
	text := allText(card.Blocks)
	if !strings.Contains(text, "unless cancelled") || !hasAction(card.Blocks, "cs_run_now") || !hasAction(card.Blocks, "cs_cancel_run") ||
		hasAction(card.Blocks, "cs_approve") || hasAction(card.Blocks, "cs_reject") {
		t.Fatalf("cancel window card = %s", text)
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_cancel_run"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_cancel_run")
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": ""}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView with no reason = %+v, %v; want closed (the reason is optional)", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusRejected)
	if got.Decision.Verdict != approval.VerdictCancel || got.Decision.Approver != bob {
		t.Fatalf("decision = %+v, want cancel by bob", got.Decision)
	}
	h.waitCardText(r, "Cancelled")
	if hasAction(h.card(r).Blocks, "cs_cancel_run") {
		t.Errorf("cancelled card still offers Cancel")
	}
	if recs := h.audit.Records(approval.EventCancelled); len(recs) != 1 || recs[0].Actor != bob {
		t.Errorf("audit cancelled = %+v, want one by bob", recs)
	}
	h.decided(r)
	var told bool
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		told = told || strings.Contains(m.Text, "cancelled by <@"+bob+"> in its cancel window")
	}
	if !told {
		t.Errorf("task thread lacks the cancel line")
	}
}

// TestCancelWindowRunNow: Run now approves at once, audited as run_now.
func TestCancelWindowRunNow(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.afterCard()
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_run_now"); err != nil {
		t.Fatal(err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	if got.Decision.Verdict != approval.VerdictRunNow || got.Decision.Approver != carol {
		t.Fatalf("decision = %+v, want run_now by carol", got.Decision)
	}
	// The decided line, not the pending card's button of the same name:
	// the card is redrawn after the audit entry (the lifecycle's order).
	h.waitCardText(r, "Run now* by")
	if recs := h.audit.Records(approval.EventRunNow); len(recs) != 1 {
		t.Errorf("audit run_now entries = %d, want 1", len(recs))
	}
}

// TestCancelAfterWindowEnded: a cancel submitted once the window ended
// changes nothing: the call went ahead, the clicker is told so, and the
// window's end is audited once.
func TestCancelAfterWindowEnded(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.afterCard()
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_cancel_run"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_cancel_run")
	h.clock.Advance(5 * time.Minute) // the window ends while the modal is open
	if res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "wrong host"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	h.ephemeralContaining(bob, "Too late: the cancel window ended")
	got := h.load(r.ID)
	if got.Status != approval.StatusApproved || got.Decision.Verdict != approval.VerdictWindowElapsed {
		t.Fatalf("request = %s by %+v, want approved by the window's end", got.Status, got.Decision)
	}
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 0 {
		t.Errorf("ExpireDue after = %d, %v; want 0", n, err)
	}
	if recs := h.audit.Records(approval.EventWindowElapsed); len(recs) != 1 {
		t.Errorf("audit window_elapsed entries = %d, want 1", len(recs))
	}
	h.waitCardText(r, "Cancel window ended")
}

// TestMarkAsWrong: every final card a person settled offers Mark as wrong
// to approvers; the reason is required; the mark is audited, shown on the
// card, and counts once.
func TestMarkAsWrong(t *testing.T) {
	tests := []struct {
		name   string
		settle func(h *harness, r *approval.Request)
	}{
		{"rejected", func(h *harness, r *approval.Request) {
			if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictReject, Text: "no",
				Approver: carol, At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{}); err != nil {
				h.t.Fatal(err)
			}
		}},
		{"approved and run", func(h *harness, r *approval.Request) {
			if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
				Approver: carol, At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{}); err != nil {
				h.t.Fatal(err)
			}
			if _, err := h.life.Claim(h.ctx, r.ID, "p1"); err != nil {
				h.t.Fatal(err)
			}
			if _, err := h.life.Finish(h.ctx, r.ID, "p1", approval.Outcome{Status: approval.StatusExecuted, Result: "refunded"}); err != nil {
				h.t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
			r := h.request(nil)
			if hasAction(h.card(r).Blocks, "cs_mark_wrong") {
				t.Fatalf("pending card offers Mark as wrong")
			}
			tc.settle(h, r)
			h.waitWS("Mark as wrong on the final card", func() bool { return hasAction(h.card(r).Blocks, "cs_mark_wrong") })
			h.cardsIdle()

			// The requester is no approver of their own request.
			if err := h.ws.Click(alice, approvals, r.Card.TS, "cs_mark_wrong"); err != nil {
				t.Fatal(err)
			}
			h.ephemeralContaining(alice, "someone else has to decide it")

			if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_mark_wrong"); err != nil {
				t.Fatal(err)
			}
			v := h.openView(bob, "cs_mark_wrong")
			res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": " "}})
			if err != nil || res.ResponseAction != "errors" || res.Errors["reason"] == "" {
				t.Fatalf("blank reason = %+v, %v; want an error on the reason", res, err)
			}
			if res, err = h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "order 1234 was never damaged"}}); err != nil || !res.Closed {
				t.Fatalf("SubmitView = %+v, %v", res, err)
			}
			waitCh(t, "the marked_wrong entry", h.audit.changed, func() bool { return len(h.audit.Records(approval.EventMarkedWrong)) > 0 })
			h.waitCardText(r, "Marked wrong")
			card := h.card(r)
			if hasAction(card.Blocks, "cs_mark_wrong") || !strings.Contains(allText(card.Blocks), "order 1234 was never damaged") {
				t.Errorf("marked card = %s", allText(card.Blocks))
			}
			recs := h.audit.Records(approval.EventMarkedWrong)
			data, _ := recs[0].Data.(approval.FeedbackEvent)
			if len(recs) != 1 || recs[0].Actor != bob || data.DecidedBy != carol || data.Reason != "order 1234 was never damaged" {
				t.Errorf("marked_wrong audit = %+v", recs)
			}
			// A second mark, from a modal opened before the first, counts nothing.
			if _, err := h.life.Feedback(h.ctx, r.ID, approval.Feedback{Wrong: true, By: carol, Reason: "again"}); err == nil {
				t.Errorf("second mark as wrong accepted")
			}
		})
	}
}

// sampledCard records a call of alice's that ran without a human and posts
// its review card, as the agent does for a sampled call.
func (h *harness) sampledCard() *approval.Request {
	h.t.Helper()
	threadTS, err := h.ws.PostMessage(alice, tasks, "please note order 1234", "")
	if err != nil {
		h.t.Fatal(err)
	}
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: alice,
		Origin: approval.Origin{Channel: tasks, ThreadTS: threadTS}, Tool: "issue_refund", Risk: approval.RiskLow,
		Args: json.RawMessage(`{"order_id":"1234","amount":5}`), Mode: approval.ModeSampled,
		Status: approval.StatusExecuted, Result: `{"id":"RF-1"}`, Created: h.clock.Now(),
	}
	if _, err := h.life.Sampled(h.ctx, r, 0.05); err != nil {
		h.t.Fatalf("Sampled: %v", err)
	}
	r.Card = h.load(r.ID).Card
	return r
}

// TestSampledReviewCard: a sampled call's card says it ran and asks
// whether it was right; Looks right is recorded, a later Wrong (reason
// required) overrules it, both audited and shown; the task thread is not
// told anything more.
func TestSampledReviewCard(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.sampledCard()
	card := h.card(r)
	if !strings.Contains(allText(card.Blocks), "was this right?") || !hasAction(card.Blocks, "cs_looks_right") || !hasAction(card.Blocks, "cs_mark_wrong") {
		t.Fatalf("review card = %s", allText(card.Blocks))
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_looks_right"); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "sample_reviewed", h.audit.changed, func() bool { return len(h.audit.Records(approval.EventSampleReviewed)) == 1 })
	h.waitCardText(r, "Looks right* to") // the feedback line, not the button
	if hasAction(h.card(r).Blocks, "cs_looks_right") || !hasAction(h.card(r).Blocks, "cs_mark_wrong") {
		t.Errorf("reviewed card should offer Mark as wrong only")
	}
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_mark_wrong"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(carol, "cs_mark_wrong")
	if res, err := h.ws.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": "note on the wrong order"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	waitCh(t, "marked_wrong", h.audit.changed, func() bool { return len(h.audit.Records(approval.EventMarkedWrong)) == 1 })
	h.waitCardText(r, "Marked wrong")
	data, _ := h.audit.Records(approval.EventMarkedWrong)[0].Data.(approval.FeedbackEvent)
	if !data.Sampled || data.Reason != "note on the wrong order" {
		t.Errorf("marked_wrong data = %+v, want sampled with the reason", data)
	}
	if n := len(h.audit.Records(approval.EventSampled)); n != 1 {
		t.Errorf("audit sampled entries = %d, want 1", n)
	}
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		if m.User == slacksim.BotUserID {
			t.Errorf("task thread told about a sampled review: %q", m.Text)
		}
	}
}
