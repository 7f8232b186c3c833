package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/store/storetest"
)

// countedRuns is the process's run store, counting what Resume asks it.
type countedRuns struct {
	agent.Runs
	mu       sync.Mutex
	pages    int   // ActivePage calls
	acquires []int // AcquireEach calls: how many runs each
	singles  int   // Acquire calls
}

func (c *countedRuns) ActivePage(ctx context.Context, start, count int64) ([]string, error) {
	c.mu.Lock()
	c.pages++
	c.mu.Unlock()
	return c.Runs.ActivePage(ctx, start, count)
}

func (c *countedRuns) AcquireEach(ctx context.Context, ids []string, owner string, ttl time.Duration) ([]bool, error) {
	c.mu.Lock()
	c.acquires = append(c.acquires, len(ids))
	c.mu.Unlock()
	return c.Runs.AcquireEach(ctx, ids, owner, ttl)
}

func (c *countedRuns) Acquire(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	c.mu.Lock()
	c.singles++
	c.mu.Unlock()
	return c.Runs.Acquire(ctx, id, owner, ttl)
}

// TestResumeByPages: with 1,203 runs in the adoption set, 1,200 of them
// held by another live process, one pass of Resume reads the set in three
// pages and tries the leases in three pipelines, not in 1,200 round trips
// (nor one read of the whole set, which holds Redis for milliseconds at
// 10,000): it adopts exactly the three nobody holds, and the next pass,
// with them gone from the set, adopts nothing.
func TestResumeByPages(t *testing.T) {
	w := newWorld(t)
	var runs *countedRuns
	p := w.start(func(o *agent.Options) {
		runs = &countedRuns{Runs: o.Runs}
		o.Runs = runs
	})
	ctx := context.Background()
	active := w.prefix + ":runs:active"
	const held, free = 1200, 3
	_, err := w.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range held + free {
			id := fmt.Sprintf("run_paged_%04d", i)
			pl.ZAdd(ctx, active, redis.Z{Score: float64(i), Member: id})
			if i < held {
				pl.Set(ctx, w.prefix+":run:{"+id+"}:lease", "proc-alive", time.Minute)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.agent.Resume(ctx)
	if err != nil || n != free {
		t.Fatalf("Resume = %d, %v; want the %d runs nobody holds", n, err, free)
	}
	runs.mu.Lock()
	pages, acquires, singles := runs.pages, append([]int(nil), runs.acquires...), runs.singles
	runs.mu.Unlock()
	if pages != 3 || len(acquires) != 3 || acquires[0]+acquires[1]+acquires[2] != held+free || singles != 0 {
		t.Errorf("one pass: %d page reads, lease pipelines of %v runs, %d single acquires; want 3 pages, 3 pipelines covering %d runs, none single",
			pages, acquires, singles, held+free)
	}
	for i := range held {
		id := fmt.Sprintf("run_paged_%04d", i)
		if owner := w.rdb.Get(ctx, w.prefix+":run:{"+id+"}:lease").Val(); owner != "proc-alive" {
			t.Fatalf("lease of %s = %q after Resume; want still proc-alive's", id, owner)
		}
	}
	// The three adopted runs have no record and no task: their workers
	// find nothing and drop them from the set. Close waits for them.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.agent.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i := held; i < held+free; i++ {
		id := fmt.Sprintf("run_paged_%04d", i)
		if err := w.rdb.ZScore(ctx, active, id).Err(); err != redis.Nil {
			t.Errorf("adopted run %s still in the adoption set (%v); want it dropped", id, err)
		}
	}
	if n, err := w.start().agent.Resume(ctx); err != nil || n != 0 {
		t.Errorf("a later Resume = %d, %v; want nothing to adopt", n, err)
	}
}

// BenchmarkResumePass is one pass of run adoption (Resume, which
// ResumeEvery makes every 2 s) with 10,000 runs active, all of them held
// by other live processes (three replicas hold about 6,700 each the others
// own): what every process pays every pass to find nothing to adopt.
// redis-rt/op counts its round trips (commands and pipelines).
//
//	REDIS_URL=redis://127.0.0.1:6379 go test ./agent/ -run '^$' -bench ResumePass -benchtime 20x
func BenchmarkResumePass(b *testing.B) {
	w := newWorld(b)
	p := w.start()
	ctx := context.Background()
	const active = 10000
	_, err := w.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range active {
			id := fmt.Sprintf("run_bench_%05d", i)
			pl.ZAdd(ctx, w.prefix+":runs:active", redis.Z{Score: float64(i), Member: id})
			pl.Set(ctx, w.prefix+":run:{"+id+"}:lease", "proc-alive", time.Hour)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	trips := &storetest.TripCounter{}
	p.rdb.AddHook(trips)
	b.ResetTimer()
	for range b.N {
		if n, err := p.agent.Resume(ctx); err != nil || n != 0 {
			b.Fatalf("Resume = %d, %v; want nothing adopted", n, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(trips.N.Load())/float64(b.N), "redis-rt/op")
}
