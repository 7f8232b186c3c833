package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// TestMetricsReviewModes: cancel windows, sampled reviews and marks as
// wrong are counted from their audit entries (the typed data the
// lifecycle owner writes), per tool.
func TestMetricsReviewModes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	rdb, prefix := storetest.New(t)
	auditor := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Observer: NewAuditor(m)})
	created := time.Now().Add(-time.Minute)
	for _, r := range []approval.Record{
		{Event: approval.EventWindowElapsed, RequestID: "r1", Tool: "restart", Data: approval.WindowElapsedEvent{RunAt: created.Add(time.Minute), Created: created}},
		{Event: approval.EventRunNow, RequestID: "r2", Tool: "restart", Actor: "U1", Data: approval.WindowDecisionEvent{Verdict: approval.VerdictRunNow, DecisionMS: 30000}},
		{Event: approval.EventCancelled, RequestID: "r3", Tool: "restart", Actor: "U1", Data: approval.WindowDecisionEvent{Verdict: approval.VerdictCancel, Reason: "not now"}},
		{Event: approval.EventSampled, RequestID: "s1", Tool: "add_note", Data: approval.SampledEvent{Status: approval.StatusExecuted, Rate: 0.05}},
		{Event: approval.EventSampled, RequestID: "s2", Tool: "add_note", Data: approval.SampledEvent{Status: approval.StatusExecuted, Rate: 0.05}},
		{Event: approval.EventSampleReviewed, RequestID: "s1", Tool: "add_note", Actor: "U1", Data: approval.FeedbackEvent{Status: approval.StatusExecuted, Sampled: true}},
		{Event: approval.EventMarkedWrong, RequestID: "s2", Tool: "add_note", Actor: "U1", Data: approval.FeedbackEvent{Reason: "x", Status: approval.StatusExecuted, Sampled: true}},
		{Event: approval.EventMarkedWrong, RequestID: "q1", Tool: "refund", Actor: "U2", Data: approval.FeedbackEvent{Reason: "y", Status: approval.StatusExecuted, Verdict: approval.VerdictApprove, DecidedBy: "U1"}},
		{Event: approval.EventMarkedWrong, RequestID: "q2", Tool: "refund", Actor: "U2", Data: approval.FeedbackEvent{Reason: "z", Status: approval.StatusRejected, Verdict: approval.VerdictReject, DecidedBy: "U1"}},
	} {
		if _, err := auditor.Append(t.Context(), r); err != nil {
			t.Fatalf("Append(%s) = %v", r.Event, err)
		}
	}
	got := scrape(t, Handler(reg))
	for series, want := range map[string]float64{
		`countersign_requests_total{outcome="window_elapsed",tool="restart"}`:  1,
		`countersign_requests_total{outcome="run_now",tool="restart"}`:         1,
		`countersign_requests_total{outcome="cancelled",tool="restart"}`:       1,
		`countersign_decision_seconds_count{tool="restart",verdict="run_now"}`: 1,
		`countersign_sampled_reviews_total{outcome="posted",tool="add_note"}`:  2,
		`countersign_sampled_reviews_total{outcome="right",tool="add_note"}`:   1,
		`countersign_sampled_reviews_total{outcome="wrong",tool="add_note"}`:   1,
		`countersign_marked_wrong_total{ran="true",tool="add_note"}`:           1,
		`countersign_marked_wrong_total{ran="true",tool="refund"}`:             1,
		`countersign_marked_wrong_total{ran="false",tool="refund"}`:            1,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
}
