package store_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkWakeLatency measures decision-to-wake latency — from the start
// of the decision to the return of the waiter's Wait — with 1, 1,000 and 10,000
// requests waiting in one process, for the wake hub (Pub/Sub hints,
// Options.WaitConns subscriber connections) and, in the same run, for the
// designs it was chosen over:
//
//   - blpop-32: multiplexed BLPOP, the previous hub made round-free — 32
//     connections, each blocking in one multi-key BLPOP over its share of
//     the wake lists plus a control list of its own that registering pushes
//     to, so a new waiter's key joins at once (blpopMux below). It cannot
//     run on a Cluster (the keys are in different slots).
//   - naive: one blocking BLPOP per waiter (naiveWait below).
//
// A decision is what the lifecycle owner does, less its audit entry:
// Store.RecordDecision, then Store.Wake (decide, door_test.go): two round
// trips. Figures before issue 27 timed Store.Decide, one script that
// recorded the decision and pushed the wake-up together, which production
// never used.
//
// Metrics: p50-µs and p99-µs over the samples, decide-p50-µs and
// decide-p99-µs (the decision alone — record, then wake — which the
// wake-up overlaps: the floor), conns (connections the
// client holds on the server — CLIENT LIST by client name on real Redis,
// the pool count on miniredis), cmd-ms (a create+decide+read of an
// unrelated request while everyone waits) and errors (ordinary commands or
// wake-ups that failed or timed out).
//
// The naive design needs one connection per waiter; with 10,000 waiters
// that only works with a 10,000-connection pool (and a server whose
// maxclients allows it), so it runs twice: with such a pool, and with the
// default pool, where it starves. Both 10,000 cases run only with
// BENCH_NAIVE_10K=1: the first can fill a shared server's maxclients
// (default 10,000) and break everyone else's connections, so point
// REDIS_URL at a private server for it; the second takes over a minute.
//
// Run (docs/performance.md):
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test -run '^$' -bench WakeLatency -benchtime 1x -timeout 30m ./store/
//
// REDIS_URL may name a Cluster (redis://h1:p1,h2:p2,h3:p3, storetest); the
// designs that cannot run there are skipped.
func BenchmarkWakeLatency(b *testing.B) {
	cases := []struct {
		design  string
		waiters int
		pool    int // 0: go-redis default; otherwise PoolSize
		samples int
	}{
		{"hub", 1, 0, 1000},
		{"hub", 1000, 0, 1000},
		{"hub", 10000, 0, 1000},
		{"blpop-32", 1, 60, 1000}, // 32 blocked + room for ordinary commands
		{"blpop-32", 1000, 60, 1000},
		{"blpop-32", 10000, 60, 1000},
		{"naive", 1, 0, 200},
		{"naive", 1000, 1100, 200},
		{"naive", 10000, 10100, 200},
		{"naive-default-pool", 10000, 0, 3},
	}
	for _, c := range cases {
		b.Run(fmt.Sprintf("%s/waiters=%d", c.design, c.waiters), func(b *testing.B) {
			if c.waiters >= 10000 && strings.HasPrefix(c.design, "naive") && os.Getenv("BENCH_NAIVE_10K") != "1" {
				b.Skip("the naive design with 10,000 waiters needs BENCH_NAIVE_10K=1 and a private Redis (see the doc comment)")
			}
			if c.design != "hub" && storetest.Cluster() {
				b.Skip("multi-key BLPOP crosses hash slots on a Cluster; only the hub runs there")
			}
			for b.Loop() {
				m := runWakeBench(b, c.design, c.waiters, c.pool, c.samples)
				b.ReportMetric(m.p50, "p50-µs")
				b.ReportMetric(m.p99, "p99-µs")
				b.ReportMetric(m.decideP50, "decide-p50-µs")
				b.ReportMetric(m.decideP99, "decide-p99-µs")
				b.ReportMetric(float64(m.conns), "conns")
				b.ReportMetric(m.cmdMS, "cmd-ms")
				b.ReportMetric(float64(m.errors), "errors")
			}
		})
	}
}

type wakeMetrics struct {
	p50, p99  float64         // µs
	decideP50 float64         // µs: the decision alone, record then wake (the floor: the wake starts inside it)
	decideP99 float64         // µs
	decide    []time.Duration // decision durations (record, then wake)
	conns     int
	cmdMS     float64
	errors    int
}

