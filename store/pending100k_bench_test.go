package store_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// Environment of BenchmarkPending100K and its child processes.
const (
	// envBench100K opts in: "1" for 100,000 pending requests, or a number
	// of requests (a smaller smoke run).
	envBench100K = "COUNTERSIGN_BENCH_100K"
	// envChild100K carries a child's settings (child100K) as JSON; set only
	// in the children, which run TestPending100KChild.
	envChild100K = "COUNTERSIGN_BENCH_100K_CHILD"
)

// pending100KProcs is how many processes share the pending requests.
const pending100KProcs = 3

// child100K is what a child process of BenchmarkPending100K is told.
type child100K struct {
	Addrs   []string `json:"addrs"`
	DB      int      `json:"db"`
	Prefix  string   `json:"prefix"`
	Name    string   `json:"name"` // client name, to count its connections
	Pending int      `json:"pending"`
	Samples int      `json:"samples"`
}

// ready100K is what a child reports once its requests are created and
// waited on (the line "READY <json>").
type ready100K struct {
	CreateSeconds float64 `json:"create_s"`
	RSSBytes      int64   `json:"rss_delta"`  // after a GC, against before creating
	HeapBytes     int64   `json:"heap_delta"` // HeapAlloc, the same way
	Goroutines    int     `json:"goroutines"`
	Conns         int     `json:"conns"` // connections under its client name on the server
	Subscribed    int     `json:"subscribed"`
	WaitErrors    int     `json:"wait_errors"` // waits that failed to start and were started again
}

// done100K is what a child reports after its samples ("DONE <json>"):
// decision → Wait returns, and the decision alone (RecordDecision, then
// Wake, as the lifecycle owner makes it), in µs.
type done100K struct {
	Wake   []int64 `json:"wake_us"`
	Decide []int64 `json:"decide_us"`
	Errors int     `json:"errors"`
}

// BenchmarkPending100K (issue 11, goal 7) puts 100,000 pending requests on
// one Redis across 3 processes — this test binary run again as children
// (TestPending100KChild), each with its own Store and wake hub — and each
// process waits on its third of them (one store.Wait per request, as
// parked runs do). Once every wait is subscribed in every process, each
// child decides 1,000 of its own requests one after another, 12 ms apart
// (the three at the same time, over 12 s: more than a round of the hubs'
// safety-net re-reads), and times decision → Wait returns.
//
// Metrics: create-per-s (all processes creating at once: requests over the
// slowest child's time), redis-B-per-pending (the server's used_memory
// after, minus before, over the requests: record, indexes, wake-up
// subscriptions; other clients of a shared server move it too),
// rss-KiB-per-pending and heap-KiB-per-pending (each child's RSS and heap
// after a GC, minus before creating, over its requests: the waits, their
// goroutines, the hub's registrations), conns-per-proc (the most
// connections one child holds on the server, CLIENT LIST by client name),
// wake-p50-µs / wake-p99-µs and decide-p50-µs / decide-p99-µs over the
// 3,000 samples.
//
// Opt-in, it needs real Redis and a few minutes; its keys live under a
// prefix of its own (storetest), deleted afterwards:
//
//	COUNTERSIGN_BENCH_100K=1 REDIS_URL=redis://127.0.0.1:6379/0 go test ./store/ -run '^$' -bench Pending100K -benchtime 1x -timeout 30m
func BenchmarkPending100K(b *testing.B) {
	total := 0
	switch v := os.Getenv(envBench100K); v {
	case "":
		b.Skip(envBench100K + "=1 runs it (100,000 pending requests across 3 processes; a few minutes)")
	case "1":
		total = 100000
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < pending100KProcs {
			b.Fatalf("%s=%q: want 1 or a number of requests", envBench100K, v)
		}
		total = n
	}
	storetest.RequireRealRedis(b)
	for b.Loop() {
		runPending100K(b, total)
	}
}

