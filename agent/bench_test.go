package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval"
)

// parkCounter is a slog handler that counts the runs that parked (the
// "its worker is free" line) and signals when want have.
type parkCounter struct {
	n    atomic.Int64
	want int64
	ch   chan struct{}
}

func (h *parkCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *parkCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "run waits for decisions; its worker is free" && h.n.Add(1) == h.want {
		h.ch <- struct{}{}
	}
	return nil
}
func (h *parkCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *parkCounter) WithGroup(string) slog.Handler      { return h }

// BenchmarkParkedRuns parks COUNTERSIGN_BENCH_PARKED (default 10,000) runs
// waiting for approval in one process (MaxRuns 256, the default), then
// measures, per new task, the time from Handle to its card being posted
// while they all wait. Each run is a whole turn through the real parts:
// Redis (set REDIS_URL; the embedded default is far slower), the scripted
// model behind the go-openai client, the gate, the lifecycle (record →
// audit → card) and the store's wake hub.
//
// Metrics: card-p50-ms and card-p99-ms (new tasks, b.N samples),
// parked-per-s (how fast the parked runs were created, each to its card
// and park), goroutines-per-parked and heap-KiB-per-parked (after a GC,
// over the process before the runs; includes the hub registration and the
// lease heartbeat), told-queued (tasks told "Queued — N ahead of you"
// while the burst of parked runs was being created).
//
// Run (docs/performance.md):
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./agent/ -run '^$' -bench ParkedRuns -benchtime 200x -timeout 30m
func BenchmarkParkedRuns(b *testing.B) {
	parked := 10000
	if s := os.Getenv("COUNTERSIGN_BENCH_PARKED"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("COUNTERSIGN_BENCH_PARKED=%q: want a positive number", s)
		}
		parked = n
	}
	w := newWorld(b)
	count := &parkCounter{want: int64(parked), ch: make(chan struct{}, 1)}
	p := w.start(func(o *agent.Options) { o.Logger = slog.New(count) })
	cards := make(chan *approval.Request, parked+b.N+100)
	var queued atomic.Int64
	go func() { // lives until the benchmark binary exits (the notifier's channels are never closed)
		for {
			select {
			case c := <-p.notify.cards:
				cards <- c
			case <-p.notify.says: // "Queued — N ahead of you" while the first runs start
				queued.Add(1)
			}
		}
	}()

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	start := time.Now()
	for i := range parked {
		p.handle(b, task(fmt.Sprintf("delete customer C-%d", i)))
	}
	select {
	case <-count.ch:
	case <-time.After(20 * time.Minute):
		b.Fatalf("only %d of %d runs parked", count.n.Load(), parked)
	}
	elapsed := time.Since(start)
	for range parked {
		<-cards
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	g1 := runtime.NumGoroutine()

	// New tasks while they all wait: Handle → card.
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		p.handle(b, task(fmt.Sprintf("delete customer C-9%07d", i)))
		<-cards
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "card-p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "card-p99-ms")
	b.ReportMetric(float64(parked)/elapsed.Seconds(), "parked-per-s")
	b.ReportMetric(float64(g1-g0)/float64(parked), "goroutines-per-parked")
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024/float64(parked), "heap-KiB-per-parked")
	b.ReportMetric(float64(queued.Load()), "told-queued")
	b.ReportMetric(0, "ns/op")
}