// runWakeBench takes samples in batches of waiters: each batch creates
// waiters requests, starts one Wait per request, waits until they all
// block, then decides requests one by one and times each wake-up.
func runWakeBench(b *testing.B, design string, waiters, pool, samples int) wakeMetrics {
	name := "cs-bench-" + approval.NewID("b")[2:12]
	rdb, prefix := storetest.NewWith(b, func(o *redis.UniversalOptions) {
		o.ClientName = name
		if pool > 0 {
			o.PoolSize = pool
			o.PoolTimeout = time.Minute
		}
	})
	// admin counts connections on its own small pool: rdb's may be starved.
	// (On miniredis it is another server; serverConns does not use it there.)
	admin, _ := storetest.NewWith(b, func(o *redis.UniversalOptions) { o.PoolSize = 2 })
	var (
		lat   []time.Duration
		m     wakeMetrics
		first = true
	)
	for len(lat) < samples {
		n := min(samples-len(lat), waiters)
		got := wakeBatch(b, design, rdb, admin, prefix, name, waiters, n, first, &m)
		lat = append(lat, got...)
		first = false
		if len(got) < n { // the naive design starved: stop sampling
			break
		}
	}
	if os.Getenv("BENCH_DEBUG") != "" {
		b.Logf("latencies in order: %v", lat)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		m.p50 = float64(lat[len(lat)/2].Microseconds())
		slices.Sort(m.decide)
		m.decideP50 = float64(m.decide[len(m.decide)/2].Microseconds())
		m.decideP99 = float64(m.decide[min(len(m.decide)-1, len(m.decide)*99/100)].Microseconds())
		m.p99 = float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())
	}
	return m
}

// wakeBatch runs one batch and returns the latencies it measured.
func wakeBatch(b *testing.B, design string, rdb, admin redis.UniversalClient, prefix, name string, waiters, decisions int, measureCmd bool, m *wakeMetrics) []time.Duration {
	const waitConns = 2
	s := store.New(rdb, store.Options{Prefix: prefix, WaitConns: waitConns})
	defer s.Close()
	watch := newHubWatch(waiters)
	store.SetHubHooks(s, watch.hooks())
	rs := createMany(b, s, waiters)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mux *blpopMux
	if design == "blpop-32" {
		mux = newBLPOPMux(ctx, s, rdb, prefix, 32)
		defer mux.stop(cancel)
	}
	woke := make([]chan time.Time, waiters)
	entered := make(chan struct{}, waiters)
	var wg sync.WaitGroup
	for i, r := range rs {
		woke[i] = make(chan time.Time, 1)
		wg.Go(func() {
			var err error
			switch design {
			case "hub":
				_, err = s.Wait(ctx, r.ID)
			case "blpop-32":
				err = mux.wait(ctx, r.ID)
			default:
				_, err = naiveWait(ctx, s, rdb, prefix, r.ID, time.Second, entered)
			}
			if err == nil {
				woke[i] <- time.Now()
			}
		})
	}
	defer wg.Wait()
	defer cancel()

	// Let every waiter block before deciding.
	switch design {
	case "hub":
		watch.await(b, 5*time.Minute)
	case "blpop-32":
		mux.await(b, waiters, 5*time.Minute)
		awaitBLPOPs(b, admin, 32, name, 32)
	default:
		timeout := time.After(2 * time.Minute)
	loop:
		for range waiters {
			select {
			case <-entered:
			case <-timeout:
				break loop // starved: measure what happens anyway
			}
		}
		awaitBLPOPs(b, admin, rdb.(*redis.Client).Options().PoolSize, name, waiters)
	}
	if measureCmd {
		m.conns = serverConns(b, rdb, admin, name)
		began := time.Now()
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		r := request(b, nil)
		err := s.CreateRequest(cctx, r)
		if err == nil {
			_, err = decide(cctx, s, decision(r, approval.VerdictApprove, "U1"))
		}
		if err == nil {
			_, err = s.Request(cctx, r.ID)
		}
		ccancel()
		m.cmdMS = float64(time.Since(began).Microseconds()) / 1000
		if err != nil {
			m.errors++
			b.Logf("%s, %d waiters: ordinary commands failed after %.0f ms: %v", design, waiters, m.cmdMS, err)
		}
	}

	// Start from a collected heap: the garbage of creating the requests and
	// starting the waits is set-up, not the steady state being measured.
	runtime.GC()
	var lat []time.Duration
	for i := range decisions {
		began := time.Now()
		dctx, dcancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := decide(dctx, s, decision(rs[i], approval.VerdictApprove, "U1"))
		m.decide = append(m.decide, time.Since(began))
		dcancel()
		if err != nil {
			m.errors++
			b.Logf("%s, %d waiters: Decide failed after %v: %v", design, waiters, time.Since(began), err)
			continue
		}
		select {
		case at := <-woke[i]:
			lat = append(lat, at.Sub(began))
		case <-time.After(15 * time.Second):
			m.errors++
			b.Logf("%s, %d waiters: no wake-up within 15s", design, waiters)
		}
	}
	return lat
}