func runPending100K(b *testing.B, total int) {
	rdb, prefix := storetest.New(b)
	var addrs []string
	db := 0
	switch c := rdb.(type) {
	case *redis.Client:
		addrs, db = []string{c.Options().Addr}, c.Options().DB
	case *redis.ClusterClient:
		addrs = c.Options().Addrs
	}
	used0 := usedMemory(b, rdb)
	per := total / pending100KProcs
	const samples = 1000

	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
		out   strings.Builder // everything else it printed, for failures
	}
	children := make([]*child, pending100KProcs)
	var readers sync.WaitGroup
	for i := range children {
		cfg, err := json.Marshal(child100K{Addrs: addrs, DB: db, Prefix: prefix, Name: fmt.Sprintf("%s-p%d", prefix, i),
			Pending: per, Samples: min(samples, per)})
		if err != nil {
			b.Fatal(err)
		}
		c := &child{lines: make(chan string, 4)}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestPending100KChild$", "-test.count=1", "-test.timeout=30m")
		c.cmd.Env = append(os.Environ(), envChild100K+"="+string(cfg))
		c.cmd.Stderr = os.Stderr
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			b.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		readers.Go(func() { // exits when the child's stdout closes
			defer close(c.lines)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				if line := sc.Text(); strings.HasPrefix(line, "READY ") || strings.HasPrefix(line, "DONE ") {
					c.lines <- line
				} else {
					c.out.WriteString(line + "\n")
				}
			}
		})
		children[i] = c
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		for _, c := range children {
			_ = c.stdin.Close() // the child ends its waits and exits
		}
		for i, c := range children {
			if err := c.cmd.Wait(); err != nil {
				b.Errorf("child %d: %v\n%s", i, err, c.out.String())
			}
		}
		readers.Wait()
	}
	b.Cleanup(stop) // before storetest's clean-up of the keys: cleanups run last first
	next := func(i int, kind string, into any) {
		line, ok := <-children[i].lines
		if !ok || !strings.HasPrefix(line, kind+" ") {
			stop()
			b.Fatalf("child %d: want a %s line, got %q:\n%s", i, kind, line, children[i].out.String())
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, kind+" ")), into); err != nil {
			b.Fatalf("child %d: %s line: %v", i, kind, err)
		}
	}

	readies := make([]ready100K, len(children))
	for i := range children {
		next(i, "READY", &readies[i])
	}
	used1 := usedMemory(b, rdb)
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "GO\n"); err != nil {
			b.Fatal(err)
		}
	}
	var wake, decide []int64
	errs := 0
	for i := range children {
		var d done100K
		next(i, "DONE", &d)
		wake, decide, errs = append(wake, d.Wake...), append(decide, d.Decide...), errs+d.Errors
	}
	stop()

	slowest, conns, subscribed, waitErrs := 0.0, 0, 0, 0
	var rss, heap, goroutines int64
	for _, r := range readies {
		slowest = max(slowest, r.CreateSeconds)
		conns, subscribed = max(conns, r.Conns), max(subscribed, r.Subscribed)
		rss += r.RSSBytes
		heap += r.HeapBytes
		goroutines += int64(r.Goroutines)
		waitErrs += r.WaitErrors
	}
	n := float64(per * len(children))
	b.ReportMetric(n, "pending")
	b.ReportMetric(n/slowest, "create-per-s")
	b.ReportMetric(float64(used1-used0)/n, "redis-B-per-pending")
	b.ReportMetric(float64(rss)/1024/n, "rss-KiB-per-pending")
	b.ReportMetric(float64(heap)/1024/n, "heap-KiB-per-pending")
	b.ReportMetric(float64(goroutines)/n, "goroutines-per-pending")
	b.ReportMetric(float64(conns), "conns-per-proc")
	b.ReportMetric(float64(subscribed), "subscribed-conns-per-proc")
	b.ReportMetric(pct(wake, 50), "wake-p50-µs")
	b.ReportMetric(pct(wake, 99), "wake-p99-µs")
	b.ReportMetric(pct(decide, 50), "decide-p50-µs")
	b.ReportMetric(pct(decide, 99), "decide-p99-µs")
	b.ReportMetric(float64(errs), "errors")
	b.ReportMetric(float64(waitErrs), "wait-start-errors")
	b.ReportMetric(0, "ns/op")
}

// pct is the p-th percentile of µs values (sorted in place).
func pct(us []int64, p int) float64 {
	if len(us) == 0 {
		return 0
	}
	slices.Sort(us)
	return float64(us[min(len(us)-1, len(us)*p/100)])
}

// usedMemory is the server's used_memory (summed over the masters of a
// Cluster).
func usedMemory(tb testing.TB, rdb redis.UniversalClient) int64 {
	tb.Helper()
	read := func(ctx context.Context, c redis.Cmdable) (int64, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("no used_memory in INFO memory")
	}
	ctx := context.Background()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		n, err := read(ctx, rdb)
		if err != nil {
			tb.Fatalf("INFO memory: %v", err)
		}
		return n
	}
	var (
		mu  sync.Mutex // guards sum
		sum int64
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := read(ctx, node)
		mu.Lock()
		sum += n
		mu.Unlock()
		return err
	})
	if err != nil {
		tb.Fatalf("INFO memory: %v", err)
	}
	return sum
}

