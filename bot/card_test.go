package bot_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestCardArgumentNamesCannotForgeLines: an argument whose name holds a
// newline (or a colon, or a right-to-left override) is shown quoted, so it
// cannot pass on the card for another argument's line, in the argument
// list or in the edit diff.
func TestCardArgumentNamesCannotForgeLines(t *testing.T) {
	// Only an undeclared tool (no schema of ours) can carry such names.
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: externalPolicy})
	r := h.request(func(r *approval.Request) {
		r.Tool, r.Caller = "crm_update", approval.Caller{Kind: approval.CallerAPI, Name: "support-bot"}
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
	final, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Approver: bob, At: h.clock.Now(),
		Digest: cur.Digest, Args: json.RawMessage(`{"amount":5,"amount: 500\nnote":"y","\u202eamount":1}`)}, approval.DecideOptions{})
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

// TestCardSaysWhoDecidesAndAsksToConfirm: a pending card names its
// approvers and how many are needed (and that the requester is not one);
// a tool that asks for confirmation puts Slack's confirm dialog on its
// Approve button, one that does not gets none.
func TestCardSaysWhoDecidesAndAsksToConfirm(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(func(r *approval.Request) {
		r.Approvers = approval.Approvers{Users: []string{bob}, Usergroups: []string{"S0LEADS01"}}
		r.Quorum = 2
		r.Confirm = true
	})
	card := h.card(r)
	text := allText(card.Blocks)
	if !strings.Contains(text, "Approvers: <@"+bob+">, <!subteam^S0LEADS01> · 2 of them needed · not <@"+alice+"> (who asked)") {
		t.Errorf("card lacks the approvers line:\n%s", text)
	}
	var blocks []map[string]any
	if err := json.Unmarshal(card.Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	confirmOn := map[string]bool{}
	for _, b := range blocks {
		els, _ := b["elements"].([]any)
		for _, e := range els {
			el, _ := e.(map[string]any)
			if id, _ := el["action_id"].(string); id != "" {
				_, confirmOn[id] = el["confirm"]
			}
		}
	}
	if !confirmOn["cs_approve"] || confirmOn["cs_reject"] {
		t.Errorf("confirm dialogs on %v, want on Approve only", confirmOn)
	}
	plain := h.request(func(r *approval.Request) { r.Confirm = false })
	if strings.Contains(string(h.card(plain).Blocks), `"confirm"`) {
		t.Errorf("a card without Confirm has a confirm dialog")
	}
}

// TestDecidedCardReadsAsDecided: once decided the card no longer says the
// arguments are "exactly as they will be used"; after it ran, the result
// is a readable summary, not JSON; the preview's source is a detail line
// naming the system (its label), not part of the headline.
func TestDecidedCardReadsAsDecided(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(func(r *approval.Request) { r.Preview.Source = "the order system" })
	pending := allText(h.card(r).Blocks)
	if !strings.Contains(pending, "exactly as they will be used") || strings.Contains(pending, "*What will happen* _(from") ||
		!strings.Contains(pending, "\nFacts from the order system\n") {
		t.Errorf("pending card:\n%s", pending)
	}
	cur := h.load(r.ID)
	if _, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Claim(h.ctx, r.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	done, err := h.store.Finish(h.ctx, r.ID, approval.StatusExecuted, `{"refund_id":"RF-1","status":"refunded","amount":64,"lines":[1,2]}`)
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(done)
	text := allText(h.card(r).Blocks)
	if strings.Contains(text, "exactly as they will be used") || !strings.Contains(text, "(as approved)") {
		t.Errorf("decided card still promises the arguments will be used:\n%s", text)
	}
	if !strings.Contains(text, "Ran*: amount 64 · refund_id RF-1 · status refunded") || strings.Contains(text, `"refund_id"`) {
		t.Errorf("decided card shows the result as JSON:\n%s", text)
	}
}

// TestFormattedValues: an argument the policy formats reads with its unit
// next to its exact value on the card, and the edit modal says in what
// unit to write it.
func TestFormattedValues(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) {
		r.Formats = map[string]approval.ValueFormat{"amount": {Kind: approval.FormatCurrency, Currency: "USD"}}
	})
	if text := allText(h.card(r).Blocks); !strings.Contains(text, "amount: 64   = $64.00") {
		t.Errorf("card does not show the amount with its unit:\n%s", text)
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	if !strings.Contains(string(v.Blocks), "In USD: 64 is $64.00.") {
		t.Errorf("edit modal does not say the amount's unit: %s", v.Blocks)
	}
}

// TestPreauthorizationBudgetOnCard: a pre-authorisation with limits is
// offered with them on the button, and the card that granted it shows
// what was used and what is left.
func TestPreauthorizationBudgetOnCard(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	limits := approval.GrantLimits{MaxUses: 2, Argument: "amount", MaxTotal: 100}
	usd := map[string]approval.ValueFormat{"amount": {Kind: approval.FormatCurrency, Currency: "USD"}}
	r := h.request(func(r *approval.Request) {
		r.Preauthorize, r.PreauthorizeLimits, r.Formats = 24*time.Hour, limits, usd
	})
	if text := allText(h.card(r).Blocks); !strings.Contains(text, "Approve + allow up to $100.00 in all, 2 more calls for 24h") {
		t.Errorf("card lacks the limited Approve + allow:\n%s", text)
	}
	g := &approval.Grant{ID: "grant_1", Tool: r.Tool, Requester: alice, Origin: r.Origin, GrantedBy: bob, RequestID: r.ID,
		Created: h.clock.Now(), Expires: h.clock.Now().Add(24 * time.Hour), Limits: limits}
	if err := h.store.PutGrant(h.ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := h.store.UseGrant(h.ctx, g, "req_a", 70); !ok || err != nil {
		t.Fatalf("UseGrant = %v, %v", ok, err)
	}
	h.redraw(h.load(r.ID))
	if text := allText(h.card(r).Blocks); !strings.Contains(text, "$70.00 of $100.00 used, 1 call left") {
		t.Errorf("granting card lacks the budget used:\n%s", text)
	}
}

// TestFormattedResult: after the call ran, a result field named like a
// formatted argument reads in that format on the card's Ran line; other
// fields read as they are.
func TestFormattedResult(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(func(r *approval.Request) {
		r.Formats = map[string]approval.ValueFormat{"amount": {Kind: approval.FormatCurrency, Currency: "USD"}}
	})
	cur := h.load(r.ID)
	if _, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Claim(h.ctx, r.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	done, err := h.store.Finish(h.ctx, r.ID, approval.StatusExecuted, `{"refund_id":"RF-1","status":"refunded","amount":1289}`)
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(done)
	if text := allText(h.card(r).Blocks); !strings.Contains(text, "Ran*: amount $1,289.00 · refund_id RF-1 · status refunded") {
		t.Errorf("the Ran line does not read the amount in dollars:\n%s", text)
	}
}

// TestUndeclaredToolCardNamesItsSource: the card of a tool the policy does
// not declare says so right under the line that names where the call came
// from (the MCP upstream, the API key: names, never ids), which it does
// not repeat; a declared tool's card has no such line.
func TestUndeclaredToolCardNamesItsSource(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared = "issue_refund_v2", true
		r.Caller = approval.Caller{Kind: approval.CallerAPI, Name: "support-bot", Upstream: "billing"}
		r.Requester, r.Origin = "api:support-bot", approval.Origin{}
	})
	var blocks []struct {
		Type     string           `json:"type"`
		Elements []map[string]any `json:"elements"`
	}
	if err := json.Unmarshal(h.card(r).Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	if len(blocks) < 3 || blocks[0].Type != "header" || blocks[2].Type != "context" || len(blocks[2].Elements) == 0 {
		t.Fatalf("card blocks = %+v, want header, who, then the undeclared line", blocks)
	}
	who, _ := blocks[1].Elements[0]["text"].(string)
	if want := "Requested through MCP upstream `billing` (the MCP gateway, key `support-bot`)"; who != want {
		t.Errorf("who-asked line = %q, want %q", who, want)
	}
	got, _ := blocks[2].Elements[0]["text"].(string)
	if want := "⚠️ `issue_refund_v2` is not declared in the policy: judged by its external rule"; got != want {
		t.Errorf("undeclared line = %q, want %q", got, want)
	}
	if n := strings.Count(allText(h.card(r).Blocks), "`billing`"); n != 1 {
		t.Errorf("the card names the MCP upstream %d times, want once", n)
	}

	declared := h.request(nil)
	if text := allText(h.card(declared).Blocks); strings.Contains(text, "not declared in the policy") {
		t.Errorf("a declared tool's card says it is undeclared:\n%s", text)
	}
}
