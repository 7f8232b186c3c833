package bot_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// sectionAfter returns the text of the first block text that starts with
// head, "" when none does.
func sectionAfter(raw json.RawMessage, head string) string {
	for _, s := range blockTexts(raw) {
		if strings.HasPrefix(s, head) {
			return s
		}
	}
	return ""
}

// TestRanLineSummarisesResult: after an email ran, the card's Ran line
// says what ran in one line: the result's own fields, not the email body
// the card already shows among the arguments, never the idempotency key;
// a long value is cut with a note.
func TestRanLineSummarisesResult(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	body := "Dear Dana,\n\n" + strings.Repeat("We are sorry your table arrived damaged. ", 20) + "\n\nBest, Support"
	args, _ := json.Marshal(map[string]string{"to": "dana@example.com", "subject": "Sorry", "body": body})
	r := h.request(func(r *approval.Request) { r.Args = args })
	cur := h.load(r.ID)
	if _, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Claim(h.ctx, r.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	result, _ := json.Marshal(map[string]string{"id": "EM-1", "to": "dana@example.com", "subject": "Sorry", "body": body,
		"idempotency_key": r.ID, "note": strings.Repeat("x", 500)})
	done, err := h.store.Finish(h.ctx, r.ID, approval.StatusExecuted, string(result))
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(done)
	ran := sectionAfter(h.card(r).Blocks, "✅ *Ran*")
	if ran == "" {
		t.Fatalf("no Ran line on the card:\n%s", allText(h.card(r).Blocks))
	}
	if !strings.Contains(ran, "id EM-1") || !strings.Contains(ran, "subject Sorry") || !strings.Contains(ran, "to dana@example.com") {
		t.Errorf("Ran line = %q, want the email's id, subject and recipient", ran)
	}
	if strings.Contains(ran, "table arrived") || strings.Contains(ran, r.ID) || strings.Contains(ran, "idempotency") {
		t.Errorf("Ran line = %q, want neither the body nor the idempotency key", ran)
	}
	if strings.Contains(ran, "\n") || !strings.Contains(ran, "(truncated, 500 chars)") || len([]rune(ran)) > 400 {
		t.Errorf("Ran line = %q (%d chars), want one line with the long value cut and noted", ran, len([]rune(ran)))
	}
}

// TestEveryCardSaysWhatWillHappen: a tool without a system-of-record
// summary (a preview of facts only, or none) still says what will happen,
// in the policy's description of the tool, labelled as such; it never
// holds the model's words nor the arguments (their block shows them,
// once), and it says nothing the facts below it contradict ("no system of
// record previews this tool" above the facts one read). A tool the policy
// does not describe is named instead.
func TestEveryCardSaysWhatWillHappen(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: externalPolicy})
	factsOnly := h.request(func(r *approval.Request) {
		r.Preview = approval.Preview{Facts: []approval.Fact{{Label: "Customer", Value: "Dana"}}, Source: "the order system"}
	})
	card := allText(h.card(factsOnly).Blocks)
	got := sectionAfter(h.card(factsOnly).Blocks, "*What will happen*")
	want := "*What will happen*\nRefund an order.\n_The policy's description of the tool; its arguments are below._"
	if got != want {
		t.Errorf("What will happen = %q, want %q", got, want)
	}
	if strings.Contains(got, "arrived broken") || strings.Contains(got, "1234") {
		t.Errorf("What will happen holds the model's reason or an argument: %q", got)
	}
	if !strings.Contains(card, "Facts from the order system") || strings.Contains(card, "no system of record") {
		t.Errorf("a card with facts from the order system:\n%s", card)
	}

	undeclared := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared, r.Preview = "crm_update", true, approval.Preview{}
		r.Caller, r.Requester, r.Origin = approval.Caller{Kind: approval.CallerAPI, Name: "support-bot"}, "api:support-bot", approval.Origin{}
		r.Args = json.RawMessage(`{"id":"T-1","note":"line one\nline two"}`)
	})
	got = sectionAfter(h.card(undeclared).Blocks, "*What will happen*")
	if got != "*What will happen*\nRuns `crm_update` with the arguments below." {
		t.Errorf("What will happen of an undeclared tool = %q", got)
	}

	withSummary := h.request(nil)
	if got := sectionAfter(h.card(withSummary).Blocks, "*What will happen*"); got != "*What will happen*\nRefund $64.00 to Dana for order 1234" {
		t.Errorf("What will happen with a preview summary = %q", got)
	}
}

// TestMCPCardNamesUpstream: a call through the MCP gateway says on its
// card which MCP upstream it came from, not "through the API".
func TestMCPCardNamesUpstream(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: externalPolicy})
	r := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared = "github.create_issue", true
		r.Caller = approval.Caller{Kind: approval.CallerAPI, Name: "demo-agent", Upstream: "github"}
		r.Requester, r.Origin = "api:demo-agent", approval.Origin{}
	})
	who := sectionAfter(h.card(r).Blocks, "Requested ")
	if !strings.HasPrefix(who, "Requested through MCP upstream `github` (the MCP gateway, key `demo-agent`)") {
		t.Errorf("who-asked line = %q, want it to name the MCP upstream", who)
	}
	if text := h.card(r).Text; !strings.Contains(text, "MCP upstream `github`") {
		t.Errorf("card notification = %q, want it to name the MCP upstream", text)
	}
}

