package main_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/store"
)

// TestDemoEveryAuthorIsARequester: the model acts on the whole task
// thread, so everyone who posted in it since the run began counts as
// having asked for what the run proposes. One person asks for a lookup,
// another follows up in the thread asking for the refund; bob, an
// approver, is one of the two. The refund's card names both as who asked,
// bob's Approve is refused as his own request (four-eyes) and nothing
// runs; carol's Approve runs it once. Both orders: before, the requester
// was the latest author only, so bob asking first and letting alice's
// follow-up make the card let bob approve it himself.
func TestDemoEveryAuthorIsARequester(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		first, second func(c slacksim.DemoCast) string
	}{
		{"approver follows up",
			func(c slacksim.DemoCast) string { return c.Requester.ID },
			func(c slacksim.DemoCast) string { return c.Approver.ID }},
		{"approver asks first",
			func(c slacksim.DemoCast) string { return c.Approver.ID },
			func(c slacksim.DemoCast) string { return c.Requester.ID }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := startDemo(t, false)
			testEveryAuthorIsARequester(t, d, tt.first(d.Cast), tt.second(d.Cast))
		})
	}
}

// testEveryAuthorIsARequester: first asks for a lookup in a new task
// thread, second follows up there asking for the refund; one of them is
// bob (an approver).
func testEveryAuthorIsARequester(t *testing.T, d *main.Demo, first, second string) {
	ws, cast := d.Workspace, d.Cast
	bob, carol := cast.Approver.ID, cast.SecondApprover.ID
	mention := "<@" + slacksim.BotUserID + "> "

	root, err := ws.PostMessage(first, cast.Tasks.ID, mention+"order 1234 arrived damaged, please look it up", "")
	if err != nil {
		t.Fatalf("PostMessage(first): %v", err)
	}
	waitBotReply(t, d, "the lookup's answer", root, nil, "lookup_order")
	if _, ok := cardFor(d, "issue_refund"); ok {
		t.Fatal("a refund card before anyone asked for a refund")
	}
	if _, err := ws.PostMessage(second, cast.Tasks.ID, mention+"refund the shipping on order 1234", root); err != nil {
		t.Fatalf("PostMessage(follow-up): %v", err)
	}
	waitWS(t, d, "the refund card", func() bool { _, ok := cardFor(d, "issue_refund"); return ok })
	card, _ := cardFor(d, "issue_refund")
	id := buttonValue.FindStringSubmatch(string(card.Blocks))[1]
	r, err := d.Main.Store.Request(context.Background(), id)
	if err != nil {
		t.Fatalf("Request(%s): %v", id, err)
	}
	if got, want := r.Requesters, []string{first, second}; !slices.Equal(got, want) {
		t.Errorf("the refund's requesters = %v (requester %q), want both authors in order %v", got, r.Requester, want)
	}
	blocks := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">").Replace(string(card.Blocks))
	if want := "not <@" + first + "> or <@" + second + "> (who asked)"; !strings.Contains(blocks, want) {
		t.Errorf("card blocks %s\ndo not say %q", blocks, want)
	}

	if err := ws.Click(bob, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(bob approve): %v", err)
	}
	waitWS(t, d, "bob's click answered", func() bool {
		if len(ws.Ephemerals(bob)) > 0 || len(d.SoR.Refunds()) > 0 {
			return true
		}
		cur, err := d.Main.Store.Request(context.Background(), id)
		return err == nil && cur.Status != approval.StatusPending
	})
	var told []string
	for _, m := range ws.Ephemerals(bob) {
		told = append(told, m.Text)
	}
	if !slices.ContainsFunc(told, func(s string) bool { return strings.Contains(s, "You asked for this") }) {
		t.Errorf("bob was told %q, want the four-eyes refusal (\"You asked for this ...\")", told)
	}
	if cur, err := d.Main.Store.Request(context.Background(), id); err != nil || cur.Status != approval.StatusPending || len(cur.Approvals) != 0 {
		t.Fatalf("after bob's Approve: request = %+v, %v; want pending with no approval", cur, err)
	}
	if got := d.SoR.Refunds(); len(got) != 0 {
		t.Fatalf("refunds after bob's refused Approve = %+v, want none", got)
	}

	if err := ws.Click(carol, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(carol approve): %v", err)
	}
	waitBotReply(t, d, "the refund's answer", root, func() bool { return len(d.SoR.Refunds()) == 1 }, "issue_refund")
	if got := d.SoR.Refunds(); len(got) != 1 || got[0].IdempotencyKey != id {
		t.Errorf("refunds = %+v, want one, keyed %s", got, id)
	}
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var refused, decided []string
	for _, e := range entries {
		switch {
		case e.RequestID != id:
		case e.Event == approval.EventDecisionRefuse:
			refused = append(refused, e.Actor)
		case e.Event == approval.EventDecided:
			decided = append(decided, e.Actor)
		}
	}
	if !slices.Equal(refused, []string{bob}) || !slices.Equal(decided, []string{carol}) {
		t.Errorf("audit of %s: refused by %v, decided by %v; want refused by bob, decided by carol", id, refused, decided)
	}
}

