package bot_test

import (
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestRemindPostsInCardThread: a reminder goes to the card's thread, names
// the tool, the requester and the deadline, and pings the named approvers
// (users and usergroups) without ever broadcasting.
func TestRemindPostsInCardThread(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) {
		r.Approvers = approval.Approvers{Users: []string{carol}, Usergroups: []string{"S0LEADS01", "<!channel>"}}
	})
	if err := h.bot.Remind(h.ctx, r, 1); err != nil {
		t.Fatalf("Remind: %v", err)
	}
	if err := h.bot.Remind(h.ctx, r, 2); err != nil {
		t.Fatalf("Remind: %v", err)
	}
	replies := h.ws.Replies(approvals, r.Card.TS)
	if len(replies) != 2 {
		t.Fatalf("card thread has %d replies, want 2: %+v", len(replies), replies)
	}
	first := replies[0].Text
	for _, want := range []string{"⏰ Still waiting", "`issue_refund`", "<@" + alice + ">", "<!date^", "<@" + carol + ">", "<!subteam^S0LEADS01>"} {
		if !strings.Contains(first, want) {
			t.Errorf("reminder %q lacks %q", first, want)
		}
	}
	if strings.Contains(first, "<!channel>") {
		t.Errorf("reminder %q broadcasts", first)
	}
	if !strings.Contains(replies[1].Text, "reminder 2") {
		t.Errorf("second reminder %q does not say it is the second", replies[1].Text)
	}
	// The task thread is not spammed.
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		if strings.Contains(m.Text, "Still waiting") {
			t.Errorf("reminder posted in the task thread: %q", m.Text)
		}
	}
}

// TestEscalateWidensAndShows: before the escalation carol (in the approvals
// channel, not an approver of this request) is refused; after an escalation
// to her with widening, the card thread pings her, the card says so, and
// her approval counts.
func TestEscalateWidensAndShows(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) { r.Approvers = approval.Approvers{Users: []string{bob}} })

	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(carol, "not one of the approvers")

	if err := h.bot.Escalate(h.ctx, r); err == nil {
		t.Errorf("Escalate on a request that is not escalated succeeded")
	}
	h.clock.Advance(30 * time.Minute)
	er, ok, err := h.life.Escalate(h.ctx, r.ID, approval.Approvers{Users: []string{carol}}, true)
	if err != nil || !ok {
		t.Fatalf("Lifecycle.Escalate = %v, %v", ok, err)
	}
	if err := h.bot.Escalate(h.ctx, er); err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	h.cardsIdle()
	replies := h.ws.Replies(approvals, r.Card.TS)
	if len(replies) != 1 || !strings.Contains(replies[0].Text, "⏫ Escalated") || !strings.Contains(replies[0].Text, "<@"+carol+">") ||
		!strings.Contains(replies[0].Text, "may now approve") {
		t.Fatalf("card thread after escalation = %+v, want one line pinging carol", replies)
	}
	card := allText(h.card(r).Blocks)
	if !strings.Contains(card, "Escalated to <@"+carol+">") || !hasAction(h.card(r).Blocks, "cs_approve") {
		t.Errorf("card after escalation lacks the escalation note or its buttons:\n%s", card)
	}

	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	if got.Decision == nil || got.Decision.Approver != carol {
		t.Fatalf("decision = %+v, want carol's approval", got.Decision)
	}
	h.waitWS("card shows the approval and keeps the escalation note", func() bool {
		text := allText(h.card(r).Blocks)
		return strings.Contains(text, "Approved") && strings.Contains(text, "Escalated to")
	})
}

// TestExpiryTellsCardAndTaskThread: an expired request's card loses its
// buttons and the task thread is told, once.
func TestExpiryTellsCardAndTaskThread(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	h.clock.Advance(2 * time.Hour)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 1 {
		t.Fatalf("ExpireDue = %d, %v; want 1", n, err)
	}
	expired := h.load(r.ID)
	for range 2 {
		h.redraw(expired)
		h.decided(expired)
	}
	if m := h.card(r); hasAction(m.Blocks, "cs_approve") || !strings.Contains(allText(m.Blocks), "Expired") {
		t.Errorf("card after expiry = %s, want no buttons and Expired", allText(m.Blocks))
	}
	n := 0
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		if strings.Contains(m.Text, "expired with no decision") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("task thread has %d expiry lines, want 1", n)
	}
}

// TestExternalRequesterNamedAsTheKey: a request from an agent we did not
// write (HumanLayer API, no Slack user) is named by its API key wherever
// people read who asked — the reminder, the Reject modal, the card's
// notification text — never by its internal requester id.
func TestExternalRequesterNamedAsTheKey(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) {
		r.Origin, r.Requester = approval.Origin{}, "humanlayer:support-bot"
		r.Caller = approval.Caller{Kind: approval.CallerHumanLayer, Name: "support-bot"}
	})
	if err := h.bot.Remind(h.ctx, r, 1); err != nil {
		t.Fatalf("Remind: %v", err)
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v := h.openView(bob, "cs_reject")
	for what, text := range map[string]string{
		"reminder":          h.ws.Replies(approvals, r.Card.TS)[0].Text,
		"reject modal":      string(v.Blocks),
		"card notification": h.card(r).Text,
	} {
		if strings.Contains(text, "humanlayer:") || !strings.Contains(text, "support-bot") {
			t.Errorf("%s = %q, want the key support-bot named, not the internal requester id", what, text)
		}
	}
}