// boldAroundMarkup finds a *bold* span that holds a <…> control sequence
// (a date, a mention): Slack does not make such a span bold, and its
// asterisks show.
var boldAroundMarkup = regexp.MustCompile(`(^|[^\w*])\*[^*\n]*<[^*\n]*\*`)

// codeSpans are left alone: asterisks inside code are literal anyway.
var codeSpans = regexp.MustCompile("(?s)```.*?```|`[^`\n]*`")

// TestCardsHaveNoStrayAsterisks: no card (pending, in its cancel window,
// decided) puts a date or a mention inside *bold*, where Slack shows the
// asterisks instead.
func TestCardsHaveNoStrayAsterisks(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	after := h.request(func(r *approval.Request) {
		r.Mode, r.Decisions = approval.ModeAfter, []approval.Verdict{approval.VerdictCancel, approval.VerdictRunNow}
		r.Signals = []approval.Signal{{Code: approval.SignalReviewAfter, Text: "runs after a cancel window unless an approver cancels it"}}
	})
	pending := h.request(nil)
	decided := h.request(nil)
	cur := h.load(decided.ID)
	final, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: decided.ID, Verdict: approval.VerdictReject, Approver: bob, At: h.clock.Now(), Digest: cur.Digest, Text: "no"}, approval.DecideOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(final)
	for name, r := range map[string]*approval.Request{"review after": after, "pending": pending, "rejected": decided} {
		for _, s := range blockTexts(h.card(r).Blocks) {
			if m := boldAroundMarkup.FindString(codeSpans.ReplaceAllString(s, "")); m != "" {
				t.Errorf("%s card: %q puts markup inside bold (%q)", name, s, m)
			}
		}
	}
	if got := sectionAfter(h.card(after).Blocks, "⏱"); !strings.HasPrefix(got, "⏱ *Runs unless cancelled* · <!date^") {
		t.Errorf("review-after status line = %q", got)
	}
}

// TestRefusedNonApproverToldWhoDecides: someone in the approvals channel
// who may not decide is told who may: users and groups by mention (Slack
// shows their names, not ids), and that the requester may not.
func TestRefusedNonApproverToldWhoDecides(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	h.ws.AddUsergroup(slacksim.Usergroup{ID: "S0LEADS01", Handle: "leads", Name: "Leads", Users: []string{bob}})
	listed := h.request(func(r *approval.Request) {
		r.Approvers = approval.Approvers{Users: []string{bob}, Usergroups: []string{"S0LEADS01"}}
	})
	if err := h.ws.Click(carol, approvals, listed.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(carol, "not one of the approvers for this request, so nothing changed. Who decides: <@"+bob+"> or <!subteam^S0LEADS01> (not <@"+alice+">, who asked).")

}

// TestCardSaysRefusedOrReopened (issue 45): a request the claim's
// judgement refused says so on its card — approved by whom, refused when it
// was to run, why — with nothing left to click; one the policy in force
// asks more approvals of is pending again, says why, and offers its
// buttons for the rest.
func TestCardSaysRefusedOrReopened(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	approve := func(r *approval.Request) *approval.Request {
		t.Helper()
		cur := h.load(r.ID)
		got, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	refused := approve(h.request(nil))
	why := "the arguments are refused by policy: refunds above $100 go through finance"
	done, err := h.store.Refuse(h.ctx, refused.ID, refused.Digest, why)
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(done)
	text := allText(h.card(refused).Blocks)
	if !strings.Contains(text, "refused when it was to run") || !strings.Contains(text, "finance") || !strings.Contains(text, "nothing ran") {
		t.Errorf("refused card:\n%s\nwant it to say it was refused when it was to run, and why", text)
	}
	if strings.Contains(text, "Approve") && strings.Contains(string(h.card(refused).Blocks), `"action_id":"cs_approve"`) {
		t.Errorf("refused card still offers Approve:\n%s", text)
	}

	reopened := approve(h.request(nil))
	ro := approval.Reopening{At: h.clock.Now(), Need: 2, Have: 1, Reason: "the policy in force asks 2 approvals for the arguments and it has 1", Deadline: h.clock.Now().Add(time.Hour)}
	again, err := h.store.Reopen(h.ctx, reopened.ID, reopened.Digest, ro)
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(again)
	text = allText(h.card(reopened).Blocks)
	if !strings.Contains(text, "Waiting for approval") || !strings.Contains(text, "not enough to run") || !strings.Contains(text, "asks 2 approvals") {
		t.Errorf("reopened card:\n%s\nwant it waiting again, saying why", text)
	}
	if !strings.Contains(string(h.card(reopened).Blocks), `"action_id":"cs_approve"`) {
		t.Errorf("reopened card offers no Approve for the rest:\n%s", h.card(reopened).Blocks)
	}
}
