package bot_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/store"
)

// Slack's worked example from "Verifying requests from Slack".
const (
	docSecret = "8f742231b10e8888abcd99yyyzzz85a5"
	docTS     = "1531420618"
	docBody   = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	docSig    = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
)

func sign(secret string, ts int64, body string) http.Header {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%d:%s", ts, body)
	h := http.Header{}
	h.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	h.Set("X-Slack-Signature", "v0="+hex.EncodeToString(mac.Sum(nil)))
	return h
}

func post(tb testing.TB, hd http.Handler, path string, header http.Header, body string) *httptest.ResponseRecorder {
	tb.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	hd.ServeHTTP(rec, req)
	return rec
}

func TestVerifyRequestSlackExample(t *testing.T) {
	h := http.Header{}
	h.Set("X-Slack-Request-Timestamp", docTS)
	h.Set("X-Slack-Signature", docSig)
	sec, _ := strconv.ParseInt(docTS, 10, 64)
	now := time.Unix(sec, 0).Add(time.Minute)
	if err := bot.VerifyRequest(h, []byte(docBody), docSecret, now); err != nil {
		t.Fatalf("VerifyRequest(Slack's example) = %v, want nil", err)
	}
	for name, tc := range map[string]struct {
		body, secret string
		now          time.Time
	}{
		"tampered body": {docBody + "&x=1", docSecret, now},
		"wrong secret":  {docBody, docSecret + "x", now},
		"6 minutes old": {docBody, docSecret, time.Unix(sec, 0).Add(6 * time.Minute)},
		"from future":   {docBody, docSecret, time.Unix(sec, 0).Add(-6 * time.Minute)},
	} {
		t.Run(name, func(t *testing.T) {
			if err := bot.VerifyRequest(h, []byte(tc.body), tc.secret, tc.now); err == nil {
				t.Fatalf("VerifyRequest = nil, want an error")
			}
		})
	}
}

// The published example passes the HTTP handler when the bot's clock is
// the example's time.
func TestHTTPHandlerAcceptsSlackExample(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	sec, _ := strconv.ParseInt(docTS, 10, 64)
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(h.store, h.audit)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := bot.New(bot.Options{Slack: h.api, Requests: h.store, Lifecycle: life, Runner: h.runner, Policy: h.policy,
		Now: func() time.Time { return time.Unix(sec, 0).Add(30 * time.Second) }, SigningSecret: docSecret})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(h.ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	hdr := http.Header{}
	hdr.Set("X-Slack-Request-Timestamp", docTS)
	hdr.Set("X-Slack-Signature", docSig)
	hdr.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := post(t, b.HTTPHandler(), "/slack/commands", hdr, docBody)
	if rec.Code != http.StatusOK {
		t.Fatalf("POST /slack/commands with Slack's example = %d %s, want 200", rec.Code, rec.Body)
	}
	if !strings.Contains(rec.Body.String(), `"response_type":"ephemeral"`) {
		t.Errorf("answer = %s, want an ephemeral response", rec.Body)
	}
}

func mentionEvent(eventID, text string) string {
	return fmt.Sprintf(`{"type":"event_callback","team_id":"%s","event_id":"%s","event":{"type":"app_mention","user":"%s","text":%q,"channel":"%s","ts":"1772442000.000100"}}`,
		slacksim.TeamID, eventID, alice, text, tasks)
}

func TestHTTPBadSignaturesChangeNothing(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	body := mentionEvent("Ev0BADSIG1", "<@"+slacksim.BotUserID+"> refund order 1234")
	now := h.clock.Now().Unix()
	for name, hdr := range map[string]http.Header{
		"tampered body":    sign(secret, now, strings.Replace(body, "1234", "9999", 1)),
		"wrong secret":     sign("not-the-secret", now, body),
		"6 minutes old":    sign(secret, now-360, body),
		"missing headers":  {},
		"garbage sig":      func() http.Header { x := sign(secret, now, body); x.Set("X-Slack-Signature", "v0=zz"); return x }(),
		"non-numeric time": func() http.Header { x := sign(secret, now, body); x.Set("X-Slack-Request-Timestamp", "soon"); return x }(),
	} {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/slack/events", "/slack/interactive", "/slack/commands"} {
				if rec := post(t, h.bot.HTTPHandler(), path, hdr, body); rec.Code != http.StatusUnauthorized {
					t.Errorf("POST %s = %d, want 401", path, rec.Code)
				}
			}
		})
	}
	_ = h.bot.Close() // drain: anything queued has run
	if got := h.runner.Tasks(); len(got) != 0 {
		t.Fatalf("runs after bad signatures = %d, want 0", len(got))
	}
	// The event id was not consumed: the genuine delivery still starts a run.
	b2 := h.newBot()
	if rec := post(t, b2.HTTPHandler(), "/slack/events", sign(secret, now, body), body); rec.Code != http.StatusOK {
		t.Fatalf("genuine delivery = %d, want 200", rec.Code)
	}
	_ = b2.Close()
	if got := h.runner.Tasks(); len(got) != 1 {
		t.Fatalf("runs after genuine delivery = %d, want 1", len(got))
	}
}

