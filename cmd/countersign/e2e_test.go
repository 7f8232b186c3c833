package main_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
)

// forEachDelivery runs test on a fresh demo once over Socket Mode and once
// over signed HTTP delivery.
func forEachDelivery(t *testing.T, test func(t *testing.T, d *main.Demo)) {
	t.Run("socket mode", func(t *testing.T) { test(t, startDemo(t, false)) })
	t.Run("http delivery", func(t *testing.T) { test(t, startDemo(t, true)) })
}

// startDemo runs the demo — the production wiring of `serve` with the local
// workspace, the demo system of record and the scripted model — on the
// test's Redis (real when REDIS_URL is set).
func startDemo(t *testing.T, httpDelivery bool) *main.Demo {
	t.Helper()
	return MustStartDemo(t, &main.Demo{World: demo.World{HTTPDelivery: httpDelivery}})
}

// waitWS blocks until cond holds on the workspace, or fails after 30 s.
func waitWS(t *testing.T, d *main.Demo, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Workspace.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitBotReply waits until the bot has replied in the task thread root
// with a message whose text and blocks contain every one of want (case
// insensitive) and done() holds, and returns that message's text+blocks.
func waitBotReply(t *testing.T, d *main.Demo, what, root string, done func() bool, want ...string) string {
	t.Helper()
	var got string
	waitWS(t, d, what, func() bool {
		for _, m := range d.Workspace.Replies(d.Cast.Tasks.ID, root) {
			all := m.Text + string(m.Blocks)
			if m.BotID != "" && containsAll(strings.ToLower(all), want) {
				got = all
				return done == nil || done()
			}
		}
		return false
	})
	return got
}

func containsAll(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, strings.ToLower(w)) {
			return false
		}
	}
	return true
}

// cardFor returns the top-level approvals message whose blocks name tool.
// cardFor returns the approval card of tool once it is bound to its
// request (before that Slack shows it but clicks are refused as "still
// being posted").
func cardFor(d *main.Demo, tool string) (slacksim.Message, bool) {
	for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
		if m.ThreadTS == "" && strings.Contains(string(m.Blocks), tool) && strings.Contains(string(m.Blocks), "cs_") {
			v := buttonValue.FindStringSubmatch(string(m.Blocks))
			if v == nil {
				continue
			}
			r, err := d.Main.Store.Request(context.Background(), v[1])
			if err != nil || r.Card.TS != m.TS {
				return slacksim.Message{}, false
			}
			return m, true
		}
	}
	return slacksim.Message{}, false
}

// buttonValue finds the request id in a card's button value.
var buttonValue = regexp.MustCompile(`"value":"(req_[a-z0-9]+)\|`)

func openModal(t *testing.T, d *main.Demo, user string) slacksim.View {
	t.Helper()
	var v slacksim.View
	waitWS(t, d, "a modal for "+user, func() bool {
		views := d.Workspace.OpenViews(user)
		if len(views) == 0 {
			return false
		}
		v = views[len(views)-1]
		return true
	})
	return v
}