// TestDemoGrantorWhoPostsIsNoLongerAGrantor: bob's "Approve + allow" on
// alice's refund lets her further refunds in the thread run without a
// card, but once bob has posted in the thread himself he counts as having
// asked for what the run proposes, and a grant never covers its grantor's
// calls: alice's next refund gets a card (before, it ran under bob's
// grant).
func TestDemoGrantorWhoPostsIsNoLongerAGrantor(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	alice, bob, carol := cast.Requester.ID, cast.Approver.ID, cast.SecondApprover.ID
	mention := "<@" + slacksim.BotUserID + "> "
	refundCards := func() []slacksim.Message {
		var out []slacksim.Message
		for _, m := range ws.Messages(cast.Approvals.ID) {
			if m.ThreadTS == "" && strings.Contains(string(m.Blocks), "issue_refund") && buttonValue.MatchString(string(m.Blocks)) {
				out = append(out, m)
			}
		}
		return out
	}
	// approveNext waits for the n-th refund card, bound, and has who
	// approve it with action.
	approveNext := func(n int, who, action string) {
		t.Helper()
		waitWS(t, d, "refund card bound", func() bool {
			cards := refundCards()
			if len(cards) < n {
				return false
			}
			r, err := d.Main.Store.Request(context.Background(), buttonValue.FindStringSubmatch(string(cards[n-1].Blocks))[1])
			return err == nil && r.Card.TS == cards[n-1].TS
		})
		if err := ws.Click(who, cast.Approvals.ID, refundCards()[n-1].TS, action); err != nil {
			t.Fatal(err)
		}
	}

	root, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $60 on order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	approveNext(1, bob, "cs_approve_allow")
	waitBotReply(t, d, "the first answer", root, func() bool { return len(d.SoR.Refunds()) == 1 }, "refund")

	if _, err := ws.PostMessage(bob, cast.Tasks.ID, mention+"refund $80 on order 1234 too", root); err != nil {
		t.Fatal(err)
	}
	approveNext(2, carol, "cs_approve")
	waitWS(t, d, "bob's refund, approved by carol", func() bool { return len(d.SoR.Refunds()) == 2 })

	if _, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"refund $70 on order 1234 as well", root); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "alice's third refund: a card, or run", func() bool { return len(refundCards()) == 3 || len(d.SoR.Refunds()) == 3 })
	if n, got := len(refundCards()), len(d.SoR.Refunds()); n != 3 || got != 2 {
		t.Fatalf("after bob posted in the thread: %d refund cards and %d refunds, want a third card and still 2 refunds (bob's grant does not cover a run he asked in)", n, got)
	}
}
