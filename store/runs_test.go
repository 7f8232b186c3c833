package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

func mustRuns(tb testing.TB) *store.Runs {
	tb.Helper()
	rdb, prefix := storetest.New(tb)
	return store.NewRuns(rdb, store.RunsOptions{Prefix: prefix})
}

func TestRunsLease(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	const ttl = time.Minute

	if ok, err := r.Acquire(ctx, "run_1", "a", ttl); err != nil || !ok {
		t.Fatalf("Acquire(a) = %v, %v, want true", ok, err)
	}
	if ok, err := r.Acquire(ctx, "run_1", "b", ttl); err != nil || ok {
		t.Fatalf("Acquire(b) while a holds = %v, %v, want false", ok, err)
	}
	if ok, err := r.Extend(ctx, "run_1", "b", ttl); err != nil || ok {
		t.Fatalf("Extend(b) = %v, %v, want false", ok, err)
	}
	if ok, err := r.Extend(ctx, "run_1", "a", ttl); err != nil || !ok {
		t.Fatalf("Extend(a) = %v, %v, want true", ok, err)
	}
	if ok, err := r.Release(ctx, "run_1", "b"); err != nil || ok {
		t.Fatalf("Release(b) = %v, %v, want false", ok, err)
	}
	if got, _ := r.LeaseOwner(ctx, "run_1"); got != "a" {
		t.Fatalf("LeaseOwner = %q, want a", got)
	}
	if ok, err := r.Release(ctx, "run_1", "a"); err != nil || !ok {
		t.Fatalf("Release(a) = %v, %v, want true", ok, err)
	}
	if ok, err := r.Extend(ctx, "run_1", "a", ttl); err != nil || ok {
		t.Fatalf("Extend(a) after release = %v, %v, want false", ok, err)
	}
	if ok, err := r.Acquire(ctx, "run_1", "b", ttl); err != nil || !ok {
		t.Fatalf("Acquire(b) after release = %v, %v, want true", ok, err)
	}
}

func TestRunsAcquireRace(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards wins
		wins []string
	)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("p%d", i)
			ok, err := r.Acquire(ctx, "run_race", owner, time.Minute)
			if err != nil {
				t.Errorf("Acquire(%s): %v", owner, err)
				return
			}
			if ok {
				mu.Lock()
				wins = append(wins, owner)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("winners = %v, want exactly one", wins)
	}
}

func TestRunsSaveIsFenced(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	if _, _, err := r.Load(ctx, "run_x"); !errors.Is(err, approval.ErrNotFound) {
		t.Fatalf("Load(missing) err = %v, want ErrNotFound", err)
	}
	if err := r.Save(ctx, "run_x", "a", []byte(`{"v":1}`), 0, true); !errors.Is(err, approval.ErrLeaseLost) {
		t.Fatalf("Save without lease = %v, want ErrLeaseLost", err)
	}
	if ok, _ := r.Acquire(ctx, "run_x", "a", time.Minute); !ok {
		t.Fatal("Acquire failed")
	}
	if err := r.Save(ctx, "run_x", "a", []byte(`{"v":1}`), 0, true); err != nil {
		t.Fatalf("Save(a) = %v", err)
	}
	if err := r.Save(ctx, "run_x", "b", []byte(`{"v":2}`), 0, true); !errors.Is(err, approval.ErrLeaseLost) {
		t.Fatalf("Save(b) = %v, want ErrLeaseLost", err)
	}
	rec, inbox, err := r.Load(ctx, "run_x")
	if err != nil || string(rec) != `{"v":1}` || len(inbox) != 0 {
		t.Fatalf("Load = %s, %q, %v, want {\"v\":1}", rec, inbox, err)
	}
}

