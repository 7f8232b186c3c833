package auditreport_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// modesStream is an audit stream with the review modes' events, written
// with the typed event data the lifecycle owner writes: an approved refund
// later marked wrong, a rejected one marked wrong, a cancel window that
// elapsed, and three sampled notes (one looks right, one right then
// wrong, one not judged).
func modesStream(t *testing.T) []approval.Entry {
	t.Helper()
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var out []approval.Entry
	add := func(ev approval.Event, id, tool, actor string, data any) {
		raw, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, approval.Entry{Seq: int64(len(out) + 1), Time: t0.Add(time.Duration(len(out)) * time.Minute),
			Event: ev, RequestID: id, Tool: tool, Actor: actor, Data: raw})
	}
	args := json.RawMessage(`{"order_id":"1234","amount":64}`)
	add(approval.EventRequested, "req_ok", "issue_refund", "agent", approval.RequestedEvent{Args: args, Digest: "d1", Requester: "U_ALICE",
		Preview: approval.Preview{Summary: "Refund $64 to Dana"}, Created: t0})
	add(approval.EventDecided, "req_ok", "issue_refund", "U_BOB", approval.DecidedEvent{Verdict: approval.VerdictApprove, Digest: "d1", Status: approval.StatusApproved, Created: t0, DecisionMS: 30000})
	add(approval.EventExecuted, "req_ok", "issue_refund", "p1", approval.ExecutedEvent{Result: "refunded"})
	add(approval.EventMarkedWrong, "req_ok", "issue_refund", "U_CAROL", approval.FeedbackEvent{Reason: "order was never damaged",
		Status: approval.StatusExecuted, Verdict: approval.VerdictApprove, DecidedBy: "U_BOB", Created: t0})
	add(approval.EventMarkedWrong, "req_ok", "issue_refund", "U_DAN", approval.FeedbackEvent{Reason: "again", Verdict: approval.VerdictApprove, DecidedBy: "U_BOB"})

	add(approval.EventRequested, "req_no", "issue_refund", "agent", approval.RequestedEvent{Args: args, Digest: "d2", Created: t0})
	add(approval.EventDecided, "req_no", "issue_refund", "U_BOB", approval.DecidedEvent{Verdict: approval.VerdictReject, Text: "no", Status: approval.StatusRejected, Created: t0, DecisionMS: 1000})
	add(approval.EventMarkedWrong, "req_no", "issue_refund", "U_CAROL", approval.FeedbackEvent{Reason: "it was fine", Status: approval.StatusRejected, Verdict: approval.VerdictReject, DecidedBy: "U_BOB"})

	add(approval.EventRequested, "req_win", "set_priority", "agent", approval.RequestedEvent{Args: args, Digest: "d3", Created: t0})
	add(approval.EventScheduled, "req_win", "set_priority", "gate", approval.ScheduledEvent{RunAt: t0.Add(5 * time.Minute), WindowMS: 300000})
	add(approval.EventWindowElapsed, "req_win", "set_priority", "system", approval.WindowElapsedEvent{RunAt: t0.Add(5 * time.Minute), Created: t0})

	for i, id := range []string{"req_s1", "req_s2", "req_s3"} {
		add(approval.EventSampled, id, "add_note", "agent", approval.SampledEvent{CallID: "c", Args: args, Digest: "d", Status: approval.StatusExecuted,
			Result: "noted", Rate: 0.05, Created: t0, Requester: "U_ALICE"})
		switch i {
		case 0:
			add(approval.EventSampleReviewed, id, "add_note", "U_BOB", approval.FeedbackEvent{Status: approval.StatusExecuted, Sampled: true})
		case 1:
			add(approval.EventSampleReviewed, id, "add_note", "U_BOB", approval.FeedbackEvent{Status: approval.StatusExecuted, Sampled: true})
			add(approval.EventMarkedWrong, id, "add_note", "U_CAROL", approval.FeedbackEvent{Reason: "wrong order", Status: approval.StatusExecuted, Sampled: true})
		}
	}
	return out
}

// TestStatsMarkedWrongAndSampled: audit stats counts "approved then
// marked wrong" per tool and per approver (once per request), and the
// sampled outcomes per tool.
func TestStatsMarkedWrongAndSampled(t *testing.T) {
	b := auditreport.NewStatsBuilder()
	for _, e := range modesStream(t) {
		b.Add(e)
	}
	rep := b.Report(time.Time{}, time.Time{})
	row := func(rows []auditreport.StatRow, name string) auditreport.StatRow {
		for _, r := range rows {
			if r.Name == name {
				return r
			}
		}
		t.Fatalf("no row %q in %+v", name, rows)
		return auditreport.StatRow{}
	}
	if r := row(rep.Tools, "issue_refund"); r.MarkedWrong != 2 || r.ApprovedWrong != 1 {
		t.Errorf("issue_refund marked wrong %d, approved then wrong %d; want 2, 1", r.MarkedWrong, r.ApprovedWrong)
	}
	if r := row(rep.Approvers, "U_BOB"); r.MarkedWrong != 2 || r.ApprovedWrong != 1 {
		t.Errorf("U_BOB marked wrong %d, approved then wrong %d; want 2, 1", r.MarkedWrong, r.ApprovedWrong)
	}
	if r := row(rep.Tools, "add_note"); r.Sampled != 3 || r.SampledRight != 1 || r.SampledWrong != 1 || r.ApprovedWrong != 1 {
		t.Errorf("add_note sampled %d, right %d, wrong %d, approved then wrong %d; want 3, 1, 1, 1", r.Sampled, r.SampledRight, r.SampledWrong, r.ApprovedWrong)
	}
	var buf bytes.Buffer
	if err := auditreport.WriteStats(&buf, rep); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "APPROVED→WRONG") || !strings.Contains(out, "3 (33% right, 33% wrong)") {
		t.Errorf("stats table lacks the new columns:\n%s", out)
	}
}

// TestExportMarkedWrong: audit export carries the mark with what the
// approver was shown, --only marked_wrong selects marked requests whatever
// their outcome, and sampled calls and cancel windows have their outcome.
func TestExportMarkedWrong(t *testing.T) {
	x := auditreport.NewExporter()
	for _, e := range modesStream(t) {
		x.Add(e)
	}
	only, err := auditreport.ParseOnly("marked_wrong")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range x.Records(only) {
		got = append(got, r.RequestID+":"+r.Outcome)
		if r.Feedback == nil || !r.Feedback.Wrong {
			t.Errorf("%s feedback = %+v, want marked wrong", r.RequestID, r.Feedback)
		}
	}
	if want := "req_ok:approved,req_no:rejected,req_s2:sampled"; strings.Join(got, ",") != want {
		t.Fatalf("--only marked_wrong = %s, want %s", strings.Join(got, ","), want)
	}
	rec := x.Records(only)[0]
	if rec.Feedback.By != "U_CAROL" || rec.Feedback.Reason != "order was never damaged" || rec.Feedback.DecidedBy != "U_BOB" ||
		rec.Shown == nil || rec.Shown.Preview == nil || rec.Shown.Preview.Summary != "Refund $64 to Dana" {
		t.Errorf("export of req_ok = feedback %+v, shown %+v; want Carol's mark of Bob's approval and the preview shown", rec.Feedback, rec.Shown)
	}
	all := map[string]string{}
	for _, r := range x.Records(nil) {
		all[r.RequestID] = r.Outcome
	}
	if all["req_win"] != "window_elapsed" || all["req_s1"] != "sampled" {
		t.Errorf("outcomes = %v, want req_win window_elapsed and req_s1 sampled", all)
	}
}
