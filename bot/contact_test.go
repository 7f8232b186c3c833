package bot_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// contactRequest stores a pending contact request (a question from a
// HumanLayer caller) with choices and posts its Respond card.
func contactRequest(h *harness, msg string, choices []approval.Choice) *approval.Request {
	h.t.Helper()
	args, _ := json.Marshal(map[string]string{"msg": msg})
	return h.request(func(r *approval.Request) {
		r.Origin, r.Requester = approval.Origin{}, "humanlayer:support-bot"
		r.Caller = approval.Caller{Kind: approval.CallerHumanLayer, Name: "support-bot"}
		r.Kind, r.Tool, r.Args, r.Choices = approval.KindContact, approval.ContactTool, args, choices
		r.Reason, r.Preview, r.Signals = "", approval.Preview{}, nil
		r.Decisions = []approval.Verdict{approval.VerdictRespond}
	})
}

// TestContactCardWithinLimits: a question at the API's limits (4,000
// bytes, ten choices with 200-byte titles and 2,000-byte descriptions,
// text trying to ping the channel) is posted as a Respond card Slack
// accepts (the workspace refuses anything over Block Kit's limits), with
// the question escaped and only an Answer button; its modal offers the
// choices as radio buttons within their limits.
func TestContactCardWithinLimits(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	msg := "<!channel> " + strings.Repeat("Which warehouse? ", 235)
	var choices []approval.Choice
	for i := range 10 {
		choices = append(choices, approval.Choice{Name: fmt.Sprintf("opt_%d", i), Title: strings.Repeat("T", 190) + "<!here>",
			Description: strings.Repeat("d", 2000), PromptFill: "fill"})
	}
	r := contactRequest(h, msg, choices)
	card := h.card(r)
	text := string(card.Blocks)
	if strings.Contains(text, "<!channel>") || strings.Contains(text, "<!here>") {
		t.Errorf("card pings the channel: %s", text)
	}
	if !hasAction(card.Blocks, "cs_respond") || hasAction(card.Blocks, "cs_approve") || hasAction(card.Blocks, "cs_reject") {
		t.Errorf("card buttons wrong, want only Answer: %s", text)
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v := h.openView(bob, "cs_respond")
	if !strings.Contains(string(v.Blocks), "radio_buttons") || !strings.Contains(string(v.Blocks), "opt_9") {
		t.Errorf("answer modal lacks the choices: %s", v.Blocks)
	}
}

// TestContactAnswerChoiceAlone: an answer given by picking a choice and
// writing nothing says the choice's prompt_fill; a choice the request does
// not offer (a forged form) is refused and changes nothing.
func TestContactAnswerChoiceAlone(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	choices := []approval.Choice{{Name: "north", Title: "North"}, {Name: "south", Title: "South", PromptFill: "ship from south"}}

	forged := contactRequest(h, "Which warehouse?", choices)
	if err := h.ws.Click(bob, approvals, forged.Card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v := h.openView(bob, "cs_respond")
	bogus := map[string]any{"type": "radio_buttons", "selected_option": map[string]any{"value": "east"}}
	if _, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"choice": {"choice": bogus}}); err != nil {
		t.Fatalf("SubmitView: %v", err)
	}
	h.ephemeralContaining(bob, "not one this request offers")
	if got := h.load(forged.ID); got.Status != approval.StatusPending {
		t.Errorf("forged choice: status %s, want pending", got.Status)
	}

	r := contactRequest(h, "Which warehouse, again?", choices)
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v = h.openView(carol, "cs_respond")
	if res, err := h.ws.SubmitView(carol, v.ID, map[string]map[string]any{"choice": {"choice": "south"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusResponded)
	if d := got.Decision; d == nil || d.Text != "ship from south" || d.Choice != "south" || d.Approver != carol {
		t.Fatalf("decision = %+v, want south's prompt_fill by %s", got.Decision, carol)
	}
	h.waitWS("the card answered", func() bool {
		b := string(h.card(r).Blocks)
		return strings.Contains(b, "Answered") && strings.Contains(b, "South") && !hasAction(h.card(r).Blocks, "cs_respond")
	})
	if b := string(h.card(r).Blocks); !strings.Contains(b, "*Picked:* South") || !strings.Contains(b, "*Answer:* ship from south") {
		t.Errorf("card of a choice with its own prompt_fill = %s, want the pick and the answer", b)
	}

	// A choice with no prompt_fill, and no words of one's own: the answer
	// is the choice, said once.
	plain := contactRequest(h, "Which warehouse, finally?", choices)
	if err := h.ws.Click(carol, approvals, plain.Card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v = h.openView(carol, "cs_respond")
	if res, err := h.ws.SubmitView(carol, v.ID, map[string]map[string]any{"choice": {"choice": "north"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	h.waitStatus(plain.ID, approval.StatusResponded)
	h.waitWS("the plain card answered", func() bool { return strings.Contains(string(h.card(plain).Blocks), "*Answer:* North") })
	if b := string(h.card(plain).Blocks); strings.Contains(b, "Picked") {
		t.Errorf("card of a bare choice = %s, want the answer once, no Picked line", b)
	}
}