func TestURLVerification(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	body := `{"type":"url_verification","token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`
	rec := post(t, h.bot.HTTPHandler(), "/slack/events", sign(secret, h.clock.Now().Unix(), body), body)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P") {
		t.Fatalf("url_verification = %d %s, want 200 with the challenge", rec.Code, rec.Body)
	}
}

// Slack retries an event (up to three deliveries), possibly to another
// replica: one run starts.
func TestSameEventThreeTimesTwoBotsOneRun(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	b2 := h.newBot() // a second replica sharing the store
	body := mentionEvent("Ev0RETRY01", "<@"+slacksim.BotUserID+"> refund order 1234")
	for i, b := range []*bot.Bot{h.bot, b2, h.bot} {
		hdr := sign(secret, h.clock.Now().Unix(), body)
		if i > 0 {
			hdr.Set("X-Slack-Retry-Num", strconv.Itoa(i))
			hdr.Set("X-Slack-Retry-Reason", "http_timeout")
		}
		if rec := post(t, b.HTTPHandler(), "/slack/events", hdr, body); rec.Code != http.StatusOK {
			t.Fatalf("delivery %d = %d, want 200", i, rec.Code)
		}
	}
	_ = h.bot.Close()
	_ = b2.Close()
	got := h.runner.Tasks()
	if len(got) != 1 {
		t.Fatalf("runs = %d, want 1", len(got))
	}
	if got[0].Text != "refund order 1234" || got[0].Requester != alice || got[0].Origin.Channel != tasks {
		t.Errorf("task = %+v, want alice's refund in the task channel", got[0])
	}
}

func TestTaskChat(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	mentionBot := "<@" + slacksim.BotUserID + "> "

	ts, err := h.ws.PostMessage(alice, tasks, mentionBot+"refund order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	waitCh(t, "first task", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 1 })
	task := h.runner.Tasks()[0]
	want := approval.Origin{Team: slacksim.TeamID, Channel: tasks, ThreadTS: ts}
	if task.Origin != want || task.Text != "refund order 1234" || task.Requester != alice || task.EventID == "" {
		t.Fatalf("task = %+v, want origin %+v and text without the mention", task, want)
	}

	// A follow-up mention in the thread continues the same thread.
	if _, err := h.ws.PostMessage(alice, tasks, mentionBot+"make it $50", ts); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "follow-up", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 2 })
	if got := h.runner.Tasks()[1].Origin.ThreadTS; got != ts {
		t.Errorf("follow-up thread = %q, want %q", got, ts)
	}

	// A DM works without a mention.
	dm := h.ws.DM(alice)
	if _, err := h.ws.PostMessage(alice, dm, "what's the status of order 77?", ""); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "DM task", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 3 })
	if got := h.runner.Tasks()[2]; got.Origin.Channel != dm || got.Text != "what's the status of order 77?" {
		t.Errorf("DM task = %+v", got)
	}

	// Outside the allow-list and in the approvals channel: a short
	// ephemeral, no run.
	if _, err := h.ws.PostMessage(alice, other, mentionBot+"refund 1", ""); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "I only take tasks in")
	if _, err := h.ws.PostMessage(alice, approvals, mentionBot+"approve everything", ""); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "approvals channel")

	// The bot's own messages never start anything.
	if err := h.bot.Say(h.ctx, approval.Origin{Channel: dm}, "<@"+slacksim.BotUserID+"> hello me"); err != nil {
		t.Fatal(err)
	}
	_ = h.bot.Close()
	if got := len(h.runner.Tasks()); got != 3 {
		t.Fatalf("runs = %d, want 3", got)
	}
}