// TestDemoScenario is the seeds' scenario end to end through the workspace,
// once over Socket Mode and once over signed HTTP delivery: a lookup runs by
// itself, the email and the refund get cards; the email is approved after an
// edit of its subject (a schema error first), the refund is rejected with a
// reason; the thread's answer says truthfully what happened.
func TestDemoScenario(t *testing.T) {
	t.Parallel()
	forEachDelivery(t, func(t *testing.T, d *main.Demo) {
		ws, cast := d.Workspace, d.Cast
		alice, bob, carol := cast.Requester.ID, cast.Approver.ID, cast.SecondApprover.ID

		task := "<@" + slacksim.BotUserID + "> order 1234 arrived damaged — look it up, email an apology, refund the shipping"
		root, err := ws.PostMessage(alice, cast.Tasks.ID, task, "")
		if err != nil {
			t.Fatalf("PostMessage: %v", err)
		}
		waitWS(t, d, "email and refund cards", func() bool {
			_, e := cardFor(d, "send_email")
			_, r := cardFor(d, "issue_refund")
			return e && r
		})
		if got := d.SoR.Hits("GET /orders/1234"); got < 1 {
			t.Errorf("lookup hits = %d, want the lookup to have run", got)
		}
		if n := len(d.SoR.Emails()) + len(d.SoR.Refunds()); n != 0 {
			t.Fatalf("before any decision: %d emails/refunds done, want 0", n)
		}

		email, _ := cardFor(d, "send_email")

		// Edit the email: a too-short subject is refused on its field,
		// then a valid one is accepted.
		if err := ws.Click(bob, cast.Approvals.ID, email.TS, "cs_edit"); err != nil {
			t.Fatalf("Click(edit): %v", err)
		}
		v := openModal(t, d, bob)
		res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "Hi"}})
		if err != nil {
			t.Fatalf("SubmitView(short subject): %v", err)
		}
		if res.ResponseAction != "errors" || res.Errors["f1"] == "" {
			t.Fatalf("SubmitView(short subject) = %+v, want an error on the subject field f1", res)
		}
		const subject = "We're sorry about your table"
		res, err = ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": subject}})
		if err != nil || !res.Closed {
			t.Fatalf("SubmitView(valid subject) = %+v, %v; want closed", res, err)
		}

		// Reject the refund with a reason.
		refund, _ := cardFor(d, "issue_refund")
		if err := ws.Click(carol, cast.Approvals.ID, refund.TS, "cs_reject"); err != nil {
			t.Fatalf("Click(reject): %v", err)
		}
		rv := openModal(t, d, carol)
		const reason = "needs a manager: over the shipping policy"
		if res, err := ws.SubmitView(carol, rv.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView(reason) = %+v, %v; want closed", res, err)
		}

		// The thread's answer says what happened; the rejection's line, not
		// the answer, gives carol's reason, once.
		answer := waitBotReply(t, d, "the run's answer in the task thread", root,
			func() bool { return len(d.SoR.Emails()) == 1 }, "not run", "email")
		emails := d.SoR.Emails()
		if len(emails) != 1 || emails[0].Subject != subject || emails[0].To != "dana@example.com" {
			t.Errorf("emails sent = %+v, want one to dana@example.com with subject %q", emails, subject)
		}
		if emails[0].IdempotencyKey == "" || !strings.HasPrefix(emails[0].IdempotencyKey, "req_") {
			t.Errorf("email Idempotency-Key = %q, want the request id", emails[0].IdempotencyKey)
		}
		if rf := d.SoR.Refunds(); len(rf) != 0 {
			t.Errorf("refunds = %+v, want none (rejected)", rf)
		}
		said := 0
		for _, m := range ws.Replies(cast.Tasks.ID, root) {
			if m.BotID != "" {
				said += strings.Count(m.Text, reason)
			}
		}
		if said != 1 || strings.Contains(answer, reason) {
			t.Errorf("the task thread gives the rejection's reason %d times (in the answer %q), want once, in the rejection's line", said, answer)
		}

		// Cards end final, without buttons, with a status line.
		waitWS(t, d, "final cards", func() bool {
			e, _ := ws.Message(cast.Approvals.ID, email.TS)
			r, _ := ws.Message(cast.Approvals.ID, refund.TS)
			return !strings.Contains(string(e.Blocks), `"cs_approve"`) && !strings.Contains(string(r.Blocks), `"cs_approve"`) &&
				strings.Contains(strings.ToLower(string(r.Blocks)), "rejected") && strings.Contains(string(r.Blocks), reason)
		})

		// Every step is in an intact audit chain.
		audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
		n, err := audit.Verify(context.Background())
		if err != nil {
			t.Fatalf("audit Verify: %v", err)
		}
		entries, err := audit.Range(context.Background(), "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[approval.Event]int{}
		cards := map[string]int{}
		decidedAt := map[string]int64{} // request id → seq of its decided entry
		for _, e := range entries {
			seen[e.Event]++
			switch e.Event {
			case approval.EventDecided:
				decidedAt[e.RequestID] = e.Seq
			case approval.EventExecuting:
				// A gated call's execution follows its decision in the stream.
				if e.Tool != "lookup_order" && decidedAt[e.RequestID] == 0 {
					t.Errorf("audit entry %d: executing %s before its decided entry", e.Seq, e.RequestID)
				}
			}
			if e.Event == approval.EventCardPosted {
				cards[e.RequestID]++
			}
			if strings.Contains(string(e.Data), "xoxb-") || strings.Contains(string(e.Data), "xapp-") {
				t.Errorf("audit entry %d carries a token: %s", e.Seq, e.Data)
			}
		}
		for _, ev := range []approval.Event{approval.EventProposed, approval.EventAutoApproved, approval.EventRequested,
			approval.EventDecided, approval.EventExecuted, approval.EventRunFinished} {
			if seen[ev] == 0 {
				t.Errorf("audit has no %s entry (events: %v)", ev, seen)
			}
		}
		if len(cards) != 2 {
			t.Errorf("card_posted for %d requests, want 2 (email, refund)", len(cards))
		}
		for id, n := range cards {
			if n != 1 {
				t.Errorf("card_posted entries for %s = %d, want exactly 1", id, n)
			}
		}
		t.Logf("audit chain intact: %d entries; events %v", n, seen)

		// The process's /metrics reflects the flow.
		metrics := getText(t, "http://"+d.Main.Addr()+"/metrics")
		for _, want := range []string{
			`countersign_requests_total{outcome="auto",tool="lookup_order"} 1`,
			`countersign_requests_total{outcome="edited",tool="send_email"} 1`,
			`countersign_requests_total{outcome="rejected",tool="issue_refund"} 1`,
			`countersign_tool_executions_total{outcome="ok",tool="send_email"} 1`,
			`countersign_decision_seconds_count{tool="issue_refund",verdict="reject"} 1`,
			`countersign_pending_requests 0`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if !strings.Contains(metrics, `countersign_slack_api_requests_total{method="chat.postMessage"`) {
			t.Errorf("/metrics lacks Slack API request counts")
		}
		if !strings.Contains(metrics, `countersign_model_tokens_total`) {
			t.Errorf("/metrics lacks model token counts")
		}
	})
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// TestDemoRespond: an approver answers in place of the tool. The email is
// never sent; the approver's text is the tool result the model sees and
// the answer reports. Over both deliveries.
func TestDemoRespond(t *testing.T) {
	t.Parallel()
	forEachDelivery(t, func(t *testing.T, d *main.Demo) {
		ws, cast := d.Workspace, d.Cast
		root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 9012 is late, email the customer an apology", "")
		if err != nil {
			t.Fatal(err)
		}
		waitWS(t, d, "the email card", func() bool { _, ok := cardFor(d, "send_email"); return ok })
		card, _ := cardFor(d, "send_email")
		if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, card.TS, "cs_respond"); err != nil {
			t.Fatalf("Click(respond): %v", err)
		}
		v := openModal(t, d, cast.Approver.ID)
		const text = "Ana was already called by phone today; no email needed."
		if res, err := ws.SubmitView(cast.Approver.ID, v.ID, map[string]map[string]any{"response": {"text": text}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView(response) = %+v, %v; want closed", res, err)
		}
		waitBotReply(t, d, "the answer quoting the response", root, nil, "no email needed")
		if got := d.SoR.Emails(); len(got) != 0 {
			t.Errorf("emails = %+v, want none (answered by a person)", got)
		}
		if got := d.SoR.Hits("POST /emails"); got != 0 {
			t.Errorf("POST /emails hits = %d, want 0", got)
		}
	})
}