// naiveWait is the design the hub replaces: read the record, then BLPOP the
// request's own wake list in a loop, one connection per waiter. entered is
// signalled once, when the waiter first reaches its BLPOP.
func naiveWait(ctx context.Context, s *store.Store, rdb redis.UniversalClient, prefix, id string, block time.Duration, entered chan<- struct{}) (*approval.Request, error) {
	key := prefix + ":req:{" + id + "}:wake"
	signalled := false
	for {
		r, err := s.Request(ctx, id)
		if err == nil && r.Status.Decided() {
			return r, nil
		}
		for {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !signalled {
				signalled = true
				entered <- struct{}{}
			}
			_, err := rdb.BLPop(ctx, block, key).Result()
			if err == nil {
				break // woken: re-read the record
			}
			if !errors.Is(err, redis.Nil) { // pool timeout, too many clients: back off
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(block):
				}
			}
		}
	}
}

// serverConns is the number of connections named name, counted over admin
// (real Redis), or rdb's pools' count (miniredis).
func serverConns(tb testing.TB, rdb, admin redis.UniversalClient, name string) int {
	tb.Helper()
	if !storetest.Real() {
		return openConns(rdb)
	}
	total, _ := clientConns(tb, admin, name)
	return total
}

// awaitBLPOPs waits until the naive waiters' BLPOPs are on the server: as
// many connections named name in BLPOP as waiters, or as the pool allows,
// counted over admin (real Redis; a short pause on miniredis). A benchmark,
// so it may sleep.
func awaitBLPOPs(tb testing.TB, admin redis.UniversalClient, pool int, name string, waiters int) {
	tb.Helper()
	if !storetest.Real() {
		time.Sleep(200 * time.Millisecond)
		return
	}
	want := min(waiters, pool)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, blpop := clientConns(tb, admin, name); blpop >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Logf("naive waiters: fewer than %d in BLPOP after 30s", want)
}

// blpopMux is the multiplexed-BLPOP design the hub was chosen over, made
// round-free: n goroutines, each blocking on its own connection in one
// BLPOP over its share of the waited wake lists plus a control list of its
// own. Registering pushes the control list (once until the goroutine takes
// a new snapshot), so the blocked BLPOP returns and is re-issued with the
// new key at once; a popped wake list makes the goroutine re-read the
// record and signal the waiter. Bench-only; it needs every key on one node.
type blpopMux struct {
	s      *store.Store
	rdb    redis.UniversalClient
	prefix string
	shards []*blpopShard
	wg     sync.WaitGroup // the shard goroutines; they exit with ctx
}

type blpopShard struct {
	ctrl   string
	dirty  atomic.Bool  // a registration since the last snapshot; ctrl pushed
	issued atomic.Int64 // keys (without ctrl) in the latest BLPOP
	mu     sync.Mutex   // guards keys
	keys   map[string]blpopWaited
}

type blpopWaited struct {
	id   string
	woke chan struct{}
}

func newBLPOPMux(ctx context.Context, s *store.Store, rdb redis.UniversalClient, prefix string, n int) *blpopMux {
	m := &blpopMux{s: s, rdb: rdb, prefix: prefix}
	for i := range n {
		sh := &blpopShard{ctrl: fmt.Sprintf("%s:mux:%d", prefix, i), keys: map[string]blpopWaited{}}
		m.shards = append(m.shards, sh)
		m.wg.Go(func() { m.run(ctx, sh) })
	}
	return m
}