func TestApproveFlow(t *testing.T) {
	for name, delivery := range map[string]slacksim.Delivery{"socket mode": slacksim.SocketMode, "http": slacksim.HTTP} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: delivery})
			r := h.request(nil)

			card := h.card(r)
			for _, a := range []string{"cs_approve", "cs_edit", "cs_respond", "cs_reject"} {
				if !hasAction(card.Blocks, a) {
					t.Errorf("card lacks button %s", a)
				}
			}
			if !strings.Contains(string(card.Blocks), `"value":"`+r.ID+"|"+r.Digest+`"`) {
				t.Errorf("buttons do not carry id|digest")
			}
			// The waiting note says who decides and by when, without the
			// approvals channel's id (the requester may not be in it).
			replies := h.ws.Replies(tasks, r.Origin.ThreadTS)
			if len(replies) == 0 || !strings.Contains(replies[len(replies)-1].Text, "`issue_refund` is waiting for an approver to decide, until <!date^") ||
				strings.Contains(replies[len(replies)-1].Text, approvals) {
				t.Errorf("task thread lacks the waiting note: %+v", replies)
			}

			if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
				t.Fatal(err)
			}
			got := h.waitStatus(r.ID, approval.StatusApproved)
			if got.Decision == nil || got.Decision.Approver != bob || got.Decision.Verdict != approval.VerdictApprove {
				t.Fatalf("decision = %+v, want bob's approval", got.Decision)
			}
			h.waitWS("card updated", func() bool {
				m := h.card(r)
				return !hasAction(m.Blocks, "cs_approve") && strings.Contains(string(m.Blocks), "Approved")
			})
			if !strings.Contains(allText(h.card(r).Blocks), "<@"+bob+">") {
				t.Errorf("card status does not name bob")
			}

			// The agent resumes and reports; the thread says who decided.
			if _, err := h.store.Claim(h.ctx, r.ID, "agent", "", ""); err != nil {
				t.Fatal(err)
			}
			if _, err := h.store.Finish(h.ctx, r.ID, approval.StatusExecuted, `{"refund_id":"rf_1"}`); err != nil {
				t.Fatal(err)
			}
			h.redraw(got)
			h.redraw(got)
			// The run tells the thread before it goes on; told again (a
			// later state, a retry), no second line.
			h.decided(r)
			h.decided(r)
			if err := h.bot.PostRunResult(h.ctx, approval.RunResult{Origin: r.Origin, Status: approval.RunDone, Answer: "Refunded $64 for order 1234.", Approved: 1}); err != nil {
				t.Fatalf("PostRunResult: %v", err)
			}
			var approvedLines, waiting int
			var answer bool
			for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
				if strings.Contains(m.Text, "approved by <@"+bob+">") {
					approvedLines++
				}
				if strings.Contains(m.Text, "is waiting for") {
					waiting++
				}
				answer = answer || strings.Contains(m.Text, "Refunded $64")
			}
			// The decision replaced the waiting note.
			if approvedLines != 1 || waiting != 0 || !answer {
				t.Errorf("thread: %d approval lines (want 1), %d waiting notes left (want 0), answer posted %v", approvedLines, waiting, answer)
			}
			if !strings.Contains(string(h.card(r).Blocks), "rf_1") {
				t.Errorf("card lacks the execution result")
			}
			if n := len(h.audit.Records(approval.EventDecided)); n != 1 {
				t.Errorf("decided audit entries = %d, want 1", n)
			}
			if n := len(h.audit.Records(approval.EventCardPosted)); n != 1 {
				t.Errorf("card_posted audit entries = %d, want 1", n)
			}
			// A late click says who decided and when.
			if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err == nil {
				t.Errorf("click on a card without buttons succeeded")
			}
		})
	}
}

func TestRefusedClicks(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: func(f *policyfile.File) {}})
	r := h.request(func(r *approval.Request) { r.Approvers = approval.Approvers{Users: []string{carol}} })

	cases := []struct {
		name, user, want, reason string
	}{
		{"non-approver", bob, "not one of the approvers", "not_approver"},
		{"self-approval", alice, "someone else has to decide", "self_approval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.ws.Click(tc.user, approvals, r.Card.TS, "cs_approve"); err != nil {
				t.Fatal(err)
			}
			h.ephemeralContaining(tc.user, tc.want)
			waitCh(t, "refusal audit", h.audit.changed, func() bool {
				for _, rec := range h.audit.Records(approval.EventDecisionRefuse) {
					if rec.Actor == tc.user && rec.RequestID == r.ID && strings.Contains(fmt.Sprint(rec.Data), tc.reason) {
						return true
					}
				}
				return false
			})
		})
	}
	// Reject by a non-approver is refused before any modal opens.
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatal(err)
	}
	_ = h.bot.Close()
	if got := h.load(r.ID); got.Status != approval.StatusPending || len(got.Approvals) != 0 {
		t.Fatalf("request after refused clicks = %s with %d approvals, want pending with none", got.Status, len(got.Approvals))
	}
	if v := h.ws.OpenViews(bob); len(v) != 0 {
		t.Errorf("modal opened for a non-approver: %+v", v)
	}
	if !hasAction(h.card(r).Blocks, "cs_approve") {
		t.Errorf("card changed after refused clicks")
	}
}

