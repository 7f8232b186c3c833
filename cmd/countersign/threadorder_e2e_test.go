package main_test

import (
	"strings"
	"testing"

	"github.com/countersign/countersign/bot/slacksim"
)

// TestThreadOrderDecisionBeforeAnswer: the task thread reads in the order
// things happened. The decision lines of the email (approved with edits)
// and of the refund (rejected) come before the run's answer that follows
// from them, however slow the cards are to redraw: chat.update is held
// back by Slack's rate limit here, so the cards are redrawn only long
// after the run answered.
func TestThreadOrderDecisionBeforeAnswer(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
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
	email, _ := cardFor(d, "send_email")
	refund, _ := cardFor(d, "issue_refund")

	if err := ws.Click(bob, cast.Approvals.ID, email.TS, "cs_edit"); err != nil {
		t.Fatalf("Click(edit): %v", err)
	}
	v := openModal(t, d, bob)
	// The cards' next redraws wait out a rate limit (3 s, far longer
	// than the run takes to answer).
	ws.ForceRateLimit("chat.update", 2, 3)
	if res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "We're sorry about your table"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(edit) = %+v, %v; want closed", res, err)
	}
	if err := ws.Click(carol, cast.Approvals.ID, refund.TS, "cs_reject"); err != nil {
		t.Fatalf("Click(reject): %v", err)
	}
	rv := openModal(t, d, carol)
	if res, err := ws.SubmitView(carol, rv.ID, map[string]map[string]any{"reason": {"text": "needs a manager"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(reject) = %+v, %v; want closed", res, err)
	}

	// The run's answer is the bot's reply with blocks (the decision lines
	// are plain text).
	isAnswer := func(text string, blocks string) bool { return blocks != "" && strings.Contains(blocks, "section") }
	waitWS(t, d, "the run's answer", func() bool {
		for _, m := range ws.Replies(cast.Tasks.ID, root) {
			if m.BotID != "" && isAnswer(m.Text, string(m.Blocks)) {
				return true
			}
		}
		return false
	})
	var order []string
	for _, m := range ws.Replies(cast.Tasks.ID, root) {
		switch {
		case m.BotID == "":
		case isAnswer(m.Text, string(m.Blocks)):
			order = append(order, "answer")
		case strings.Contains(m.Text, "`send_email` approved with edits by <@"+bob+">"):
			order = append(order, "email decision")
		case strings.Contains(m.Text, "`issue_refund` rejected by <@"+carol+">: needs a manager"):
			order = append(order, "refund decision")
		case strings.Contains(m.Text, "is waiting for"):
			order = append(order, "waiting note")
		}
	}
	pos := map[string]int{}
	for i, what := range order {
		if _, seen := pos[what]; seen {
			t.Errorf("thread has %q twice: %v", what, order)
		}
		pos[what] = i
	}
	for _, what := range []string{"email decision", "refund decision"} {
		if i, ok := pos[what]; !ok || i > pos["answer"] {
			t.Errorf("thread order = %v, want the %s before the answer", order, what)
		}
	}
	if _, ok := pos["waiting note"]; ok {
		t.Errorf("thread order = %v, want the waiting notes replaced by the decisions", order)
	}
}
