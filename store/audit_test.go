package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// auditRedis returns a Redis client and a stream name of its own: real
// Redis (one node or a Cluster, storetest) when REDIS_URL is set (only this
// test's keys are deleted at the end), else a miniredis.
func auditRedis(tb testing.TB) (redis.UniversalClient, string) {
	tb.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	stream := "cstest:{audit-" + hex.EncodeToString(b[:]) + "}"
	rdb, _ := storetest.NewWith(tb, func(o *redis.UniversalOptions) { o.PoolSize = 32 })
	if storetest.Real() {
		tb.Cleanup(func() {
			// stream and head share the {audit-…} slot
			if err := rdb.Del(context.Background(), stream, stream+":head", stream+":head:claim").Err(); err != nil {
				tb.Errorf("cleanup %s: %v", stream, err)
			}
		})
	}
	return rdb, stream
}

// countHandler is a slog.Handler that counts the records it gets.
type countHandler struct{ n atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

func newAudit(tb testing.TB, rdb redis.UniversalClient, stream string) *store.Audit {
	tb.Helper()
	clock := clocktest.New(clocktest.Opts{Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Step: time.Millisecond})
	return store.NewAudit(rdb, store.AuditOptions{Stream: stream, Now: clock.Now})
}

// mustAppend appends n records and returns the entries.
func mustAppend(tb testing.TB, a *store.Audit, n int) []approval.Entry {
	tb.Helper()
	var out []approval.Entry
	for i := range n {
		e, err := a.Append(context.Background(), approval.Record{
			Event: approval.EventProposed, RequestID: fmt.Sprintf("req_%d", i), RunID: "run_1",
			Actor: "U1", Tool: "refund", Data: map[string]any{"i": i, "amount": "12.50"},
		})
		if err != nil {
			tb.Fatalf("Append #%d: %v", i, err)
		}
		out = append(out, e)
	}
	return out
}

// rewrite rebuilds stream from its raw entries after mutate, keeping the
// stream IDs: the way an attacker with Redis access would edit history.
func rewrite(tb testing.TB, rdb redis.UniversalClient, stream string, mutate func([]redis.XMessage) []redis.XMessage) {
	tb.Helper()
	ctx := context.Background()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		tb.Fatal(err)
	}
	msgs = mutate(msgs)
	if err := rdb.Del(ctx, stream).Err(); err != nil {
		tb.Fatal(err)
	}
	for _, m := range msgs {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: m.ID, Values: m.Values}).Err(); err != nil {
			tb.Fatalf("XADD %s: %v", m.ID, err)
		}
	}
}