func TestTwoApproversAtOnceOneDecision(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	// Both click the card as they see it: the second click is made before
	// the first one's redraw can take the buttons away.
	if err := h.ws.ClickTogether([]string{bob, carol}, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatalf("ClickTogether(bob, carol): %v", err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	loser := carol
	if got.Decision.Approver == carol {
		loser = bob
	}
	h.ephemeralContaining(loser, "Already approved by <@"+got.Decision.Approver+">")
	_ = h.bot.Close()
	if n := len(h.audit.Records(approval.EventDecided)); n != 1 {
		t.Fatalf("decisions = %d, want 1", n)
	}
}

func TestQuorum(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) { r.Quorum = 2 })
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.waitWS("quorum progress on the card", func() bool {
		return strings.Contains(allText(h.card(r).Blocks), "1 of 2 approvals: <@"+bob+">")
	})
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "already approved this")
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	if len(got.Approvals) != 2 {
		t.Errorf("approvals = %d, want 2", len(got.Approvals))
	}
	if n := len(h.audit.Records(approval.EventApprovalVote)); n != 1 {
		t.Errorf("approval votes audited = %d, want 1", n)
	}
}

func TestRejectWithReason(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_reject")
	if !strings.Contains(v.PrivateMetadata, r.ID+"|"+r.Digest) {
		t.Errorf("private_metadata = %q, want id|digest", v.PrivateMetadata)
	}
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "   "}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ResponseAction != "errors" || res.Errors["reason"] == "" {
		t.Fatalf("blank reason = %+v, want an error on the reason field", res)
	}
	res, err = h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "needs a manager"}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v; want closed", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusRejected)
	if got.Decision.Text != "needs a manager" || got.Decision.Approver != bob {
		t.Fatalf("decision = %+v", got.Decision)
	}
	h.waitCardFinal(r)
	h.decided(r)
	var found bool
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		found = found || strings.Contains(m.Text, "`issue_refund` rejected by <@"+bob+">: needs a manager")
	}
	if !found {
		t.Errorf("thread lacks the rejection line")
	}
	m := h.card(r)
	if hasAction(m.Blocks, "cs_approve") || !strings.Contains(string(m.Blocks), "needs a manager") {
		t.Errorf("card not final with reason: %s", m.Blocks)
	}
}

func TestEditWithSchemaErrorThenValid(t *testing.T) {
	for name, delivery := range map[string]slacksim.Delivery{"socket mode": slacksim.SocketMode, "http": slacksim.HTTP} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: delivery})
			r := h.request(nil)
			if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
				t.Fatal(err)
			}
			v := h.openView(bob, "cs_edit")
			for _, typ := range []string{"plain_text_input", "number_input", "static_select", "checkboxes", "email_text_input"} {
				if !strings.Contains(string(v.Blocks), `"type":"`+typ+`"`) {
					t.Errorf("edit modal lacks a %s", typ)
				}
			}
			if !strings.Contains(string(v.Blocks), `"initial_value":"64"`) {
				t.Errorf("amount not pre-filled: %s", v.Blocks)
			}
			// amount is the second property: block f1.
			res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "9000"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.ResponseAction != "errors" || !strings.Contains(res.Errors["f1"], "500") {
				t.Fatalf("amount 9000 = %+v, want a schema error on f1 naming the maximum", res)
			}
			if got := h.load(r.ID); got.Status != approval.StatusPending {
				t.Fatalf("status after invalid edit = %s, want pending", got.Status)
			}
			res, err = h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "50"}, "f2": {"v": "1"}})
			if err != nil || !res.Closed {
				t.Fatalf("valid edit = %+v, %v; want closed", res, err)
			}
			got := h.waitStatus(r.ID, approval.StatusApproved)
			if got.Decision.Verdict != approval.VerdictEdit {
				t.Fatalf("verdict = %s, want edit", got.Decision.Verdict)
			}
			var args map[string]any
			_ = json.Unmarshal(got.Args, &args)
			if args["amount"] != float64(50) || args["reason"] != "late" || args["order_id"] != "1234" || args["notify"] != true {
				t.Errorf("edited args = %s", got.Args)
			}
			h.waitWS("diff on card", func() bool {
				b := string(h.card(r).Blocks)
				return strings.Contains(b, "amount: 64 → 50") && strings.Contains(b, "Approved with edits")
			})
		})
	}
}

// TestEditIntoDenyRuleRefusedInModal: an edit that a deny rule refuses
// is answered in the modal with the policy's reason; nothing is decided.
func TestEditIntoDenyRuleRefusedInModal(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "200"}, "f2": {"v": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ResponseAction != "errors" || !strings.Contains(res.Errors["f1"], "The policy refuses this: refunds over $100 need a stated reason") {
		t.Fatalf("denied edit = %+v, want the policy's reason on the amount field (f1), the first the rule reads", res)
	}
	if got := h.load(r.ID); got.Status != approval.StatusPending {
		t.Fatalf("status after denied edit = %s, want pending", got.Status)
	}
	res, err = h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "80"}, "f2": {"v": "2"}})
	if err != nil || !res.Closed {
		t.Fatalf("allowed edit = %+v, %v; want closed", res, err)
	}
	if got := h.waitStatus(r.ID, approval.StatusApproved); got.Decision.Verdict != approval.VerdictEdit {
		t.Fatalf("verdict = %s, want edit", got.Decision.Verdict)
	}
}

