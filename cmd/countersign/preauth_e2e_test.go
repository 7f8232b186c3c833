package main_test

import (
	"context"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/store"
)

// TestDemoPreauthorization: through the production wiring, "Approve +
// allow 1h" on a refund card lets the requester's next refund in the same
// thread run without a card (audited preauthorized, naming the grantor);
// once revoked, the next refund gets a card again. A refund over the deny
// rule's limit is refused without asking anyone.
func TestDemoPreauthorizationAndDeny(t *testing.T) {
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	alice, bob, carol := cast.Requester.ID, cast.Approver.ID, cast.SecondApprover.ID
	mention := "<@" + slacksim.BotUserID + "> "
	refundCards := func() []slacksim.Message {
		var out []slacksim.Message
		for _, m := range ws.Messages(cast.Approvals.ID) {
			if m.ThreadTS == "" && strings.Contains(string(m.Blocks), "issue_refund") {
				out = append(out, m)
			}
		}
		return out
	}

	root, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $60 on order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the first refund card", func() bool { _, bound := cardFor(d, "issue_refund"); return bound && len(refundCards()) == 1 })
	card := refundCards()[0]
	if !strings.Contains(string(card.Blocks), "Approve + allow up to $100.00 in all for 1h") {
		t.Fatalf("refund card has no Approve + allow up to $100.00 in all for 1h: %s", card.Blocks)
	}
	if err := ws.Click(bob, cast.Approvals.ID, card.TS, "cs_approve_allow"); err != nil {
		t.Fatal(err)
	}
	waitBotReply(t, d, "the first answer", root, func() bool { return len(d.SoR.Refunds()) == 1 }, "refund")

	if _, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $70 on order 1234 too", root); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the second refund, run under the grant", func() bool { return len(d.SoR.Refunds()) == 2 })
	if n := len(refundCards()); n != 1 {
		t.Fatalf("refund cards = %d after a pre-authorised refund, want still 1", n)
	}
	if got := d.SoR.Refunds()[1].Amount; got != 70 {
		t.Errorf("second refund amount = %v, want 70", got)
	}
	waitWS(t, d, "a note under the granting card", func() bool {
		for _, m := range ws.Replies(cast.Approvals.ID, card.TS) {
			if m.BotID != "" && strings.Contains(m.Text, "under this pre-authorisation") && strings.Contains(m.Text, `"amount":70`) {
				return true
			}
		}
		return false
	})

	// The granting card shows what the budget has left; a refund that
	// would pass it ($70 + $55 > $100) gets a card of its own.
	waitWS(t, d, "the budget used on the granting card", func() bool {
		m, _ := ws.Message(cast.Approvals.ID, card.TS)
		return strings.Contains(string(m.Blocks), "$70.00 of $100.00 used")
	})
	if _, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $55 on order 1234 also", root); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "a card for the refund past the budget, bound", func() bool {
		cards := refundCards()
		if len(cards) != 2 {
			return false
		}
		v := buttonValue.FindStringSubmatch(string(cards[1].Blocks))
		if v == nil {
			return false
		}
		r, err := d.Main.Store.Request(context.Background(), v[1])
		return err == nil && r.Card.TS == cards[1].TS
	})
	if n := len(d.SoR.Refunds()); n != 2 {
		t.Errorf("refunds = %d after a refund past the budget, want it waiting for a decision", n)
	}
	// Approved by hand, so the thread's run goes on.
	if err := ws.Click(bob, cast.Approvals.ID, refundCards()[1].TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the refund past the budget, approved by hand", func() bool { return len(d.SoR.Refunds()) == 3 })

	if err := ws.Click(carol, cast.Approvals.ID, card.TS, "cs_revoke_grant"); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "revocation on the card", func() bool {
		m, _ := ws.Message(cast.Approvals.ID, card.TS)
		return strings.Contains(string(m.Blocks), `Pre-authorisation revoked by \u003c@`+carol)
	})
	if _, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $80 on order 1234 as well", root); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "a card again after the revocation", func() bool { return len(refundCards()) == 3 })
	if n := len(d.SoR.Refunds()); n != 3 {
		t.Errorf("refunds = %d, want the fourth waiting for a decision", n)
	}

	// A refund over the deny rule's limit is refused without a card, and
	// the answer says why.
	other, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $2500 on order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	waitBotReply(t, d, "the denied refund's answer", other, nil, "finance")
	if n := len(refundCards()); n != 3 {
		t.Errorf("refund cards = %d after a denied refund, want still 3", n)
	}

	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[approval.Event][]approval.Entry{}
	for _, e := range entries {
		seen[e.Event] = append(seen[e.Event], e)
	}
	if g := seen[approval.EventGranted]; len(g) != 1 || g[0].Actor != bob {
		t.Errorf("grant_created = %+v, want one by bob", g)
	}
	if p := seen[approval.EventPreauthorized]; len(p) != 1 || !strings.Contains(string(p[0].Data), `"granted_by":"`+bob+`"`) {
		t.Errorf("preauthorized = %+v, want one naming bob", p)
	}
	if r := seen[approval.EventGrantRevoked]; len(r) != 1 || r[0].Actor != carol {
		t.Errorf("grant_revoked = %+v, want one by carol", r)
	}
	denied := 0
	for _, e := range seen[approval.EventCallRefused] {
		if e.Actor == "gate" && strings.Contains(string(e.Data), "deny_rule") {
			denied++
		}
	}
	if denied != 1 {
		t.Errorf("call_refused by the deny rule = %d, want 1", denied)
	}
	if _, err := audit.Verify(context.Background()); err != nil {
		t.Errorf("audit Verify: %v", err)
	}

	// The audit CLI tells the story of the call run under the grant.
	t.Setenv("REDIS_URL", storetestURL(t, d.Redis))
	t.Setenv("COUNTERSIGN_AUDIT_STREAM", d.Main.Config.AuditStream)
	if p := seen[approval.EventPreauthorized]; len(p) == 1 {
		code, out, errOut := runCLI(t.Context(), "audit", "show", p[0].RequestID)
		t.Logf("audit show (pre-authorised refund):\n%s", out)
		if code != 0 || !strings.Contains(out, "under an approver's pre-authorisation") || !strings.Contains(out, "pre-authorised by "+bob) {
			t.Errorf("audit show %s = exit %d:\n%s%s", p[0].RequestID, code, out, errOut)
		}
	}
	code, out, errOut := runCLI(t.Context(), "audit", "tail", "-n", "200")
	if code != 0 || !strings.Contains(out, "grant_created") || !strings.Contains(out, "preauthorized") || !strings.Contains(out, "grant_revoked") {
		t.Errorf("audit tail = exit %d:\n%s%s", code, out, errOut)
	}
}
