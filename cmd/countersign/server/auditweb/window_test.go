package auditweb_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// TestAuditWebHistoryShowsCancelWindows: the History page lists the
// review-after calls `audit show` tells — run when its window ended
// (window_elapsed → executing → executed), run now by an approver — and
// filters them by status; the charts count them.
func TestAuditWebHistoryShowsCancelWindows(t *testing.T) {
	f := &fakeAudit{}
	at := func(d time.Duration, r approval.Record) { f.Append(base.Add(d), r) }
	for i, id := range []string{"req_ran", "req_now"} {
		d := time.Duration(i) * time.Second
		at(d, approval.Record{Event: approval.EventRequested, RequestID: id, RunID: "run_1", Actor: "agent", Tool: "set_priority",
			Data: approval.RequestedEvent{Args: []byte(`{"order_id":"1234"}`), Digest: "d_" + id, Requester: alice, Created: base.Add(d)}})
		at(d, approval.Record{Event: approval.EventScheduled, RequestID: id, RunID: "run_1", Actor: "gate", Tool: "set_priority",
			Data: approval.ScheduledEvent{RunAt: base.Add(d + 2*time.Minute), WindowMS: 120000}})
	}
	at(30*time.Second, approval.Record{Event: approval.EventRunNow, RequestID: "req_now", RunID: "run_1", Actor: bob, Tool: "set_priority",
		Data: approval.WindowDecisionEvent{Verdict: approval.VerdictRunNow, Digest: "d_req_now", Created: base.Add(time.Second), DecisionMS: 29000}})
	at(2*time.Minute, approval.Record{Event: approval.EventWindowElapsed, RequestID: "req_ran", RunID: "run_1", Actor: "system", Tool: "set_priority",
		Data: approval.WindowElapsedEvent{RunAt: base.Add(2 * time.Minute), Created: base}})
	at(2*time.Minute+time.Second, approval.Record{Event: approval.EventExecuting, RequestID: "req_ran", RunID: "run_1", Actor: "p1", Tool: "set_priority",
		Data: approval.ExecutingEvent{}})
	at(2*time.Minute+2*time.Second, approval.Record{Event: approval.EventExecuted, RequestID: "req_ran", RunID: "run_1", Actor: "p1", Tool: "set_priority",
		Data: approval.ExecutedEvent{Result: "ok"}})
	h := newView(t, f, base.Add(time.Hour), nil)

	for _, tt := range []struct{ query, want string }{
		{"", "req_ran,req_now"},
		{"status=window_elapsed", "req_ran"},
		{"status=run_now", "req_now"},
	} {
		code, body := get(t, h, "/audit/history?"+tt.query)
		if code != http.StatusOK {
			t.Fatalf("GET /audit/history?%s = %d", tt.query, code)
		}
		if got := strings.Join(rowIDs(body), ","); got != tt.want {
			t.Errorf("history?%s rows = %s, want %s", tt.query, got, tt.want)
		}
	}
	_, charts := get(t, h, "/audit/charts?since=1d")
	if !strings.Contains(charts, "window_elapsed: 1 of 2") || !strings.Contains(charts, "run_now: 1 of 2") {
		t.Errorf("charts do not count the cancel windows' outcomes:\n%s", charts)
	}
	// The legend is laid out by the page, an item per outcome that wraps,
	// not placed at fixed steps in the SVG, where window_elapsed ran into
	// the next item.
	for _, legend := range regexp.MustCompile(`(?s)<ul class="legend">(.*?)</ul>`).FindAllStringSubmatch(charts, -1) {
		items := regexp.MustCompile(`(?s)<li>.*?</svg>([^<]*)</li>`).FindAllStringSubmatch(legend[1], -1)
		var labels []string
		for _, it := range items {
			labels = append(labels, it[1])
		}
		if got := strings.Join(labels, ","); got != "approved,edited,rejected,responded,expired,run_now,window_elapsed,cancelled" {
			t.Errorf("legend items = %s, want every outcome, the cancel window's included", got)
		}
	}
	if n := strings.Count(charts, `<ul class="legend">`); n != 2 {
		t.Errorf("charts have %d legends laid out by the page, want one per rate chart (2)", n)
	}
	if strings.Contains(charts, `dx="16"`) {
		t.Errorf("a legend label is still placed in the SVG at a fixed step")
	}
}
