package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// BenchmarkLongPoll1000 holds 1,000 API long polls (GET ?wait=60s, each on
// its own HTTP connection) in one process on the store's wake hub, then
// decides each request through the lifecycle owner, 16 at a time, and
// measures from the start of each decision to its long poll's answer
// (p50, p99, max), the polls held at once, and the memory they took (heap
// and goroutines, server and client side together).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./agent/api -run '^$' -bench LongPoll1000 -benchtime 1x
func BenchmarkLongPoll1000(b *testing.B) {
	const n = 1000
	for range b.N {
		h := newHarness(b, harnessOptions{maxWait: 60 * time.Second, rate: 1_000_000})
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}}
		c := client.New(h.url, fullKey)
		c.HTTP = hc
		ids := make([]string, n)
		for i := range n {
			r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: fmt.Sprintf("bench-%d", i), Arguments: json.RawMessage(fmt.Sprintf(`{"amount":%d}`, i+1))})
			if err != nil {
				b.Fatalf("Request %d: %v", i, err)
			}
			ids[i] = r.ID
		}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		goroutinesBefore := runtime.NumGoroutine()

		ctx, cancel := context.WithTimeout(h.ctx, 2*time.Minute)
		answered := make([]time.Time, n)
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() { // ends when the long poll answers (or ctx ends)
				defer wg.Done()
				r, err := c.Get(ctx, id, 60*time.Second)
				if err == nil && r.Status.Final() {
					answered[i] = time.Now()
				}
			}()
		}
		h.waitPolls(n)
		held := h.server.Waiting()
		runtime.GC()
		var during runtime.MemStats
		runtime.ReadMemStats(&during)
		goroutines := runtime.NumGoroutine() - goroutinesBefore

		started := make([]time.Time, n)
		work := make(chan int)
		var dw sync.WaitGroup
		for range 16 {
			dw.Add(1)
			go func() { // ends when work is closed
				defer dw.Done()
				for i := range work {
					r, err := h.store.Request(h.ctx, ids[i])
					if err != nil {
						b.Errorf("Request: %v", err)
						continue
					}
					started[i] = time.Now()
					if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
						Approver: "U0BOB0001", At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{}); err != nil {
						b.Errorf("Decide: %v", err)
					}
				}
			}()
		}
		b.ResetTimer()
		for i := range n {
			work <- i
		}
		close(work)
		dw.Wait()
		wg.Wait()
		b.StopTimer()
		cancel()

		lat := make([]float64, 0, n)
		for i := range n {
			if answered[i].IsZero() {
				b.Fatalf("long poll %d not answered with the decision", i)
			}
			lat = append(lat, float64(answered[i].Sub(started[i]).Microseconds())/1000)
		}
		slices.Sort(lat)
		b.ReportMetric(lat[n/2], "p50-ms")
		b.ReportMetric(lat[n*99/100], "p99-ms")
		b.ReportMetric(lat[n-1], "max-ms")
		b.ReportMetric(float64(held), "polls-held")
		b.ReportMetric(float64(int64(during.HeapInuse)-int64(before.HeapInuse))/n/1024, "heap-KiB/poll")
		b.ReportMetric(float64(goroutines)/n, "goroutines/poll")
		hc.CloseIdleConnections()
	}
}
