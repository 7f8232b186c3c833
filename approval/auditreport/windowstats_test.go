package auditreport_test

import (
	"bytes"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// TestStatsCountCancelWindows: audit stats counts the review-after calls
// as `audit show` tells them — run when the window ended (per tool), run
// now and cancelled by an approver (per tool and per approver) — and the
// table shows their columns; a cancel by the system is no decision.
func TestStatsCountCancelWindows(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var stream []approval.Entry
	add := func(ev approval.Event, id, actor string, data any) {
		raw, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, approval.Entry{Seq: int64(len(stream) + 1), Time: t0.Add(time.Duration(len(stream)) * time.Minute),
			Event: ev, RequestID: id, Tool: "set_priority", Actor: actor, Data: raw})
	}
	args := json.RawMessage(`{"order_id":"1234","priority":"rush"}`)
	for _, id := range []string{"req_ran", "req_now", "req_cancel", "req_stopped"} {
		add(approval.EventRequested, id, "agent", approval.RequestedEvent{Args: args, Digest: "d", Created: t0})
		add(approval.EventScheduled, id, "gate", approval.ScheduledEvent{RunAt: t0.Add(2 * time.Minute), WindowMS: 120000})
	}
	add(approval.EventWindowElapsed, "req_ran", "system", approval.WindowElapsedEvent{RunAt: t0.Add(2 * time.Minute), Created: t0})
	add(approval.EventExecuting, "req_ran", "p1", approval.ExecutingEvent{})
	add(approval.EventExecuted, "req_ran", "p1", approval.ExecutedEvent{Result: "ok"})
	add(approval.EventRunNow, "req_now", "U_BOB", approval.WindowDecisionEvent{Verdict: approval.VerdictRunNow, Digest: "d", Created: t0, DecisionMS: 20000})
	add(approval.EventCancelled, "req_cancel", "U_BOB", approval.WindowDecisionEvent{Verdict: approval.VerdictCancel, Reason: "not urgent", Digest: "d", Created: t0, DecisionMS: 40000})
	add(approval.EventCancelled, "req_stopped", "system", approval.ReasonEvent{Reason: "run stopped"})

	b := auditreport.NewStatsBuilder()
	for _, e := range stream {
		b.Add(e)
	}
	rep := b.Report(time.Time{}, time.Time{})
	if len(rep.Tools) != 1 || len(rep.Approvers) != 1 {
		t.Fatalf("stats rows: tools %+v, approvers %+v; want one each", rep.Tools, rep.Approvers)
	}
	tool, bob := rep.Tools[0], rep.Approvers[0]
	if tool.Total != 3 || tool.Counts[approval.VerdictWindowElapsed] != 1 || tool.Counts[approval.VerdictRunNow] != 1 || tool.Counts[approval.VerdictCancel] != 1 {
		t.Errorf("set_priority = total %d, counts %v; want 3: one window_elapsed, one run_now, one cancel", tool.Total, tool.Counts)
	}
	if bob.Name != "U_BOB" || bob.Total != 2 || bob.Counts[approval.VerdictRunNow] != 1 || bob.Counts[approval.VerdictCancel] != 1 || bob.Timed != 2 {
		t.Errorf("approver row = %+v; want U_BOB with one run_now and one cancel, both timed", bob)
	}
	var buf bytes.Buffer
	if err := auditreport.WriteStats(&buf, rep); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^TOOL\s+TOTAL\s+APPROVE\s+EDIT\s+REJECT\s+RESPOND\s+EXPIRE\s+RUN_NOW\s+WINDOW_ELAPSED\s+CANCEL\s+MEDIAN`,
		`(?m)^set_priority\s+3\s+(0 \(0%\)\s+){5}1 \(33%\)\s+1 \(33%\)\s+1 \(33%\)\s+30s`,
	} {
		if !regexp.MustCompile(re).MatchString(buf.String()) {
			t.Errorf("stats table does not match %s:\n%s", re, buf.String())
		}
	}
}