func TestAuditAppendChains(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	got := mustAppend(t, a, 3)
	for i, e := range got {
		if e.Seq != int64(i+1) {
			t.Errorf("entry %d Seq = %d, want %d", i, e.Seq, i+1)
		}
		if e.ID == "" {
			t.Errorf("entry %d has no stream ID", i)
		}
		if want := approval.ChainHash(e.PrevHash, e); e.Hash != want {
			t.Errorf("entry %d Hash = %s, want %s", i, e.Hash, want)
		}
	}
	if got[0].PrevHash != "" || got[1].PrevHash != got[0].Hash || got[2].PrevHash != got[1].Hash {
		t.Errorf("entries not chained: %+v", got)
	}
	stored, err := a.Range(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 3 {
		t.Fatalf("Range = %d entries, want 3", len(stored))
	}
	for i := range stored {
		g, w := stored[i], got[i]
		if g.ID != w.ID || g.Seq != w.Seq || !g.Time.Equal(w.Time) || g.Hash != w.Hash || string(g.Data) != string(w.Data) ||
			g.Event != w.Event || g.RequestID != w.RequestID || g.RunID != w.RunID || g.Actor != w.Actor || g.Tool != w.Tool {
			t.Errorf("Range[%d] = %+v, want %+v", i, g, w)
		}
	}
	if want := `{"amount":"12.50","i":0}`; string(stored[0].Data) != want {
		t.Errorf("stored data = %s, want %s", stored[0].Data, want)
	}
	if n, err := a.Verify(context.Background()); err != nil || n != 3 {
		t.Errorf("Verify = %d, %v, want 3, nil", n, err)
	}
}

func TestAuditVerifyEmpty(t *testing.T) {
	rdb, stream := auditRedis(t)
	n, err := newAudit(t, rdb, stream).Verify(context.Background())
	if err != nil || n != 0 {
		t.Errorf("Verify(empty) = %d, %v, want 0, nil", n, err)
	}
}

func TestAuditRejectsEmptyEvent(t *testing.T) {
	rdb, stream := auditRedis(t)
	if _, err := newAudit(t, rdb, stream).Append(context.Background(), approval.Record{}); err == nil {
		t.Error("Append(no event) = nil error, want an error")
	}
}

// TestAuditWriterNeverStarves: a process that loses every compare-and-set
// — another appends each time between its learning the head and its next
// try, as a busy process with entries queued does — claims the next append
// after a few losses, and the busy one waits for it instead of winning
// again. Before the claim the quiet process lost until Append gave up
// ("chain head kept moving after 1000 attempts") and its entry was lost.
func TestAuditWriterNeverStarves(t *testing.T) {
	rdb, stream := auditRedis(t)
	ctx := context.Background()
	busy := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
	quiet := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
	if _, err := quiet.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "quiet"}); err != nil {
		t.Fatal(err) // quiet now knows a head the busy one will move
	}
	var jumped, waited int
	store.SetAppendHook(quiet, func(int) {
		// A bound on how long the busy writer may wait here, so that a
		// claim honoured shows as its ctx ending rather than a hang.
		bctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := busy.Append(bctx, approval.Record{Event: approval.EventExecuted, Actor: "busy"})
		switch {
		case err == nil:
			jumped++
		case errors.Is(err, context.DeadlineExceeded):
			waited++
		default:
			t.Errorf("busy Append = %v", err)
		}
	})
	e, err := quiet.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "quiet"})
	store.SetAppendHook(quiet, nil)
	if err != nil {
		t.Fatalf("quiet Append after the busy writer jumped it %d times = %v, want it appended", jumped, err)
	}
	if waited == 0 {
		t.Errorf("the busy writer never waited for the quiet one's claim (jumped %d times)", jumped)
	}
	if _, err := busy.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "busy"}); err != nil {
		t.Errorf("busy Append after the claim = %v, want the claim released", err)
	}
	if n, err := busy.Verify(ctx); err != nil || n != int(e.Seq)+1 {
		t.Errorf("Verify = %d, %v; want %d entries, one chain", n, err, e.Seq+1)
	}
	t.Logf("the busy writer jumped the quiet one %d times, then waited %d times", jumped, waited)
}

// TestAuditConcurrentWriters has 8 writers on 2 Audit values (as if 2
// processes with 4 goroutines each) append 125 entries each: the result
// must be one unbroken chain with seq 1..1000. TestAuditConcurrentProcesses
// does the same with real processes. 1,000 entries meet ~550 failed
// compare-and-sets (4,000 took 2.7–3.9 s at the end of the suite, where
// store runs last); without the script's compare-and-set it fails every time.
func TestAuditConcurrentWriters(t *testing.T) {
	t.Parallel() // slow and independent (its own keys): overlaps with the rest of the package
	const writers, per = 8, 125
	rdb, stream := auditRedis(t)
	retries := &countHandler{}
	audits := make([]*store.Audit, 2)
	for i := range audits {
		audits[i] = store.NewAudit(rdb, store.AuditOptions{Stream: stream, Logger: slog.New(retries)})
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	ids := make([][]string, writers)
	for w := range writers {
		wg.Go(func() {
			a := audits[w%len(audits)]
			for i := range per {
				e, err := a.Append(context.Background(), approval.Record{
					Event: approval.EventExecuted, Actor: fmt.Sprintf("writer-%d", w), Data: map[string]int{"i": i},
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d Append #%d: %w", w, i, err)
					return
				}
				ids[w] = append(ids[w], e.ID)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The Audit values contend with each other, so some compare-and-sets
	// must have failed and been retried; otherwise this test proves little.
	if retries.n.Load() == 0 {
		t.Error("no compare-and-set retry logged; the writers never contended")
	}
	t.Logf("compare-and-set retries: %d", retries.n.Load())

	ctx := context.Background()
	checked, err := audits[0].Verify(ctx)
	if err != nil || checked != writers*per {
		t.Fatalf("Verify = %d, %v, want %d, nil", checked, err, writers*per)
	}
	seen := map[string]bool{}
	var after string
	var seq int64
	for {
		page, err := audits[0].Range(ctx, after, 333)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			seq++
			if e.Seq != seq {
				t.Fatalf("entry %s has seq %d, want %d", e.ID, e.Seq, seq)
			}
			seen[e.ID] = true
		}
		after = page[len(page)-1].ID
	}
	if seq != writers*per {
		t.Errorf("read %d entries, want %d", seq, writers*per)
	}
	for w := range ids {
		for _, id := range ids[w] {
			if !seen[id] {
				t.Errorf("writer %d: entry %s returned by Append is not in the stream", w, id)
			}
		}
	}
}

// TestAuditConcurrentProcesses runs 3 child processes (this test binary
// again) that append at the same time as this one: the chains of separate
// processes only meet in the Lua compare-and-set.
func TestAuditConcurrentProcesses(t *testing.T) {
	t.Parallel() // slow and independent (its own keys): overlaps with the rest of the package
	if os.Getenv("COUNTERSIGN_AUDIT_CHILD") != "" {
		t.Skip("child process")
	}
	const children, per = 3, 200
	rdb, stream := auditRedis(t)
	addrs, db := "", 0
	switch c := rdb.(type) {
	case *redis.Client:
		addrs, db = c.Options().Addr, c.Options().DB
	case *redis.ClusterClient:
		addrs = strings.Join(c.Options().Addrs, ",")
	}
	cmds := make([]*exec.Cmd, children)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAuditChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "COUNTERSIGN_AUDIT_CHILD="+strings.Join(
			[]string{addrs, strconv.Itoa(db), stream, strconv.Itoa(per)}, "|"))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("child %d output:\n%s", i, out.String())
			}
		})
	}
	mustAppend(t, newAudit(t, rdb, stream), per)
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
		}
	}
	if t.Failed() {
		return
	}
	want := (children + 1) * per
	if n, err := newAudit(t, rdb, stream).Verify(context.Background()); err != nil || n != want {
		t.Errorf("Verify = %d, %v, want %d, nil", n, err, want)
	}
}

