package bot_test

import (
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestCrashBetweenPostAndBindOnManifestScopes (issue 28, point 1): against
// a workspace granting only manifest.yml's scopes, a process stops after
// chat.postMessage and before binding the card; the restarted process
// finds the card on the private approvals channel (conversations.history
// with metadata, which needs groups:history) and binds it; the approver's
// click on that card decides and the request reaches its final state with
// one card.
func TestCrashBetweenPostAndBindOnManifestScopes(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.newPending()
	dead := make(chan struct{})
	t.Cleanup(func() { close(dead) })
	entered := make(chan struct{})
	h.requests.setBindHook(func(id string, _ approval.CardRef) {
		if id == r.ID {
			close(entered)
			<-dead // the first process never gets past posting
		}
	})
	first := h.bot
	go func() { _, _ = h.post(h.ctx, first, r) }() // exits at Cleanup (dead closed)
	<-entered
	h.requests.setBindHook(nil)

	second := h.newBot()
	if _, err := h.post(h.ctx, second, r); err != nil {
		t.Fatalf("Post after restart: %v", err)
	}
	var history []slacksim.Call
	for _, c := range h.ws.CallLog() {
		if c.Method == "conversations.history" {
			history = append(history, c)
		}
	}
	if len(history) == 0 || history[0].Error != "" || history[0].Params["include_all_metadata"] == "" {
		t.Fatalf("conversations.history calls = %+v, want one with metadata that Slack answers", history)
	}
	cards := cardsOf(h, r.ID)
	bound := h.load(r.ID)
	if len(cards) != 1 || bound.Card.TS != cards[0].TS {
		t.Fatalf("cards = %d, bound to %q; want the one card posted before the crash bound", len(cards), bound.Card.TS)
	}
	if err := h.ws.Click(bob, approvals, bound.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.waitStatus(r.ID, approval.StatusApproved)
	if _, err := h.life.Claim(h.ctx, r.ID, "agent"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.life.Finish(h.ctx, r.ID, "agent", approval.Outcome{Status: approval.StatusExecuted, Result: `{"id":"RF-7"}`}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second.CardsIdle():
	case <-time.After(hangAfter):
		t.Fatal("card writer busy")
	}
	card := h.card(bound)
	if hasAction(card.Blocks, "cs_approve") || !strings.Contains(allText(card.Blocks), "RF-7") {
		t.Errorf("card after execution = %s, want no buttons and the result", allText(card.Blocks))
	}
	if n := len(cardsOf(h, r.ID)); n != 1 {
		t.Errorf("cards for the request = %d, want 1", n)
	}
}

// TestCancelledWhileItsCardWasUnbound (issue 28, point 1): the process that
// posted a card stops before binding it, and the request is then really
// cancelled (its run stopped). The card on screen must say so, without
// buttons, rather than keep live buttons nobody can use.
func TestCancelledWhileItsCardWasUnbound(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.newPending()
	dead := make(chan struct{})
	t.Cleanup(func() { close(dead) })
	entered := make(chan struct{})
	h.requests.setBindHook(func(id string, _ approval.CardRef) {
		if id == r.ID {
			close(entered)
			<-dead // the poster never gets past posting
		}
	})
	first := h.bot
	go func() { _, _ = h.post(h.ctx, first, r) }() // exits at Cleanup (dead closed)
	<-entered
	h.requests.setBindHook(nil)
	cards := cardsOf(h, r.ID)
	if len(cards) != 1 || h.load(r.ID).Card.Bound() {
		t.Fatalf("cards = %d, bound %v; want one card up and unbound", len(cards), h.load(r.ID).Card.Bound())
	}

	second := h.newBot()
	h.livesMu.Lock()
	life := h.lives[second]
	h.livesMu.Unlock()
	if _, err := life.Cancel(h.ctx, r.ID, "agent", "the run was stopped"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	select {
	case <-second.CardsIdle():
	case <-time.After(hangAfter):
		t.Fatal("card writer busy")
	}
	var card slacksim.Message
	for _, m := range h.ws.Messages(approvals) {
		if m.TS == cards[0].TS {
			card = m
		}
	}
	if hasAction(card.Blocks, "cs_approve") || !strings.Contains(strings.ToLower(allText(card.Blocks)), "cancel") {
		t.Errorf("card of the cancelled request = %s, want it to say cancelled, without buttons", allText(card.Blocks))
	}
	if got := h.load(r.ID); got.Card.TS != card.TS {
		t.Errorf("card bound to %q, want the card on screen %q", got.Card.TS, card.TS)
	}
}
