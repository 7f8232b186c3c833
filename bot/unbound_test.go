package bot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
)

// interact delivers a signed block_actions payload to process b.
func interact(tb testing.TB, h *harness, b *bot.Bot, payload map[string]any) {
	tb.Helper()
	raw, err := json.Marshal(payload)
	if err != nil {
		tb.Fatal(err)
	}
	body := "payload=" + url.QueryEscape(string(raw))
	if code := post(tb, b.HTTPHandler(), "/slack/interactive", sign(secret, h.clock.Now().Unix(), body), body).Code; code != 200 {
		tb.Fatalf("interactive payload answered %d", code)
	}
}

// TestNoClickOnARealCardWaits (issue 28, point 3, acceptance): whatever
// Slack's delay in answering the chat.postMessage that posts a card —
// answered before the click, after it, or never — and wherever the
// posting process stops — before posting, after posting and before
// binding, after binding (another process takes the clicks over) — a
// click on the real card by an approver decides, binding the card when
// nothing bound it yet; nobody is told to try again. Clicks forged around
// it (the request's value on another request's card, on a person's
// message that claims to be the card, on the card's ts in another
// channel, on an unknown message; another request's value on the card)
// decide nothing and bind nothing. Each case is clicked through Slack's
// own payload (the message and its metadata, as slacksim sends it) and
// through a payload without the message's metadata (the card is then
// looked up with conversations.history). Slack's answer is held by the
// workspace (HoldAnswer), not delayed by timing.
func TestNoClickOnARealCardWaits(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	other := h.request(nil) // a bound card of another request
	personTS, err := h.ws.PostMessage(alice, approvals, "lgtm, approving", "")
	if err != nil {
		t.Fatal(err)
	}
	type scenario struct{ crash, delay, path string }
	var cases []scenario
	for _, crash := range []string{"none", "before post", "after post", "after bind"} {
		for _, delay := range []string{"answered", "late", "never"} {
			if crash == "after bind" && delay != "answered" {
				continue // bound: Slack answered
			}
			for _, path := range []string{"payload", "lookup"} {
				cases = append(cases, scenario{crash, delay, path})
			}
		}
	}
	for i, sc := range cases {
		name := fmt.Sprintf("case %d (crash %s, answer %s, card from the %s)", i, sc.crash, sc.delay, sc.path)
		r := h.newPending()
		first := h.newBot() // the posting process
		h.route(first)
		clicks := first // the process Slack delivers clicks to
		pctx, stop := context.WithCancel(h.ctx)
		posted := make(chan error, 1)
		postCard := func(p *bot.Bot, hold bool) (release func()) {
			release = func() {}
			var taken <-chan struct{}
			if hold {
				taken, release = h.ws.HoldAnswer("chat.postMessage", map[string]string{"channel": approvals})
			}
			go func() { // exits once Slack answers, or when pctx ends
				_, err := h.post(pctx, p, r)
				posted <- err
			}()
			if hold {
				<-taken // the card is on screen; its answer waits
			} else if err := <-posted; err != nil {
				t.Fatalf("%s: Post: %v", name, err)
			}
			return release
		}
		release := func() {}
		late := false // Post still waits for its answer
		switch sc.crash {
		case "none":
			release = postCard(first, sc.delay != "answered")
			late = sc.delay != "answered"
		case "before post":
			// The first process noted its attempt and stopped; the next
			// one posts.
			if _, err := h.requests.StartCardPost(h.ctx, r.ID); err != nil {
				t.Fatal(err)
			}
			clicks = h.newBot()
			h.route(clicks)
			release = postCard(clicks, sc.delay != "answered")
			late = sc.delay != "answered"
		case "after post":
			// The first process posted and never learns where (it is gone).
			postCard(first, true)
			clicks = h.newBot()
			h.route(clicks)
			if sc.delay == "answered" { // the next process adopted the request before the click
				if _, err := h.post(h.ctx, clicks, r); err != nil {
					t.Fatalf("%s: adopting Post: %v", name, err)
				}
			}
		case "after bind":
			postCard(first, false)
			clicks = h.newBot()
			h.route(clicks)
		}
		cards := cardsOf(h, r.ID)
		if len(cards) != 1 {
			t.Fatalf("%s: cards on screen = %d, want 1", name, len(cards))
		}
		card := cards[0].TS
		boundBefore := h.load(r.ID).Card
		value := r.ID + "|" + h.load(r.ID).Digest

		// Forged clicks: none decides, none binds.
		forged := []map[string]any{
			clickPayload(bob, approvals, other.Card.TS, "cs_approve", value),
			clickPayload(bob, approvals, "1772442000.123456", "cs_approve", value),
			clickPayload(bob, tasks, card, "cs_approve", value),
		}
		claim := clickPayload(bob, approvals, personTS, "cs_approve", value)
		claim["message"] = map[string]any{"ts": personTS, "user": alice,
			"metadata": map[string]any{"event_type": "countersign_card", "event_payload": map[string]any{"request_id": r.ID}}}
		forged = append(forged, claim)
		for n, p := range forged {
			interact(t, h, clicks, p)
			if ev, reason := h.outcome(r.ID, n); ev != approval.EventDecisionRefuse {
				t.Fatalf("%s: forged click %d = %s/%s, want refused", name, n, ev, reason)
			}
		}
		seenOther := len(outcomes(h, other.ID))
		interact(t, h, clicks, clickPayload(bob, approvals, card, "cs_approve", other.ID+"|"+other.Digest))
		if ev, reason := h.outcome(other.ID, seenOther); ev != approval.EventDecisionRefuse {
			t.Fatalf("%s: another request's value on the card = %s/%s, want refused", name, ev, reason)
		}
		if got := h.load(r.ID); got.Status != approval.StatusPending || got.Card != boundBefore {
			t.Fatalf("%s: after forged clicks = %s on %v, want pending on %v", name, got.Status, got.Card, boundBefore)
		}

		// The real click.
		if sc.path == "payload" {
			if err := h.ws.Click(bob, approvals, card, "cs_approve"); err != nil {
				t.Fatal(err)
			}
		} else {
			interact(t, h, clicks, clickPayload(bob, approvals, card, "cs_approve", value))
		}
		if ev, reason := h.outcome(r.ID, len(forged)); ev != approval.EventDecided {
			t.Fatalf("%s: click on the real card = %s/%s, want decided", name, ev, reason)
		}
		if sc.crash == "after post" && sc.delay == "late" { // adopted after the click
			if _, err := h.post(h.ctx, clicks, r); err != nil {
				t.Fatalf("%s: adopting Post: %v", name, err)
			}
		}
		if late && sc.delay == "late" {
			release()
			if err := <-posted; err != nil {
				t.Fatalf("%s: Post answered late: %v", name, err)
			}
		}
		stop() // a process still waiting for its answer gives up
		got := h.load(r.ID)
		if got.Status != approval.StatusApproved || got.Card != (approval.CardRef{Channel: approvals, TS: card}) {
			t.Fatalf("%s: request = %s on %v, want approved on its card %s", name, got.Status, got.Card, card)
		}
		n := 0
		for _, m := range h.ws.Messages(approvals) {
			if m.ThreadTS == "" && strings.Contains(string(m.Metadata), r.ID) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: cards = %d, want 1", name, n)
		}
		posts := 0
		for _, rec := range h.audit.Records(approval.EventCardPosted) {
			if rec.RequestID == r.ID {
				posts++
			}
		}
		if posts != 1 {
			t.Errorf("%s: card_posted entries = %d, want 1", name, posts)
		}
		for _, m := range h.ws.Ephemerals(bob) {
			if text := strings.ToLower(m.Text + allText(m.Blocks)); strings.Contains(text, "try again") || strings.Contains(text, "still being posted") {
				t.Fatalf("%s: bob was told %q", name, m.Text)
			}
		}
	}
}

// outcomes are the audit entries that say what clicks on request id did.
func outcomes(h *harness, id string) []approval.Record {
	var out []approval.Record
	for _, rec := range h.audit.all() {
		if rec.RequestID == id && (rec.Event == approval.EventDecided || rec.Event == approval.EventApprovalVote || rec.Event == approval.EventDecisionRefuse) {
			out = append(out, rec)
		}
	}
	return out
}