func TestRespond(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_respond"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_respond")
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"response": {"text": "Offer store credit instead."}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusResponded)
	if got.Decision.Text != "Offer store credit instead." {
		t.Errorf("response = %q", got.Decision.Text)
	}
}

func TestButtonsFollowAllowedDecisions(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) {
		r.Decisions = []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}
	})
	b := h.card(r).Blocks
	if hasAction(b, "cs_edit") || hasAction(b, "cs_respond") || !hasAction(b, "cs_approve") || !hasAction(b, "cs_reject") {
		t.Fatalf("buttons = %s, want Approve and Reject only", b)
	}
}

func TestStaleModalRefused(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) { r.Quorum = 2 })
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatal(err)
	}
	rejectView := h.openView(carol, "cs_reject")
	// Meanwhile bob edits the arguments (quorum 2: stays pending, new digest).
	if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Approver: bob,
		At: h.clock.Now(), Digest: r.Digest, Args: json.RawMessage(`{"order_id":"1234","amount":10}`)}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.ws.SubmitView(carol, rejectView.ID, map[string]map[string]any{"reason": {"text": "no"}}); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(carol, "arguments changed")
	_ = h.bot.Close()
	if got := h.load(r.ID); got.Status != approval.StatusPending {
		t.Fatalf("status = %s, want pending", got.Status)
	}
}

