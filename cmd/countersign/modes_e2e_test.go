package main_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/store"
)

// boundCard returns the n-th (0-based) top-level card of tool once it is
// bound to its request, and that request's id.
func boundCard(t *testing.T, d *main.Demo, tool string, n int) (slacksim.Message, string) {
	t.Helper()
	var card slacksim.Message
	var id string
	waitWS(t, d, "card "+tool+" bound", func() bool {
		cards := cardsFor(d, tool)
		if len(cards) <= n {
			return false
		}
		card = cards[n]
		v := buttonValue.FindStringSubmatch(string(card.Blocks))
		if v == nil {
			return false
		}
		r, err := d.Main.Store.Request(context.Background(), v[1])
		if err != nil || r.Card.TS != card.TS {
			return false
		}
		id = v[1]
		return true
	})
	return card, id
}

// TestDemoReviewAfter: review after through the production wiring (Socket
// Mode, the process's own expiry sweep, the injected clock). Rushing order
// 1234 posts a card that says when it runs; Cancel with a reason stops it,
// and the thread's answer carries the reason; a second rush, left alone,
// runs once when the clock passes the window's end, and a cancel submitted
// after that is told the call went ahead. Both cards are then marked wrong,
// and `audit stats` and `audit export --only marked_wrong` show it.
func TestDemoReviewAfter(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: time.Now().UTC()})
	d := startDemoForCLI(t, clock)
	ws, cast := d.Workspace, d.Cast
	alice, bob := cast.Requester.ID, cast.Approver.ID
	mention := "<@" + slacksim.BotUserID + "> "

	root, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"rush order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	card, first := boundCard(t, d, "set_order_priority", 0)
	blocks := string(card.Blocks)
	if !strings.Contains(blocks, "unless cancelled") || !strings.Contains(blocks, "cs_cancel_run") || !strings.Contains(blocks, "cs_run_now") {
		t.Fatalf("cancel window card = %s", blocks)
	}
	if err := ws.Click(bob, cast.Approvals.ID, card.TS, "cs_cancel_run"); err != nil {
		t.Fatal(err)
	}
	v := openModal(t, d, bob)
	if res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "customer wants the usual date"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(cancel) = %+v, %v", res, err)
	}
	waitBotReply(t, d, "the answer after the cancel", root, nil, "customer wants the usual date")

	// A second rush in another thread, left alone until its window ends.
	root2, err := ws.PostMessage(alice, cast.Tasks.ID, mention+"please rush order 1234 after all", "")
	if err != nil {
		t.Fatal(err)
	}
	card2, second := boundCard(t, d, "set_order_priority", 1)
	// An approver opens Cancel, but submits only after the window ended.
	if err := ws.Click(bob, cast.Approvals.ID, card2.TS, "cs_cancel_run"); err != nil {
		t.Fatal(err)
	}
	late := openModal(t, d, bob)
	clock.Advance(2*time.Minute + time.Second)
	waitAudit(t, d, second, approval.EventWindowElapsed)
	waitWS(t, d, "the rush to run", func() bool { return len(d.SoR.Priorities()) == 1 })
	// The system of record sees the call before the agent audits it, and
	// the thread already names the tool in its waiting note: wait for the
	// executed entry itself before counting entries below.
	waitAudit(t, d, second, approval.EventExecuted)
	waitBotReply(t, d, "the answer after the window", root2, nil, "set_order_priority")
	if res, err := ws.SubmitView(bob, late.ID, map[string]map[string]any{"reason": {"text": "too slow"}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(late cancel) = %+v, %v", res, err)
	}
	waitWS(t, d, "the late canceller told", func() bool {
		for _, m := range ws.Ephemerals(bob) {
			if strings.Contains(m.Text, "Too late: the cancel window ended") {
				return true
			}
		}
		return false
	})

	if p := d.SoR.Priorities(); len(p) != 1 || p[0].Priority != "rush" || p[0].IdempotencyKey != second {
		t.Errorf("priority changes = %+v, want one rush keyed by %s", p, second)
	}
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range entries {
		if e.RequestID == first || e.RequestID == second {
			count[e.RequestID+" "+string(e.Event)]++
		}
	}
	for key, want := range map[string]int{
		first + " scheduled": 1, first + " cancelled": 1, first + " window_elapsed": 0, first + " executed": 0,
		second + " scheduled": 1, second + " window_elapsed": 1, second + " executed": 1, second + " cancelled": 0,
	} {
		if count[key] != want {
			t.Errorf("audit %s entries = %d, want %d", key, count[key], want)
		}
	}
	if _, err := audit.Verify(context.Background()); err != nil {
		t.Errorf("audit Verify: %v", err)
	}

	// Carol marks both wrong — bob's cancel, and the call that ran — and
	// the audit CLI counts and exports them.
	carol := cast.SecondApprover.ID
	for i, c := range []slacksim.Message{card, card2} {
		waitWS(t, d, "Mark as wrong on card "+c.TS, func() bool {
			m, _ := ws.Message(cast.Approvals.ID, c.TS)
			return strings.Contains(string(m.Blocks), "cs_mark_wrong")
		})
		if err := ws.Click(carol, cast.Approvals.ID, c.TS, "cs_mark_wrong"); err != nil {
			t.Fatal(err)
		}
		mv := openModal(t, d, carol)
		if res, err := ws.SubmitView(carol, mv.ID, map[string]map[string]any{"reason": {"text": "the order was not urgent"}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView(mark wrong %d) = %+v, %v", i, res, err)
		}
		waitAuditN(t, d, i+1, func(e approval.Entry) bool { return e.Event == approval.EventMarkedWrong })
	}
	code, out, errOut := runCLI(t.Context(), "audit", "stats", "--json")
	var rep auditreport.StatsReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("audit stats --json = %d: %s%s", code, out, errOut)
	}
	for _, r := range rep.Tools {
		if r.Name == "set_order_priority" && (r.MarkedWrong != 2 || r.ApprovedWrong != 1) {
			t.Errorf("stats set_order_priority: marked wrong %d, approved then wrong %d; want 2, 1", r.MarkedWrong, r.ApprovedWrong)
		}
	}
	for _, r := range rep.Approvers {
		if r.Name == bob && (r.MarkedWrong != 1 || r.ApprovedWrong != 0) {
			t.Errorf("stats %s: marked wrong %d, approved then wrong %d; want 1, 0 (bob cancelled it)", bob, r.MarkedWrong, r.ApprovedWrong)
		}
	}
	code, out, errOut = runCLI(t.Context(), "audit", "export", "--only", "marked_wrong")
	if code != 0 {
		t.Fatalf("audit export --only marked_wrong = %d: %s", code, errOut)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec auditreport.ExportRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("export line %q: %v", line, err)
		}
		ids = append(ids, rec.RequestID+"="+rec.Outcome)
		if rec.Feedback == nil || !rec.Feedback.Wrong || rec.Feedback.By != carol || rec.Shown == nil || len(rec.Proposed.Args) == 0 {
			t.Errorf("export of %s = feedback %+v, shown %+v; want carol's mark and what was shown", rec.RequestID, rec.Feedback, rec.Shown)
		}
	}
	if want := first + "=cancelled " + second + "=window_elapsed"; strings.Join(ids, " ") != want {
		t.Errorf("audit export --only marked_wrong = %v, want %s", ids, want)
	}
	code, out, errOut = runCLI(t.Context(), "audit", "show", second)
	t.Logf("audit show (the window that ended):\n%s", out)
	if code != 0 || !strings.Contains(out, "the cancel window ended") || !strings.Contains(out, "marked wrong by "+carol) {
		t.Errorf("audit show %s = exit %d:\n%s%s", second, code, out, errOut)
	}
}