func TestRunsInboxAndActiveSet(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	id := "run_in"
	for _, task := range []string{"t1", "t2"} {
		if err := r.Enqueue(ctx, id, []byte(task)); err != nil {
			t.Fatalf("Enqueue(%s): %v", task, err)
		}
	}
	active, _ := r.Active(ctx)
	if len(active) != 1 || active[0] != id {
		t.Fatalf("Active = %v, want [%s]", active, id)
	}
	rec, inbox, err := r.Load(ctx, id)
	if err != nil || rec != nil || len(inbox) != 2 || string(inbox[0]) != "t1" {
		t.Fatalf("Load = %s, %q, %v; want no record and [t1 t2]", rec, inbox, err)
	}
	if ok, _ := r.Acquire(ctx, id, "a", time.Minute); !ok {
		t.Fatal("Acquire failed")
	}
	// Consume one task and go idle: t2 is still queued, so the run stays
	// adoptable.
	if err := r.Save(ctx, id, "a", []byte(`{}`), 1, false); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if n, _ := r.Queued(ctx, id); n != 1 {
		t.Fatalf("Queued = %d, want 1", n)
	}
	if active, _ := r.Active(ctx); len(active) != 1 {
		t.Fatalf("Active with a queued task = %v, want the run", active)
	}
	if err := r.Save(ctx, id, "a", []byte(`{"done":true}`), 1, false); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if active, _ := r.Active(ctx); len(active) != 0 {
		t.Fatalf("Active after the last task = %v, want none", active)
	}
	if err := r.Save(ctx, id, "a", []byte(`{}`), 0, true); err != nil {
		t.Fatalf("Save active: %v", err)
	}
	if active, _ := r.Active(ctx); len(active) != 1 {
		t.Fatalf("Active after an active save = %v, want the run", active)
	}
}

func TestRunsThreadBinding(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex // guards ids
		ids = map[string]bool{}
	)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := r.ThreadRun(ctx, "C1", "1700000000.000100", fmt.Sprintf("run_%d", i))
			if err != nil {
				t.Errorf("ThreadRun: %v", err)
				return
			}
			mu.Lock()
			ids[id] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(ids) != 1 {
		t.Fatalf("runs bound to one thread = %v, want one", ids)
	}
	other, err := r.ThreadRun(ctx, "C1", "1700000000.000200", "run_other")
	if err != nil || other != "run_other" {
		t.Fatalf("ThreadRun(other thread) = %q, %v, want run_other", other, err)
	}
}

// TestRunsActivePageAndAcquireEach: ActivePage reads the adoption set by
// rank, oldest first, in pages that together hold every run once;
// AcquireEach takes, in one call, the leases nobody holds and reports the
// others as not won, leaving them with their owner.
func TestRunsActivePageAndAcquireEach(t *testing.T) {
	ctx := context.Background()
	r := mustRuns(t)
	const n = 7
	var ids []string
	for i := range n {
		id := fmt.Sprintf("run_page_%d", i)
		ids = append(ids, id)
		if err := r.Enqueue(ctx, id, []byte(`{"text":"t"}`)); err != nil { // marks it active
			t.Fatal(err)
		}
	}
	var paged []string
	for start := int64(0); ; start += 3 {
		page, err := r.ActivePage(ctx, start, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 3 {
			t.Fatalf("ActivePage(%d, 3) = %d ids", start, len(page))
		}
		paged = append(paged, page...)
		if len(page) < 3 {
			break
		}
	}
	all, err := r.Active(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(paged) != fmt.Sprint(all) || len(all) != n {
		t.Fatalf("pages = %v; want every active run once, as Active gives them (%v)", paged, all)
	}
	if _, err := r.Acquire(ctx, ids[1], "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx, ids[4], "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	won, err := r.AcquireEach(ctx, ids, "me", time.Minute)
	if err != nil || len(won) != n {
		t.Fatalf("AcquireEach = %v, %v", won, err)
	}
	for i, id := range ids {
		want, owner := true, "me"
		if i == 1 || i == 4 {
			want, owner = false, "other"
		}
		got, _ := r.LeaseOwner(ctx, id)
		if won[i] != want || got != owner {
			t.Errorf("%s: won %v, lease %q; want won %v, lease %q", id, won[i], got, want, owner)
		}
	}
	if won, err := r.AcquireEach(ctx, nil, "me", time.Minute); err != nil || len(won) != 0 {
		t.Errorf("AcquireEach(none) = %v, %v", won, err)
	}
}