func TestCardWithinBlockKitLimits(t *testing.T) {
	// An undeclared tool asked for through the API: the only kind of call
	// whose name, arguments and edit no schema of ours bounds.
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: externalPolicy})
	args := map[string]any{}
	body := strings.Repeat("Dear customer <!channel> <@U0EVIL01> <https://evil.example|click> & more. ", 700)[:51200]
	args["body"] = body
	for i := range 39 {
		args[fmt.Sprintf("property_%02d_with_a_rather_long_name", i)] = strings.Repeat("x<>&", 100)
	}
	raw, _ := json.Marshal(args)
	big := strings.Repeat("é<!here>", 4000)
	var facts []approval.Fact
	for i := range 40 {
		facts = append(facts, approval.Fact{Label: fmt.Sprintf("Fact %d %s", i, big[:300]), Value: big})
	}
	var signals []approval.Signal
	for range 40 {
		signals = append(signals, approval.Signal{Code: "when_rule", Text: big})
	}
	r := h.request(func(r *approval.Request) {
		r.Tool = "send_email_" + strings.Repeat("x", 300)
		r.Caller = approval.Caller{Kind: approval.CallerAPI, Name: "mailer"}
		r.Args = raw
		r.Reason = big
		r.Preview = approval.Preview{Summary: big, Facts: facts, Error: big, Source: big}
		r.Signals = signals
		r.Quorum = 3
	})
	checkLimits := func(what string, raw json.RawMessage) {
		t.Helper()
		var blocks []map[string]any
		if err := json.Unmarshal(raw, &blocks); err != nil {
			t.Fatal(err)
		}
		if len(blocks) > 50 {
			t.Errorf("%s: %d blocks, want ≤ 50", what, len(blocks))
		}
		for _, s := range blockTexts(raw) {
			if n := len([]rune(s)); n > 3000 {
				t.Errorf("%s: text of %d chars", what, n)
			}
			for _, bad := range []string{"<!channel>", "<!here>", "<@U0EVIL01>", "<https://evil"} {
				if strings.Contains(s, bad) {
					t.Errorf("%s: %q survived unescaped", what, bad)
				}
			}
		}
	}
	card := h.card(r)
	checkLimits("card", card.Blocks)
	if !strings.Contains(string(card.Blocks), "truncated, 51200 chars") {
		t.Errorf("card lacks the truncation note for the 50 KB body")
	}
	if !strings.Contains(string(card.Blocks), "property_38") {
		t.Errorf("card does not show the 40th property")
	}

	// The final card with a huge diff, decision text and result also fits.
	// Its quorum of 3 needs a third approver in the approvals channel:
	// every vote is authorised by the lifecycle.
	if err := h.ws.JoinChannel(approvals, mallory); err != nil {
		t.Fatal(err)
	}
	cur := h.load(r.ID)
	edited, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Approver: bob, At: h.clock.Now(),
		Text: big, Digest: cur.Digest, Args: json.RawMessage(`{"body":"short"}`)}, approval.DecideOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{carol, mallory} { // the quorum of 3 approves the edit
		if _, err := h.life.Decide(h.ctx, edited, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: u, At: h.clock.Now(),
			Text: big, Digest: edited.Digest}, approval.DecideOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.store.Claim(h.ctx, r.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	final, err := h.store.Finish(h.ctx, r.ID, approval.StatusFailed, big)
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(final)
	checkLimits("final card", h.card(r).Blocks)
}

func TestRateLimitedCardIsDelayedNotLost(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	h.ws.ForceRateLimit("chat.postMessage", 1, 2)
	start := h.clock.Now()
	r := &approval.Request{
		ID: approval.NewID("req"), Requester: alice, Tool: "issue_refund", Risk: approval.RiskHigh,
		Args: json.RawMessage(`{"order_id":"1"}`), Deadline: start.Add(time.Hour),
		Status: approval.StatusPending, Decisions: []approval.Verdict{approval.VerdictApprove},
	}
	if err := h.store.CreateRequest(h.ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := h.post(h.ctx, h.bot, r); err != nil {
		t.Fatalf("Post: %v", err)
	}
	ref := h.load(r.ID).Card
	if slept := h.clock.Slept(); len(slept) == 0 || slept[0] < 2*time.Second {
		t.Fatalf("waits = %v, want a first wait of ≥ 2s", slept)
	}
	m, ok := h.ws.Message(ref.Channel, ref.TS)
	if !ok {
		t.Fatalf("card not posted")
	}
	sec, _ := strconv.ParseFloat(m.TS, 64)
	if posted := time.Unix(0, int64(sec*1e9)); posted.Sub(start) < 2*time.Second {
		t.Errorf("card posted %v after the request, want ≥ 2s", posted.Sub(start))
	}
	var limited, ok2 int
	for _, c := range h.ws.CallLog() {
		if c.Method == "chat.postMessage" && c.Params["channel"] == approvals {
			if c.Error == "ratelimited" {
				limited++
			} else if c.Error == "" {
				ok2++
			}
		}
	}
	if limited != 1 || ok2 != 1 {
		t.Errorf("chat.postMessage to approvals: %d rate limited, %d ok; want 1 and 1", limited, ok2)
	}
	if n := len(h.ws.Messages(approvals)); n != 1 {
		t.Errorf("cards in approvals = %d, want 1", n)
	}
}

func TestPermanentSlackErrorFailsClosed(t *testing.T) {
	const nobot = "G0NOBOT01"
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: func(f *policyfile.File) {
		f.Slack.ApprovalsChannel = nobot
	}})
	h.ws.AddChannel(slacksim.Channel{ID: nobot, Name: "approvals-nobot", IsPrivate: true, Members: []string{bob}})
	thread, err := h.ws.PostMessage(alice, tasks, "refund please", "")
	if err != nil {
		t.Fatal(err)
	}
	r := &approval.Request{ID: approval.NewID("req"), Requester: alice, Tool: "issue_refund", Deadline: h.clock.Now().Add(time.Hour),
		Origin: approval.Origin{Channel: tasks, ThreadTS: thread}, Args: json.RawMessage(`{}`), Status: approval.StatusPending}
	if err := h.store.CreateRequest(h.ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := h.post(h.ctx, h.bot, r); err == nil {
		t.Fatalf("Post to a channel without the bot = nil error, want an error")
	}
	var told bool
	for _, m := range h.ws.Replies(tasks, thread) {
		told = told || strings.Contains(m.Text, "couldn't post the approval request")
	}
	if !told {
		t.Errorf("task thread not told: %+v", h.ws.Replies(tasks, thread))
	}
}

// TestAppHomeAndSlashCommand: App Home and /countersign pending list the
// requests waiting for the person, each linked to its card (its
// permalink: a person cannot open a bare request id, which neither shows),
// and the person's own recent requests, linked the same way.
func TestAppHomeAndSlashCommand(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	card := "<" + h.cardPermalink(r) + "|"
	h.ws.OpenHome(bob)
	h.waitWS("bob's home", func() bool {
		v, ok := h.ws.Home(bob)
		return ok && strings.Contains(allText(v.Blocks), "`issue_refund`") && strings.Contains(allText(v.Blocks), card+"Open the card>")
	})
	h.ws.OpenHome(alice)
	h.waitWS("alice's home", func() bool {
		v, ok := h.ws.Home(alice)
		b := allText(v.Blocks)
		return ok && strings.Contains(b, "Nothing is waiting for you") && strings.Contains(b, "Your recent requests") &&
			strings.Contains(b, "`issue_refund`") && strings.Contains(b, card+"card>")
	})
	for _, u := range []string{bob, alice} {
		if v, _ := h.ws.Home(u); strings.Contains(string(v.Blocks), r.ID) {
			t.Errorf("%s's App Home shows the bare request id %s:\n%s", u, r.ID, allText(v.Blocks))
		}
	}
	if err := h.ws.SlashCommand(carol, approvals, "/countersign", "pending"); err != nil {
		t.Fatal(err)
	}
	if m := h.ephemeralContaining(carol, card+"Open the card>"); strings.Contains(string(m.Blocks), r.ID) {
		t.Errorf("/countersign pending shows the bare request id %s:\n%s", r.ID, allText(m.Blocks))
	}
}

// The bot never blocks a Slack answer on the pool: Close drains work.
func TestCloseDrains(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	for i := range 20 {
		body := mentionEvent(fmt.Sprintf("Ev0DRAIN%02d", i), "<@"+slacksim.BotUserID+"> task")
		if rec := post(t, h.bot.HTTPHandler(), "/slack/events", sign(secret, h.clock.Now().Unix(), body), body); rec.Code != http.StatusOK {
			t.Fatalf("delivery %d = %d", i, rec.Code)
		}
	}
	_ = h.bot.Close()
	if n := len(h.runner.Tasks()); n != 20 {
		t.Fatalf("runs after Close = %d, want 20", n)
	}
	body := mentionEvent("Ev0LATE001", "<@"+slacksim.BotUserID+"> task")
	if rec := post(t, h.bot.HTTPHandler(), "/slack/events", sign(secret, h.clock.Now().Unix(), body), body); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("delivery after Close = %d, want 503 (so Slack retries elsewhere)", rec.Code)
	}
	_ = context.Background()
}

