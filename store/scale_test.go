package store_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"runtime"
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

// manyWaiters is how many requests TestManyWaiters waits on at once: 10,000,
// or 4,000 under the race detector (it allows 8128 live goroutines).
func manyWaiters() int {
	if raceEnabled {
		return 4000
	}
	return 10000
}

// hubWatch counts registrations and the live subscriptions the hub's lanes
// report, so a test can wait until every waiter will get a hint.
type hubWatch struct {
	want       int64
	registered atomic.Int64
	allIn      chan struct{} // closed when every waiter is registered
	shards     []atomic.Int64
	covered    chan struct{} // closed when the latest rounds cover want keys
	once1      sync.Once
	once2      sync.Once
}

// maxLanes bounds the hub lanes a hubWatch follows (WaitConns per master).
const maxLanes = 64

func newHubWatch(want int) *hubWatch {
	return &hubWatch{want: int64(want), allIn: make(chan struct{}), covered: make(chan struct{}), shards: make([]atomic.Int64, maxLanes)}
}

func (w *hubWatch) hooks() store.HubHooks {
	return store.HubHooks{
		Registered: func(string) {
			if w.registered.Add(1) == w.want {
				w.once1.Do(func() { close(w.allIn) })
			}
		},
		Round: func(lane, keys int) {
			w.shards[lane].Store(int64(keys))
			var sum int64
			for i := range w.shards {
				sum += w.shards[i].Load()
			}
			if sum >= w.want {
				w.once2.Do(func() { close(w.covered) })
			}
		},
	}
}

func (w *hubWatch) await(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.After(timeout)
	for _, ch := range []chan struct{}{w.allIn, w.covered} {
		select {
		case <-ch:
		case <-deadline:
			tb.Fatalf("hub: %d of %d waiters registered, not all subscribed after %v", w.registered.Load(), w.want, timeout)
		}
	}
}

// createMany creates n pending requests with a few workers and returns them.
func createMany(tb testing.TB, s *store.Store, n int) []*approval.Request {
	tb.Helper()
	rs := make([]*approval.Request, n)
	for i := range rs {
		rs[i] = request(tb, nil)
	}
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make(chan error, 1)
	)
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := s.CreateRequest(context.Background(), rs[i]); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		tb.Fatalf("CreateRequest = %v", err)
	default:
	}
	return rs
}

// poolBound is the most connections rdb may open: the pool size plus the
// dedicated pipeline pool go-redis keeps (default 10, negative: none), per
// node (one node, or every master of a Cluster).
func poolBound(tb testing.TB, rdb redis.UniversalClient) int {
	tb.Helper()
	var size, pipe, nodes int
	switch c := rdb.(type) {
	case *redis.Client:
		size, pipe, nodes = c.Options().PoolSize, c.Options().PipelinePoolSize, 1
	case *redis.ClusterClient:
		size, pipe = c.Options().PoolSize, c.Options().PipelinePoolSize
		if size == 0 {
			size = 10 * runtime.GOMAXPROCS(0)
		}
		nodes = masters(rdb)
	default:
		tb.Fatalf("client is %T, want *redis.Client or *redis.ClusterClient", rdb)
	}
	switch {
	case pipe == 0:
		pipe = redis.DefaultPipelinePoolSize
	case pipe < 0:
		pipe = 0
	}
	return nodes * (size + pipe)
}

// masters is the number of masters rdb talks to: 1, or a Cluster's.
func masters(rdb redis.UniversalClient) int {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return 1
	}
	var mu sync.Mutex // guards n
	n := 0
	_ = cc.ForEachMaster(context.Background(), func(context.Context, *redis.Client) error {
		mu.Lock()
		n++
		mu.Unlock()
		return nil
	})
	return n
}

// openConns is the number of connections rdb's pools hold.
func openConns(rdb redis.UniversalClient) int {
	st := rdb.PoolStats()
	n := int(st.TotalConns)
	if st.PipelineStats != nil {
		n += int(st.PipelineStats.TotalConns)
	}
	return n
}