// stop cancels the shards' ctx, pushes their control lists so the blocked
// BLPOPs return at once, and waits for the goroutines.
func (m *blpopMux) stop(cancel context.CancelFunc) {
	cancel()
	for _, sh := range m.shards {
		_ = m.rdb.LPush(context.Background(), sh.ctrl, "stop").Err()
	}
	m.wg.Wait()
	for _, sh := range m.shards {
		_ = m.rdb.Del(context.Background(), sh.ctrl).Err()
	}
}

func (m *blpopMux) wait(ctx context.Context, id string) error {
	key := m.prefix + ":req:{" + id + "}:wake"
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	sh := m.shards[f.Sum32()%uint32(len(m.shards))]
	w := blpopWaited{id: id, woke: make(chan struct{})}
	sh.mu.Lock()
	sh.keys[key] = w
	sh.mu.Unlock()
	if sh.dirty.CompareAndSwap(false, true) {
		if err := m.rdb.LPush(ctx, sh.ctrl, "r").Err(); err != nil {
			return err
		}
	}
	if r, err := m.s.Request(ctx, id); err == nil && r.Status.Decided() {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-w.woke:
		return nil
	}
}

func (m *blpopMux) run(ctx context.Context, sh *blpopShard) {
	for ctx.Err() == nil {
		sh.dirty.Store(false)
		sh.mu.Lock()
		keys := make([]string, 0, len(sh.keys)+1)
		keys = append(keys, sh.ctrl)
		for k := range sh.keys {
			keys = append(keys, k)
		}
		sh.mu.Unlock()
		sh.issued.Store(int64(len(keys) - 1))
		res, err := m.rdb.BLPop(ctx, time.Second, keys...).Result()
		if err != nil {
			continue // timeout (redis.Nil) or ctx done
		}
		if res[0] == sh.ctrl {
			continue
		}
		sh.mu.Lock()
		w, ok := sh.keys[res[0]]
		sh.mu.Unlock()
		if !ok {
			continue
		}
		if r, err := m.s.Request(ctx, w.id); err == nil && r.Status.Decided() {
			sh.mu.Lock()
			delete(sh.keys, res[0])
			sh.mu.Unlock()
			close(w.woke)
		}
	}
}

// await blocks until the shards' latest BLPOPs cover n keys and no
// registration is pending. A benchmark, so it may sleep.
func (m *blpopMux) await(tb testing.TB, n int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var sum int64
		dirty := false
		for _, sh := range m.shards {
			sum += sh.issued.Load()
			dirty = dirty || sh.dirty.Load()
		}
		if sum >= int64(n) && !dirty {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("blpop-32: BLPOPs do not cover %d keys after %v", n, timeout)
}

// BenchmarkDecideWake is one decision and its wake-up as a waiting run
// sees it: the decision (RecordDecision, then Wake, as the lifecycle owner
// makes it; before issue 27, Store.Decide's one script) on a request whose
// Wait is parked, until that Wait returns the record. Its allocs/op and B/op are the garbage each decision
// makes in the process that decides and waits (the hub's delivery, the
// record decoded for the waiter, the decision's replies): the rate at which the
// garbage collector runs, the main source of the wake-up's p99 on 2 cores
// (docs/performance.md). The waits are parked, untimed, before each batch.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test -run '^$' -bench DecideWake -benchtime 2000x ./store/
func BenchmarkDecideWake(b *testing.B) {
	rdb, prefix := storetest.New(b)
	f := mustStoreOn(b, rdb, prefix, store.Options{WaitConns: 2})
	watch := newHubWatch(b.N)
	store.SetHubHooks(f.s, watch.hooks())
	rs := createMany(b, f.s, b.N)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	woke := make([]chan error, b.N)
	for i, r := range rs {
		woke[i] = make(chan error, 1)
		go func() { // exits when Wait returns: decided, or ctx cancelled
			_, err := f.s.Wait(ctx, r.ID)
			woke[i] <- err
		}()
	}
	watch.await(b, 5*time.Minute)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := decide(ctx, f.s, decision(rs[i], approval.VerdictApprove, "U1")); err != nil {
			b.Fatalf("Decide: %v", err)
		}
		if err := <-woke[i]; err != nil {
			b.Fatalf("Wait: %v", err)
		}
	}
}