func TestClickAfterDeadline(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	h.clock.Advance(2 * time.Hour)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "expired")
	h.waitWS("card shows expiry", func() bool {
		m := h.card(r)
		return !hasAction(m.Blocks, "cs_approve") && strings.Contains(allText(m.Blocks), "Expired")
	})
	if got := h.load(r.ID); got.Status != approval.StatusExpired {
		t.Fatalf("status = %s, want expired", got.Status)
	}
}

// Socket Mode: Slack redelivering an unacknowledged-looking event to the
// socket starts no second run.
func TestSocketModeRedeliveryOneRun(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	if _, err := h.ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> refund 1234", ""); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "task", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 1 })
	var eventID string
	for _, e := range h.ws.Envelopes() {
		if e.EventID != "" {
			eventID = e.EventID
		}
	}
	if eventID == "" {
		t.Fatal("no event id recorded by the workspace")
	}
	for range 2 {
		if err := h.ws.RedeliverEvent(eventID); err != nil {
			t.Fatal(err)
		}
	}
	waitCh(t, "three deliveries checked", h.requests.changed, func() bool { return h.requests.Seen(eventID) == 3 })
	_ = h.bot.Close()
	if n := len(h.runner.Tasks()); n != 1 {
		t.Fatalf("runs = %d, want 1", n)
	}
}

// TestTaskDroppedWhenDedupeFails: when the de-duplication store cannot be
// reached the task is not started (a retry might start it twice) and the
// person is told so in a short ephemeral message instead of silence.
func TestTaskDroppedWhenDedupeFails(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	h.requests.mu.Lock()
	h.requests.seenErr = errors.New("redis: connection refused")
	h.requests.mu.Unlock()
	if _, err := h.ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> refund order 1234", ""); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "couldn't take this task just now")
	if n := len(h.runner.Tasks()); n != 0 {
		t.Errorf("tasks started = %d, want 0 while de-duplication is down", n)
	}
}

// TestSocketModeSlowEnvelopeHoldsNoOtherAck: while one envelope waits on
// Redis (an edit submission reads the request before answering), the
// envelopes behind it are still handled and acked.
func TestSocketModeSlowEnvelopeHoldsNoOtherAck(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	stall := make(chan chan struct{}, 1)
	h.requests.mu.Lock()
	h.requests.stall = stall
	h.requests.mu.Unlock()
	submitted := make(chan error, 1)
	go func() {
		res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "50"}})
		if err == nil && !res.Closed {
			err = fmt.Errorf("edit submission = %+v, want the modal closed", res)
		}
		submitted <- err
	}()
	release := <-stall // the submission is now stuck reading the request
	if _, err := h.ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> refund order 5678", ""); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "task started while the submission is stalled", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 1 })
	h.waitWS("task event acked while the submission is stalled", func() bool { return ackedEvents(h.ws) == 1 })
	close(release)
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	if got := h.waitStatus(r.ID, approval.StatusApproved); got.Decision.Verdict != approval.VerdictEdit {
		t.Fatalf("verdict = %s, want edit", got.Decision.Verdict)
	}
}

func ackedEvents(ws *slacksim.Workspace) int {
	n := 0
	for _, e := range ws.Envelopes() {
		if e.EventID != "" && e.Acked {
			n++
		}
	}
	return n
}