// clientConns counts the server's connections named name, and how many of
// them wait for a wake-up: blocked in BLPOP or subscribed to hint channels
// (CLIENT LIST; on every master of a Cluster). Real Redis only.
func clientConns(tb testing.TB, rdb redis.UniversalClient, name string) (total, blocked int) {
	tb.Helper()
	var list string
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex // guards list
		err = cc.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
			l, err := node.ClientList(ctx).Result()
			mu.Lock()
			list += l
			mu.Unlock()
			return err
		})
	} else {
		list, err = rdb.ClientList(context.Background()).Result()
	}
	if err != nil {
		tb.Fatalf("CLIENT LIST = %v", err)
	}
	for _, line := range strings.Split(list, "\n") {
		if os.Getenv("DEBUG_CLIENTS") != "" && strings.Contains(line, name) {
			tb.Log(line)
		}
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		total++
		if strings.Contains(line, " cmd=blpop") || subscribed.MatchString(line) {
			blocked++
		}
	}
	return total, blocked
}

// subscribed matches a CLIENT LIST line of a connection subscribed to at
// least one channel or shard channel.
var subscribed = regexp.MustCompile(` (sub|ssub)=[1-9]`)

// TestManyWaiters waits on 10,000 requests in one process: ordinary
// commands stay prompt and the connections held stay within the pool bound
// plus WaitConns subscriber connections, which are the only ones waiting.
func TestManyWaiters(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	n := manyWaiters()
	name := "cs-many-" + approval.NewID("t")[2:12]
	rdb, prefix := storetest.NewWith(t, func(o *redis.UniversalOptions) { o.ClientName = name })
	const waitConns = 2
	f := mustStoreOn(t, rdb, prefix, store.Options{WaitConns: waitConns})
	watch := newHubWatch(n)
	store.SetHubHooks(f.s, watch.hooks())

	rs := createMany(t, f.s, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan waitResult, n)
	var waiting sync.WaitGroup
	for _, r := range rs {
		waiting.Go(func() {
			got, err := f.s.Wait(ctx, r.ID)
			results <- waitResult{got, err}
		})
	}
	watch.await(t, 2*time.Minute)

	// Ordinary commands are prompt: the bound is generous (a correctness
	// bound: with one connection per waiter they would queue for the pool
	// and time out).
	began := time.Now()
	fresh := f.mustCreate(t, nil)
	if _, err := decide(ctx, f.s, decision(fresh, approval.VerdictApprove, "U1")); err != nil {
		t.Fatalf("Decide(fresh) with %d waiters = %v", n, err)
	}
	if _, err := f.s.Request(ctx, fresh.ID); err != nil {
		t.Fatalf("Request(fresh) with %d waiters = %v", n, err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("create+decide+read with %d waiters took %v, want well under 5s", n, took)
	} else {
		t.Logf("create+decide+read with %d waiters: %v", n, took)
	}

	// Decide some of the waited requests: their waiters wake.
	const decided = 10
	want := map[string]bool{}
	for _, r := range rs[:decided] {
		want[r.ID] = true
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
			t.Fatalf("Decide(%s) = %v", r.ID, err)
		}
	}
	for range decided {
		res := receive(t, results, 30*time.Second)
		if res.err != nil || !want[res.r.ID] || res.r.Status != approval.StatusApproved {
			t.Fatalf("Wait = %v, %v; want one of the %d decided requests", res.r, res.err, decided)
		}
		delete(want, res.r.ID)
	}

	// The hub's subscriber connections come from go-redis' Pub/Sub pool,
	// outside the command pools.
	pool := poolBound(t, rdb)
	if got := openConns(rdb); got > pool {
		t.Errorf("connections in the pools = %d, want ≤ pool bound %d", got, pool)
	} else {
		t.Logf("%d waiters: %d connections in the pools (bound %d)", n, got, pool)
	}
	if storetest.Real() {
		total, waiting := clientConns(t, rdb, name)
		subscribers := waitConns * masters(rdb) // WaitConns per master
		if total > pool+subscribers || waiting > subscribers {
			t.Errorf("CLIENT LIST: %d connections (%d waiting), want ≤ %d (≤ %d)", total, waiting, pool+subscribers, subscribers)
		} else {
			t.Logf("CLIENT LIST: %d connections named %s, %d subscribed", total, name, waiting)
		}
	}

	cancel()
	for range n - decided {
		if res := receive(t, results, 30*time.Second); !errors.Is(res.err, context.Canceled) {
			t.Fatalf("Wait after cancel = %v, want context.Canceled", res.err)
		}
	}
	waiting.Wait()
}