// TestPending100KChild is one process of BenchmarkPending100K; it skips
// unless that benchmark started it. It creates its requests, waits on each,
// reports READY, and on "GO" (a line on stdin) decides its samples and
// reports DONE; it returns when stdin closes.
func TestPending100KChild(t *testing.T) {
	raw := os.Getenv(envChild100K)
	if raw == "" {
		t.Skip("child process of BenchmarkPending100K")
	}
	var cfg child100K
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%s: %v", envChild100K, err)
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: cfg.Addrs, DB: cfg.DB, ClientName: cfg.Name})
	defer rdb.Close()
	s := store.New(rdb, store.Options{Prefix: cfg.Prefix})
	defer s.Close()
	watch := newHubWatch(cfg.Pending)
	hooks := watch.hooks()
	if os.Getenv("COUNTERSIGN_BENCH_100K_RECHECK") == "off" {
		hooks.RecheckRounds = 1 << 20 // to compare: no safety-net re-read during the run
	}

	rss0, heap0 := memNow(t)
	began := time.Now()
	rs := createMany(t, s, cfg.Pending)
	created := time.Since(began)

	ctx, cancel := context.WithCancel(context.Background())
	woke := make([]chan time.Time, len(rs))
	var (
		wg       sync.WaitGroup
		waitErrs atomic.Int64
	)
	// A few hundred waits start at a time, as runs park one by one:
	// 33,000 first reads at once would queue for the pool past its
	// timeout. A wait that fails before it is registered starts again,
	// as an agent's does.
	starting := make(chan struct{}, 256)
	hooks.Registered = func(id string) {
		watch.hooks().Registered(id)
		<-starting
	}
	store.SetHubHooks(s, hooks)
	for i, r := range rs {
		woke[i] = make(chan time.Time, 1)
		wg.Go(func() { // ends when decided or when ctx is cancelled
			for {
				starting <- struct{}{}
				_, err := s.Wait(ctx, r.ID)
				if err == nil {
					woke[i] <- time.Now()
					return
				}
				if ctx.Err() != nil {
					return
				}
				waitErrs.Add(1) // failed before registering: its slot is still held
				<-starting
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	watch.await(t, 20*time.Minute)
	rss1, heap1 := memNow(t)
	conns, subscribed := clientConns(t, rdb, cfg.Name)
	ready, err := json.Marshal(ready100K{CreateSeconds: created.Seconds(), RSSBytes: rss1 - rss0, HeapBytes: heap1 - heap0,
		Goroutines: runtime.NumGoroutine(), Conns: conns, Subscribed: subscribed, WaitErrors: int(waitErrs.Load())})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY %s\n", ready)

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		t.Fatalf("stdin: want GO, got %q (%v)", in.Text(), in.Err())
	}
	var d done100K
	// Paced, so the samples span more than one safety-net round of the
	// hubs (10 s): a benchmark, so it may use the clock.
	pace := time.NewTicker(12 * time.Millisecond)
	defer pace.Stop()
	for i := range min(cfg.Samples, len(rs)) {
		<-pace.C
		t0 := time.Now()
		dctx, dcancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := decide(dctx, s, decision(rs[i], "approve", "U1"))
		d.Decide = append(d.Decide, time.Since(t0).Microseconds())
		dcancel()
		if err != nil {
			d.Errors++
			t.Logf("decide: %v", err)
			continue
		}
		select {
		case at := <-woke[i]:
			d.Wake = append(d.Wake, at.Sub(t0).Microseconds())
		case <-time.After(15 * time.Second):
			d.Errors++
			t.Logf("no wake-up within 15s")
		}
	}
	done, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("DONE %s\n", done)
	for in.Scan() { // until the benchmark closes stdin
	}
}

// memNow is the process's resident set (VmRSS) and live heap after a
// collection that returns freed memory to the system.
func memNow(tb testing.TB) (rss, heap int64) {
	tb.Helper()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatalf("RSS: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("RSS %q: %v", v, err)
			}
			return kb * 1024, int64(ms.HeapAlloc)
		}
	}
	tb.Fatal("RSS: no VmRSS in /proc/self/status")
	return 0, 0
}
