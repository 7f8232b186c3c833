package replay_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// BenchmarkReplay100K replays 100,000 audited calls (300,000 entries
// written by store.Audit into a real stream: REDIS_URL, else miniredis)
// against a candidate, end to end: Redis reads a page at a time, typed
// decoding, both gates. Seven calls in ten asked a person (requested,
// decided — approved, edited or rejected — and executed), three ran
// without one (proposed, assessed, auto_approved). It reports the peak
// heap while replaying (sampled every 10,000 entries), which stays far
// below the stream's size: streamed, not loaded. Figures in
// docs/performance.md.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./approval/replay -run '^$' -bench Replay100K -benchtime 1x -timeout 20m
func BenchmarkReplay100K(b *testing.B) {
	const calls = 100_000
	rdb, prefix := storetest.New(b)
	clock := clocktest.New(clocktest.Opts{Start: time.Now().Add(-20 * 24 * time.Hour), Step: 5 * time.Second})
	audit := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: clock.Now})
	ctx := context.Background()
	verdicts := []approval.Verdict{approve, approve, approve, approve, edit, reject}
	tools := []string{"issue_refund", "send_email", "lookup"}
	for i := range calls {
		id := fmt.Sprintf("req_bench%021d", i)
		tool := tools[i%len(tools)]
		args := fmt.Sprintf(`{"order_id":"ORD-%07d","amount":%d,"note":"customer asked for it on the phone"}`, i, i%900)
		var recs []approval.Record
		if i%10 < 7 {
			recs = []approval.Record{
				{Event: approval.EventRequested, RequestID: id, RunID: "run_bench", Actor: "api:bot", Tool: tool,
					Data: approval.RequestedEvent{CallID: id, Args: []byte(args), Digest: "d", Quorum: 1, Requester: "api:bot",
						Signals: []approval.Signal{{Code: approval.SignalWhenRule, Text: "amount above 50"}}}},
				{Event: approval.EventDecided, RequestID: id, RunID: "run_bench", Actor: "U0ANN", Tool: tool,
					Data: approval.DecidedEvent{Verdict: verdicts[i%len(verdicts)], Digest: "d", Status: approval.StatusApproved, DecisionMS: int64(1000 * (i % 600))}},
				{Event: approval.EventExecuted, RequestID: id, RunID: "run_bench", Actor: "api:bot", Tool: tool,
					Data: approval.ExecutedEvent{CallID: id, Result: "ok", DurationMS: 120}},
			}
		} else {
			recs = []approval.Record{
				{Event: approval.EventProposed, RequestID: id, RunID: "run_bench", Actor: "model", Tool: tool,
					Data: approval.ProposedEvent{CallID: id, Args: []byte(args), Confidence: ptr(0.9)}},
				{Event: approval.EventAssessed, RequestID: id, RunID: "run_bench", Actor: "gate", Tool: tool,
					Data: approval.AssessedEvent{CallID: id, Quorum: 1}},
				{Event: approval.EventAutoApproved, RequestID: id, RunID: "run_bench", Actor: "gate", Tool: tool,
					Data: approval.CallEvent{CallID: id}},
			}
		}
		for _, r := range recs {
			if _, err := audit.Append(ctx, r); err != nil {
				b.Fatalf("Append: %v", err)
			}
		}
	}
	policy := func(when string) replay.Policy {
		return replay.Policy{Policy: approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
			"issue_refund": {When: when, Decisions: []approval.Verdict{approve, edit, reject},
				QuorumWhen: []approval.QuorumRule{{When: "args.amount > 500", Quorum: 2}}},
			"send_email": {When: when, Decisions: []approval.Verdict{approve, edit, reject}},
			"lookup":     {Review: approval.ReviewNever, Risk: approval.RiskLow},
		}}}
	}
	opts := replay.Options{Current: policy("args.amount > 50"), Candidate: policy("args.amount > 100")}
	var peak uint64
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		cur, err := replay.NewJudge(opts.Current)
		if err != nil {
			b.Fatal(err)
		}
		cand, err := replay.NewJudge(opts.Candidate)
		if err != nil {
			b.Fatal(err)
		}
		rp := replay.New(cur, cand, opts)
		var ms runtime.MemStats
		n := 0
		err = replay.Stream(ctx, audit, time.Time{}, func(e approval.Entry) error {
			if n++; n%10_000 == 0 {
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
			return rp.Add(e)
		})
		if err != nil {
			b.Fatal(err)
		}
		rep := rp.Report()
		if rep.Calls != calls {
			b.Fatalf("replayed %d calls, want %d", rep.Calls, calls)
		}
	}
	b.StopTimer()
	// CPU time (user + system) of the process while replaying: on a
	// shared machine the wall time also counts the others' load.
	b.ReportMetric((cpuTime(b)-cpu0).Seconds()/float64(b.N), "cpu-s/replay")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/replay")
}

func ptr[T any](v T) *T { return &v }
