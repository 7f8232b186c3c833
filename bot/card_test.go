package bot_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestCardArgumentNamesCannotForgeLines: an argument whose name holds a
// newline (or a colon, or a right-to-left override) is shown quoted, so it
// cannot pass on the card for another argument's line, in the argument
// list or in the edit diff.
func TestCardArgumentNamesCannotForgeLines(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(func(r *approval.Request) {
		r.Args = json.RawMessage(`{"amount":5,"amount: 500\nnote":"x","\u202eamount":1}`)
	})
	lines := func(blocks json.RawMessage) []string {
		return strings.Split(allText(blocks), "\n")
	}
	for _, l := range lines(h.card(r).Blocks) {
		if strings.HasPrefix(l, "amount: 500") || strings.HasPrefix(l, "note: ") || strings.Contains(l, "\u202e") {
			t.Errorf("card line %q: an argument name forged a line", l)
		}
	}
	if text := allText(h.card(r).Blocks); !strings.Contains(text, `"amount: 500\nnote": "x"`) || !strings.Contains(text, `"\u202eamount": 1`) {
		t.Errorf("card does not show the odd names quoted:\n%s", text)
	}

	cur := h.load(r.ID)
	final, err := h.store.Decide(h.ctx, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Approver: bob, At: h.clock.Now(),
		Digest: cur.Digest, Args: json.RawMessage(`{"amount":5,"amount: 500\nnote":"y","\u202eamount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(final)
	for _, l := range lines(h.card(r).Blocks) {
		if strings.HasPrefix(l, "note: ") || strings.HasPrefix(l, "amount: 500") {
			t.Errorf("final card line %q: an argument name forged a line", l)
		}
	}
	if text := allText(h.card(r).Blocks); !strings.Contains(text, `"amount: 500\nnote": "x" → "y"`) {
		t.Errorf("diff does not show the odd name quoted:\n%s", text)
	}
}

// TestCardNotificationNamesRequester: the card's notification text
// mentions the requester (not a literal "&lt;@U…&gt;") and escapes the rest.
func TestCardNotificationNamesRequester(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(nil)
	text := h.card(r).Text
	if !strings.Contains(text, "requested by <@"+alice+">") || strings.Contains(text, "&lt;") {
		t.Errorf("card notification text = %q, want it to mention <@%s>", text, alice)
	}
}
