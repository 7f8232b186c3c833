package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// BenchmarkAuditViewPages serves the audit view's pages over a real
// 100,000-entry audit stream written by store.Audit (REDIS_URL, else
// miniredis): 20,000 requests of five entries each over a week, one tool
// in a thousand requests being rare. Each sub-benchmark is one page
// request end to end (Redis reads, readers, template); figures are in
// docs/performance.md.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign -run '^$' -bench AuditViewPages -benchtime 20x
func BenchmarkAuditViewPages(b *testing.B) {
	const requests = 20000 // × 5 entries
	rdb, prefix := storetest.New(b)
	start := time.Now().Add(-7 * 24 * time.Hour)
	clock := clocktest.New(clocktest.Opts{Start: start, Step: 6 * time.Second})
	audit := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: clock.Now})
	st := store.New(rdb, store.Options{Prefix: prefix})
	b.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	tools := []string{"issue_refund", "send_email", "lookup_order", "delete_customer"}
	approvers := []string{"U0ALICE01", "U0BOB0001", "U0CAROL01", "U0DAVE001", "U0ERIN001"}
	verdicts := []string{"approve", "approve", "approve", "edit", "reject"}
	// Stream ids come from the Redis clock (all of this second), entry
	// times from benchClock (a week): the story link's hint is therefore
	// taken as the id of the entry written an hour (600 entries) before the
	// middle request, where a real week-long stream would put it.
	var middle, middleHint string
	var ids []string
	for i := range requests {
		id := fmt.Sprintf("req_bench%021d", i)
		if i == requests/2 {
			middle = id
		}
		tool := tools[i%len(tools)]
		if i%1000 == 999 {
			tool = "wire_transfer"
		}
		for _, r := range []approval.Record{
			{Event: approval.EventProposed, RequestID: id, RunID: "run_bench", Actor: "model", Tool: tool,
				Data: map[string]any{"args": map[string]any{"order": i, "amount": 4200}, "confidence": 0.9}},
			{Event: approval.EventRequested, RequestID: id, RunID: "run_bench", Actor: "agent", Tool: tool,
				Data: map[string]any{"args": map[string]any{"order": i, "amount": 4200}, "digest": "d", "requester": "U0REQ0001",
					"signals": []approval.Signal{{Code: "review_always", Text: "tool is always reviewed"}}, "quorum": 1}},
			{Event: approval.EventDecided, RequestID: id, RunID: "run_bench", Actor: approvers[i%len(approvers)], Tool: tool,
				Data: map[string]any{"verdict": verdicts[i%len(verdicts)], "digest": "d", "decision_ms": 1000 * (i % 600)}},
			{Event: approval.EventExecuting, RequestID: id, RunID: "run_bench", Tool: tool},
			{Event: approval.EventExecuted, RequestID: id, RunID: "run_bench", Tool: tool, Data: map[string]any{"result": "ok", "duration_ms": 120}},
		} {
			e, err := audit.Append(ctx, r)
			if err != nil {
				b.Fatalf("Append: %v", err)
			}
			ids = append(ids, e.ID)
			if e.RequestID == middle && e.Event == approval.EventRequested {
				middleHint = ids[len(ids)-600]
			}
		}
	}
	now := clock.Now()
	view, err := auditweb.New(auditweb.Options{Entries: audit, Pending: st, Token: "t", Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	pages := []struct {
		name, path, want string
	}{
		{"history newest 50", "/audit/history", "Older"},
		{"history tool filter", "/audit/history?tool=send_email&status=approved", "Older"},
		{"history rare tool (scan limit)", "/audit/history?tool=wire_transfer", "wire_transfer"},
		{"history last hour", "/audit/history?since=1h", "entries read"},
		{"story mid-stream, whole stream", "/audit/requests/" + middle, "timings"},
		{"story mid-stream, history link", "/audit/requests/" + middle + "?after=" + middleHint, "timings"},
		{"charts 7d", "/audit/charts?since=7d", "Outcomes per tool"},
		{"chain verify", "/audit/chain", "Intact."},
		{"pending", "/audit/", "Pending requests"},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, p.path, nil)
				req.Header.Set("Authorization", "Bearer t")
				rec := httptest.NewRecorder()
				view.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), p.want) {
					b.Fatalf("GET %s = %d, body lacks %q", p.path, rec.Code, p.want)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/page")
		})
	}
}