// TestAuditChildProcess is the body of one child of
// TestAuditConcurrentProcesses; it does nothing in a normal run.
func TestAuditChildProcess(t *testing.T) {
	spec := os.Getenv("COUNTERSIGN_AUDIT_CHILD")
	if spec == "" {
		t.Skip("only run as a child of TestAuditConcurrentProcesses")
	}
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		t.Fatalf("COUNTERSIGN_AUDIT_CHILD = %q", spec)
	}
	db, err1 := strconv.Atoi(parts[1])
	n, err2 := strconv.Atoi(parts[3])
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(parts[0], ","), DB: db})
	defer rdb.Close()
	a := newAudit(t, rdb, parts[2])
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for i := range n / 2 {
				if _, err := a.Append(context.Background(), approval.Record{Event: approval.EventExecuted, Data: i}); err != nil {
					t.Errorf("Append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestAuditVerifyDetectsTampering(t *testing.T) {
	const n = 10
	tests := []struct {
		name      string
		tamper    func(t *testing.T, rdb redis.UniversalClient, stream string, entries []approval.Entry)
		wantIndex int
	}{
		{"delete middle", func(t *testing.T, rdb redis.UniversalClient, stream string, e []approval.Entry) {
			mustXDel(t, rdb, stream, e[4].ID)
		}, 4},
		{"delete first", func(t *testing.T, rdb redis.UniversalClient, stream string, e []approval.Entry) {
			mustXDel(t, rdb, stream, e[0].ID)
		}, 0},
		{"delete last", func(t *testing.T, rdb redis.UniversalClient, stream string, e []approval.Entry) {
			mustXDel(t, rdb, stream, e[n-1].ID)
		}, n - 1},
		{"delete all", func(t *testing.T, rdb redis.UniversalClient, stream string, e []approval.Entry) {
			rewrite(t, rdb, stream, func([]redis.XMessage) []redis.XMessage { return nil })
		}, 0},
		{"edit data", func(t *testing.T, rdb redis.UniversalClient, stream string, _ []approval.Entry) {
			rewrite(t, rdb, stream, func(m []redis.XMessage) []redis.XMessage {
				m[6].Values["data"] = `{"amount":"9999.00","i":6}`
				return m
			})
		}, 6},
		{"edit actor", func(t *testing.T, rdb redis.UniversalClient, stream string, _ []approval.Entry) {
			rewrite(t, rdb, stream, func(m []redis.XMessage) []redis.XMessage {
				m[2].Values["actor"] = "U2"
				return m
			})
		}, 2},
		{"edit and rehash one entry", func(t *testing.T, rdb redis.UniversalClient, stream string, e []approval.Entry) {
			rewrite(t, rdb, stream, func(m []redis.XMessage) []redis.XMessage {
				x := e[3]
				x.Actor = "U2"
				m[3].Values["actor"] = "U2"
				m[3].Values["hash"] = approval.ChainHash(x.PrevHash, x)
				return m
			})
		}, 4}, // the next entry's prev_hash no longer matches
		{"reorder", func(t *testing.T, rdb redis.UniversalClient, stream string, _ []approval.Entry) {
			rewrite(t, rdb, stream, func(m []redis.XMessage) []redis.XMessage {
				m[7].Values, m[8].Values = m[8].Values, m[7].Values
				return m
			})
		}, 7},
		{"malformed seq", func(t *testing.T, rdb redis.UniversalClient, stream string, _ []approval.Entry) {
			rewrite(t, rdb, stream, func(m []redis.XMessage) []redis.XMessage {
				m[5].Values["seq"] = "five"
				return m
			})
		}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, stream := auditRedis(t)
			a := newAudit(t, rdb, stream)
			entries := mustAppend(t, a, n)
			tt.tamper(t, rdb, stream, entries)
			checked, err := a.Verify(context.Background())
			var ce *approval.ChainError
			if !errors.As(err, &ce) {
				t.Fatalf("Verify = %d, %v, want a *approval.ChainError", checked, err)
			}
			if ce.Index != tt.wantIndex {
				t.Errorf("ChainError.Index = %d (%v), want %d", ce.Index, ce, tt.wantIndex)
			}
			if checked != tt.wantIndex {
				t.Errorf("Verify checked = %d, want %d", checked, tt.wantIndex)
			}
		})
	}
}

func mustXDel(tb testing.TB, rdb redis.UniversalClient, stream, id string) {
	tb.Helper()
	if n, err := rdb.XDel(context.Background(), stream, id).Result(); err != nil || n != 1 {
		tb.Fatalf("XDEL %s = %d, %v", id, n, err)
	}
}

// TestAuditNoSecretsInStream checks the raw stream, not the parsed entries.
func TestAuditNoSecretsInStream(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	secrets := []string{"live-key-8c1e77f0", "xoxb-123-456-abc", "hunter2", "AKIAIOSFODNN7EXAMPLE"}
	_, err := a.Append(context.Background(), approval.Record{
		Event: approval.EventProposed, Tool: "charge", Secret: []string{"api_key"},
		Data: map[string]any{
			"args":  json.RawMessage(`{"API_KEY":"live-key-8c1e77f0","amount":5}`),
			"note":  "posting with xoxb-123-456-abc to https://bob:hunter2@example.com",
			"extra": []string{"AKIAIOSFODNN7EXAMPLE"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("XRANGE = %d entries, want 1", len(msgs))
	}
	for k, v := range msgs[0].Values {
		for _, s := range secrets {
			if strings.Contains(fmt.Sprint(v), s) {
				t.Errorf("field %s = %v, contains secret %q", k, v, s)
			}
		}
	}
	if d := fmt.Sprint(msgs[0].Values["data"]); !strings.Contains(d, `"amount":5`) {
		t.Errorf("data = %s, want non-secret amount kept", d)
	}
}

func TestAuditPaging(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	all := mustAppend(t, a, 25)
	ctx := context.Background()

	var fwd []approval.Entry
	for after := ""; ; {
		page, err := a.Range(ctx, after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		fwd = append(fwd, page...)
		after = page[len(page)-1].ID
	}
	var rev []approval.Entry
	for before := ""; ; {
		page, err := a.RevRange(ctx, before, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		rev = append(rev, page...)
		before = page[len(page)-1].ID
	}
	if len(fwd) != len(all) || len(rev) != len(all) {
		t.Fatalf("paged %d forward and %d backward, want %d", len(fwd), len(rev), len(all))
	}
	for i := range all {
		if fwd[i].ID != all[i].ID {
			t.Errorf("Range order [%d] = %s, want %s", i, fwd[i].ID, all[i].ID)
		}
		if rev[len(all)-1-i].ID != all[i].ID {
			t.Errorf("RevRange order [%d] = %s, want %s", len(all)-1-i, rev[len(all)-1-i].ID, all[i].ID)
		}
	}
}

// TestAuditTrimmed checks that a stream trimmed by MaxLen still verifies:
// it starts part-way through the chain.
func TestAuditTrimmed(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := store.NewAudit(rdb, store.AuditOptions{Stream: stream, MaxLen: 10})
	mustAppend(t, a, 300)
	checked, err := a.Verify(context.Background())
	if err != nil {
		t.Fatalf("Verify(trimmed) = %d, %v", checked, err)
	}
	if checked == 0 || checked >= 300 {
		t.Errorf("Verify(trimmed) checked %d, want between 1 and 299", checked)
	}
}

// TestAuditHeadRecovered checks that a lost head key does not restart the
// chain: the next append continues from the stream's last entry.
func TestAuditHeadRecovered(t *testing.T) {
	rdb, stream := auditRedis(t)
	mustAppend(t, newAudit(t, rdb, stream), 5)
	if err := rdb.Del(context.Background(), stream+":head").Err(); err != nil {
		t.Fatal(err)
	}
	a := newAudit(t, rdb, stream) // a fresh process
	e := mustAppend(t, a, 1)[0]
	if e.Seq != 6 {
		t.Errorf("Append after lost head: Seq = %d, want 6", e.Seq)
	}
	if n, err := a.Verify(context.Background()); err != nil || n != 6 {
		t.Errorf("Verify = %d, %v, want 6, nil", n, err)
	}
}

// TestAuditHeadSameSlot checks that a stream name without a hash tag gets
// a head key hashed by the stream name, so scripts stay in one Cluster slot.
func TestAuditHeadSameSlot(t *testing.T) {
	rdb, stream := auditRedis(t)
	plain := strings.NewReplacer("{", "", "}", "").Replace(stream)
	t.Cleanup(func() { rdb.Del(context.Background(), plain, "{"+plain+"}:head") })
	mustAppend(t, newAudit(t, rdb, plain), 1)
	if n, err := rdb.Exists(context.Background(), "{"+plain+"}:head").Result(); err != nil || n != 1 {
		t.Errorf("EXISTS {%s}:head = %d, %v, want 1", plain, n, err)
	}
}

func TestAuditFollow(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	first := mustAppend(t, a, 1)[0]

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan approval.Entry)
	done := make(chan error, 1)
	go func() { // exits when ctx is cancelled (within one block of 1s)
		done <- a.Follow(ctx, first.ID, func(e approval.Entry) error {
			select {
			case got <- e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	want := mustAppend(t, a, 2)
	for i := range want {
		select {
		case e := <-got:
			if e.ID != want[i].ID || e.Hash != want[i].Hash {
				t.Errorf("Follow got %s (seq %d), want %s (seq %d)", e.ID, e.Seq, want[i].ID, want[i].Seq)
			}
		case err := <-done:
			t.Fatalf("Follow returned early: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("Follow delivered nothing within 10s")
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Follow after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return within 10s of cancel")
	}
}

func TestAuditFollowStopsOnCallbackError(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	mustAppend(t, a, 3)
	stop := errors.New("stop")
	var n int
	err := a.Follow(context.Background(), "0-0", func(approval.Entry) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Errorf("Follow = %v after %d entries, want stop after 2", err, n)
	}
}

func TestAuditAppendHonoursContext(t *testing.T) {
	rdb, stream := auditRedis(t)
	a := newAudit(t, rdb, stream)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Append(ctx, approval.Record{Event: approval.EventProposed}); !errors.Is(err, context.Canceled) {
		t.Errorf("Append(cancelled ctx) = %v, want context.Canceled", err)
	}
}

// TestAuditTraceID: a trace id is stored with its entry and read back,
// entries without one (as before trace ids) sit in the same chain, and
// editing a stored trace id breaks the chain.
func TestAuditTraceID(t *testing.T) {
	ctx := context.Background()
	rdb, stream := auditRedis(t)
	a := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, r := range []approval.Record{
		{Event: approval.EventRunStarted, RunID: "run_1"},
		{Event: approval.EventProposed, RunID: "run_1", TraceID: traceID},
		{Event: approval.EventRunFinished, RunID: "run_1"},
	} {
		if _, err := a.Append(ctx, r); err != nil {
			t.Fatalf("Append(%s): %v", r.Event, err)
		}
	}
	es, err := a.Range(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.TraceID)
	}
	if want := []string{"", traceID, ""}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("trace ids read back = %q, want %q", got, want)
	}
	if n, err := a.Verify(ctx); err != nil || n != 3 {
		t.Fatalf("Verify = %d, %v, want 3 intact", n, err)
	}
	// Rewrite the stream with entry 2 carrying another trace id (same ids,
	// same order).
	vals, err := rdb.XRangeN(ctx, stream, es[1].ID, es[1].ID, 1).Result()
	if err != nil || len(vals) != 1 {
		t.Fatalf("XRANGE: %v %v", vals, err)
	}
	tampered := vals[0].Values
	tampered["trace_id"] = "00000000000000000000000000000001"
	all, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		v := m.Values
		if m.ID == es[1].ID {
			v = tampered
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: m.ID, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = a.Verify(ctx)
	var ce *approval.ChainError
	if !errors.As(err, &ce) || ce.Seq != 2 {
		t.Errorf("Verify after editing a trace id = %v, want a break at seq 2", err)
	}
}
