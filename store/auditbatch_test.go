package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// TestAuditGroupCommit: appends that wait for this process's turn while
// another is on its way to Redis are written together, in one script
// call, each entry chained on the one before: nine appends queued behind
// one make two compare-and-sets, not ten, and the chain verifies, each
// caller holding its own entry with the ID the stream gave it.
func TestAuditGroupCommit(t *testing.T) {
	rdb, stream := auditRedis(t)
	ctx := context.Background()
	a := newAudit(t, rdb, stream)
	const others = 9
	queued := make(chan struct{}, others+1)
	store.SetQueuedHook(a, func() { queued <- struct{}{} })
	var attempts atomic.Int32
	store.SetAppendHook(a, func(int) {
		if attempts.Add(1) == 1 {
			for range others + 1 { // the first append's own, then the others'
				<-queued
			}
		}
	})

	got := make([]approval.Entry, others+1)
	errs := make([]error, others+1)
	var wg sync.WaitGroup
	first := make(chan struct{})
	wg.Go(func() {
		close(first)
		got[0], errs[0] = a.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "first"})
	})
	<-first
	for i := 1; i <= others; i++ {
		wg.Go(func() {
			got[i], errs[i] = a.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: fmt.Sprintf("caller %d", i)})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := attempts.Load(); n != 2 {
		t.Errorf("%d compare-and-sets for %d appends, want 2: the first alone, then the nine queued behind it together", n, others+1)
	}
	n, err := a.Verify(ctx)
	if err != nil || n != others+1 {
		t.Fatalf("Verify = %d, %v, want %d, nil", n, err, others+1)
	}
	stored, err := a.Range(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range got {
		j := slices.IndexFunc(stored, func(s approval.Entry) bool { return s.ID == e.ID })
		if j < 0 || stored[j].Actor != e.Actor || stored[j].Seq != e.Seq || stored[j].Hash != e.Hash {
			t.Errorf("caller %d holds entry %+v, not the one the stream has under its ID", i, e)
		}
	}
}

// TestAuditAppendAll: one caller's entries are written in order, one on
// the other, in one compare-and-set.
func TestAuditAppendAll(t *testing.T) {
	rdb, stream := auditRedis(t)
	ctx := context.Background()
	a := newAudit(t, rdb, stream)
	mustAppend(t, a, 2)
	var attempts int
	store.SetAppendHook(a, func(int) { attempts++ })
	es, err := a.AppendAll(ctx, []approval.Record{
		{Event: approval.EventAssessed, RequestID: "r1"},
		{Event: approval.EventAutoApproved, RequestID: "r1"},
		{Event: approval.EventExecuted, RequestID: "r1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Errorf("%d compare-and-sets, want 1", attempts)
	}
	for i, e := range es {
		if e.Seq != int64(3+i) || e.ID == "" {
			t.Errorf("entry %d = seq %d, ID %q; want seq %d and its stream ID", i, e.Seq, e.ID, 3+i)
		}
	}
	if es[2].Event != approval.EventExecuted || es[1].PrevHash != es[0].Hash {
		t.Errorf("entries out of order or not chained: %+v", es)
	}
	if n, err := a.Verify(ctx); err != nil || n != 5 {
		t.Errorf("Verify = %d, %v, want 5, nil", n, err)
	}
	if _, err := a.AppendAll(ctx, []approval.Record{{Event: approval.EventExecuted}, {}}); err == nil {
		t.Error("AppendAll with an entry without an event = nil error, want an error and nothing written")
	}
	if n, err := a.Verify(ctx); err != nil || n != 5 {
		t.Errorf("Verify after a refused AppendAll = %d, %v, want 5, nil", n, err)
	}
}

// TestAuditGroupCommitRunAgain: a group commit's script run again with
// the same op id (go-redis after a reply it missed) answers the IDs of
// the entries it wrote and writes nothing twice.
func TestAuditGroupCommitRunAgain(t *testing.T) {
	rdb, stream := auditRedis(t)
	ctx := context.Background()
	a := newAudit(t, rdb, stream)
	mustAppend(t, a, 1)
	first, again, err := store.ReplayBatch(ctx, a, []approval.Record{{Event: approval.EventExecuted, Actor: "a"}, {Event: approval.EventExecuted, Actor: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 || !slices.Equal(first, again) {
		t.Errorf("run again answered %v, the first run %v: want the same two IDs", again, first)
	}
	if n, err := a.Verify(ctx); err != nil || n != 3 {
		t.Errorf("Verify = %d, %v, want 3, nil (nothing written twice)", n, err)
	}
}

// TestAuditQueuedAppendHonoursContext: an append whose context ends while
// it waits behind another's is taken out of the queue and written never.
func TestAuditQueuedAppendHonoursContext(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	queued := make(chan struct{}, 2)
	store.SetQueuedHook(a, func() { queued <- struct{}{} })
	gctx, cancel := context.WithCancel(context.Background())
	once := false
	store.SetAppendHook(a, func(int) {
		if once {
			return
		}
		once = true
		<-queued // the first append's own
		gaveUp := make(chan error, 1)
		go func() {
			_, err := a.Append(gctx, approval.Record{Event: approval.EventExecuted, Actor: "gives up"})
			gaveUp <- err
		}()
		<-queued // the second's: it waits behind this one
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Errorf("the queued Append whose context ended = %v, want context.Canceled", err)
		}
	})
	if _, err := a.Append(context.Background(), approval.Record{Event: approval.EventExecuted, Actor: "first"}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Verify(context.Background()); err != nil || n != 1 {
		t.Errorf("Verify = %d, %v, want 1, nil: the append that gave up wrote nothing", n, err)
	}
}

// TestLedgerAppendNew: the entries of a call settled without a request
// are written only while no request has the call's id. Written: in one
// round trip on a single node (the check rides with the group commit),
// the chain intact. A request with the id: nothing written, the request
// returned with approval.ErrExists. In one group commit with others'
// entries, a call whose id is taken loses its entries and nobody else's.
// On a Cluster (the record and the chain in other slots) the record is
// read first: the same outcomes, in two round trips.
func TestLedgerAppendNew(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	stream := f.prefix + ":{audit}"
	a := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream, Wakes: f.s})
	l := store.NewLedger(f.s, a)
	_, cluster := f.rdb.(*redis.ClusterClient)
	rec := func(id, actor string) approval.Record {
		return approval.Record{Event: approval.EventAutoApproved, RequestID: id, Actor: actor, Tool: "lookup"}
	}
	warm := approval.NewID("req") // the script loaded, the chain's head known
	if _, err := l.AppendNew(ctx, warm, rec(warm, "warm")); err != nil {
		t.Fatal(err)
	}

	free := approval.NewID("req")
	trips := &storetest.TripCounter{}
	f.rdb.AddHook(trips)
	before := trips.N.Load()
	if got, err := l.AppendNew(ctx, free, rec(free, "assessed"), rec(free, "auto")); err != nil || got != nil {
		t.Fatalf("AppendNew of a free id = %v, %v; want nil, nil", got, err)
	}
	if n := trips.N.Load() - before; !cluster && n != 1 {
		t.Errorf("AppendNew took %d round trips on a single node, want 1", n)
	}

	taken := f.mustCreate(t, nil)
	got, err := l.AppendNew(ctx, taken.ID, rec(taken.ID, "retry"))
	if !errors.Is(err, approval.ErrExists) || got == nil || got.ID != taken.ID || got.Status != approval.StatusPending {
		t.Fatalf("AppendNew of a taken id = %+v, %v; want the pending request and ErrExists", got, err)
	}

	// A group commit of three callers behind a first, the second of them
	// with its id taken. On a Cluster that one reads the record and queues
	// nothing.
	ids := []string{approval.NewID("req"), approval.NewID("req"), taken.ID, approval.NewID("req")}
	waitFor := len(ids) // the first caller's own, then those behind it
	if cluster {
		waitFor--
	}
	queued := make(chan struct{}, len(ids))
	store.SetQueuedHook(a, func() { queued <- struct{}{} })
	var attempts atomic.Int32
	store.SetAppendHook(a, func(int) {
		if attempts.Add(1) == 1 {
			for range waitFor {
				<-queued
			}
		}
	})
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	first := make(chan struct{})
	wg.Go(func() {
		close(first)
		_, errs[0] = l.AppendNew(ctx, ids[0], rec(ids[0], "first"))
	})
	<-first
	for i := 1; i < len(ids); i++ {
		wg.Go(func() { _, errs[i] = l.AppendNew(ctx, ids[i], rec(ids[i], fmt.Sprintf("caller %d", i))) })
	}
	wg.Wait()
	for i, err := range errs {
		if want := ids[i] == taken.ID; errors.Is(err, approval.ErrExists) != want || (!want && err != nil) {
			t.Errorf("caller %d (taken %v) = %v", i, want, err)
		}
	}
	n, err := a.Verify(ctx)
	if err != nil {
		t.Fatalf("Verify = %v", err)
	}
	entries, err := a.Range(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var actors []string
	for _, e := range entries {
		if e.RequestID == taken.ID {
			t.Errorf("an entry of the taken id was written: %+v", e)
		}
		actors = append(actors, e.Actor)
	}
	// The warm-up's one, the free call's two, then the three callers not
	// taken (the first, then the two others in any order).
	if n != 6 || len(entries) != 6 {
		t.Errorf("%d entries (%d verified), want 6: %q", len(entries), n, actors)
	}
}

// TestAuditAppendsWithoutScripts: Redis that has lost the append scripts
// (restarted, failed over, SCRIPT FLUSH) is sent them again: one entry,
// a group commit and a group commit conditional on a free id are each
// written once, chained. (Redis is told to answer NOSCRIPT by a hook, not
// by flushing a server other tests share.)
func TestAuditAppendsWithoutScripts(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	stream := f.prefix + ":{audit}"
	a := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream, Wakes: f.s})
	l := store.NewLedger(f.s, a)
	lost := &noScript{}
	f.rdb.AddHook(lost)
	want := 2
	lost.arm()
	if _, err := a.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "one"}); err != nil {
		t.Fatalf("Append: %v", err)
	}
	lost.arm()
	if _, err := a.AppendAll(ctx, []approval.Record{{Event: approval.EventExecuted, Actor: "two"}, {Event: approval.EventExecuted, Actor: "three"}}); err != nil {
		t.Fatalf("AppendAll: %v", err)
	}
	if _, cluster := f.rdb.(*redis.ClusterClient); !cluster { // AppendNew's script is a single node's
		want++
		lost.arm()
		id := approval.NewID("req")
		if got, err := l.AppendNew(ctx, id, approval.Record{Event: approval.EventAutoApproved, RequestID: id, Actor: "four"}); err != nil || got != nil {
			t.Fatalf("AppendNew = %v, %v; want nil, nil", got, err)
		}
	}
	if lost.answered.Load() != int32(want) {
		t.Errorf("NOSCRIPT answered %d times, want %d: an append did not send EVALSHA first", lost.answered.Load(), want)
	}
	if n, err := a.Verify(ctx); err != nil || n != want+1 {
		t.Errorf("Verify = %d, %v; want %d entries (each written once), nil", n, err, want+1)
	}
}

// noScript answers the next EVALSHA once armed with NOSCRIPT, as Redis
// does after it has lost its scripts, without sending it.
type noScript struct {
	armed    atomic.Bool
	answered atomic.Int32
}

func (h *noScript) arm() { h.armed.Store(true) }

func (h *noScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *noScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && h.armed.CompareAndSwap(true, false) {
			h.answered.Add(1)
			cmd.SetErr(redis.ErrNoScript)
			return redis.ErrNoScript
		}
		return next(ctx, cmd)
	}
}

func (h *noScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