// TestDemoDeleteNeedsLead: delete_customer may only be approved by the
// leads usergroup. The requester (an approver, but not a lead) is refused
// with an ephemeral explanation and an audit entry, and nothing changes;
// a lead's approval runs it exactly once.
func TestDemoDeleteNeedsLead(t *testing.T) {
	t.Parallel()
	forEachDelivery(t, testDeleteNeedsLead)
}

func testDeleteNeedsLead(t *testing.T, d *main.Demo) {
	ws, cast := d.Workspace, d.Cast
	bob, carol := cast.Approver.ID, cast.SecondApprover.ID

	root, err := ws.PostMessage(bob, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> please delete customer C-300, they asked us to", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the delete card", func() bool { _, ok := cardFor(d, "delete_customer"); return ok })
	card, _ := cardFor(d, "delete_customer")

	if err := ws.Click(bob, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(bob approve): %v", err)
	}
	waitWS(t, d, "bob's refusal", func() bool { return len(ws.Ephemerals(bob)) > 0 })
	if got := d.SoR.Deleted(); len(got) != 0 {
		t.Fatalf("deleted after a refused click: %v", got)
	}
	freshStepUp(t, d, carol) // delete_customer asks a passkey (TestBrowserStepUp)
	if err := ws.Click(carol, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(carol approve): %v", err)
	}
	waitBotReply(t, d, "the run's answer", root, func() bool { return len(d.SoR.Deleted()) == 1 }, "C-300")
	if got := d.SoR.Hits("DELETE /customers/C-300"); got != 1 {
		t.Errorf("DELETE hits = %d, want 1", got)
	}
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var refused int
	for _, e := range entries {
		if e.Event == approval.EventDecisionRefuse && e.Actor == bob {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("decision_refused entries for bob = %d, want 1", refused)
	}
}