// TestApproveAndAllow: "Approve + allow" on a card that offers it approves
// and saves a grant for the requester's task thread (before the agent
// wakes), shown on the card with a Revoke button; someone who is not an
// approver cannot revoke it, an approver can, and the grant then stops.
// A request needing two approvals does not offer it.
func TestApproveAndAllow(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(func(r *approval.Request) {
		r.Preauthorize = 2 * time.Hour
		r.Approvers = approval.Approvers{Users: []string{bob, carol}}
	})
	if b := h.card(r).Blocks; !strings.Contains(allText(b), "Approve + allow 2h") {
		t.Fatalf("card = %s, want an Approve + allow 2h button", allText(b))
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve_allow"); err != nil {
		t.Fatal(err)
	}
	h.waitWS("grant shown on the card", func() bool {
		b := h.card(r).Blocks
		return strings.Contains(allText(b), "allowed further `issue_refund` calls by <@"+alice+">") && hasAction(b, "cs_revoke_grant")
	})
	got := h.load(r.ID)
	if got.Status != approval.StatusApproved {
		t.Fatalf("status = %s, want approved", got.Status)
	}
	g, err := h.store.ActiveGrant(h.ctx, "issue_refund", alice, r.Origin)
	if err != nil || g == nil || g.GrantedBy != bob || !g.Expires.Equal(got.Decision.At.Add(2*time.Hour)) {
		t.Fatalf("ActiveGrant = %+v, %v; want bob's grant for 2h", g, err)
	}
	if recs := h.audit.Records(approval.EventGranted); len(recs) != 1 || recs[0].Actor != bob {
		t.Errorf("grant_created records = %+v, want one by bob", recs)
	}
	h.ws.OpenHome(alice)
	h.waitWS("the grant listed on alice's App Home", func() bool {
		v, ok := h.ws.Home(alice)
		return ok && strings.Contains(string(v.Blocks), "Pre-authorisations in force") && strings.Contains(allText(v.Blocks), "Revoke on <"+h.cardPermalink(r)+"|its card>")
	})

	if err := h.ws.Click(alice, approvals, r.Card.TS, "cs_revoke_grant"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "not one of the approvers")
	if g, _ := h.store.ActiveGrant(h.ctx, "issue_refund", alice, r.Origin); g == nil {
		t.Fatal("a non-approver's revoke ended the grant")
	}
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_revoke_grant"); err != nil {
		t.Fatal(err)
	}
	h.waitWS("revocation shown on the card", func() bool {
		b := h.card(r).Blocks
		return strings.Contains(allText(b), "Pre-authorisation revoked by <@"+carol+">") && !hasAction(b, "cs_revoke_grant")
	})
	if g, _ := h.store.ActiveGrant(h.ctx, "issue_refund", alice, r.Origin); g != nil {
		t.Errorf("grant still active after carol revoked it: %+v", g)
	}
	if recs := h.audit.Records(approval.EventGrantRevoked); len(recs) != 1 || recs[0].Actor != carol {
		t.Errorf("grant_revoked records = %+v, want one by carol", recs)
	}
	h.ws.OpenHome(alice)
	h.waitWS("the revoked grant gone from alice's App Home", func() bool {
		v, ok := h.ws.Home(alice)
		return ok && strings.Contains(string(v.Blocks), "Your recent requests") && !strings.Contains(string(v.Blocks), "Pre-authorisations in force")
	})

	self := h.request(func(r *approval.Request) {
		r.Preauthorize = time.Hour
		r.Approvers = approval.Approvers{Users: []string{alice, bob}, AllowSelf: true}
	})
	if err := h.ws.Click(alice, approvals, self.Card.TS, "cs_approve_allow"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "cannot pre-authorise more of your own calls")
	if got := h.load(self.ID); got.Status != approval.StatusPending || got.Grant != nil {
		t.Errorf("self Approve + allow = %s with grant %+v, want nothing changed", got.Status, got.Grant)
	}

	two := h.request(func(r *approval.Request) { r.Preauthorize, r.Quorum = time.Hour, 2 })
	if b := h.card(two).Blocks; hasAction(b, "cs_approve_allow") {
		t.Errorf("a quorum-2 card offers Approve + allow: %s", allText(b))
	}
}

// TestShutdownStopsSocketModeThenDrains: Shutdown closes the Socket Mode
// connection StartSocketMode opened, finishes the work queued before it
// (the task's run), and the bot takes no work afterwards.
func TestShutdownStopsSocketModeThenDrains(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	h.bot.StartSocketMode(h.ctx, socketmode.New(h.api))
	h.waitWS("socket connection", func() bool { return h.ws.Connections() > 0 })
	if _, err := h.ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> refund 1234", ""); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "task", h.runner.changed, func() bool { return len(h.runner.Tasks()) == 1 })
	ctx, cancel := context.WithTimeout(h.ctx, hangAfter)
	defer cancel()
	if err := h.bot.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v, want nil", err)
	}
	h.waitWS("socket closed", func() bool { return h.ws.Connections() == 0 })
	body := mentionEvent("Ev0AFTERSHUT", "<@"+slacksim.BotUserID+"> task")
	if rec := post(t, h.bot.HTTPHandler(), "/slack/events", sign(secret, h.clock.Now().Unix(), body), body); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("delivery after Shutdown = %d, want 503", rec.Code)
	}
}
