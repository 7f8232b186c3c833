package store_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/countersign/countersign/store/witness"
)

// The attacks of issue 46, black-box against the checkpointer with write
// access to Redis: a lock with no expiry, a rewrite of entries after the
// last checkpoint, a forged checkpoint kept in Redis. Each is refused or
// survived, and raised as an alarm (Health, the log, Alarms).

// memAlarms keeps what the checkpointer told.
type memAlarms struct {
	mu      sync.Mutex // guards raised, cleared
	raised  []string
	cleared []string
}

func (m *memAlarms) Alarm(_ context.Context, _, reason string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.raised = append(m.raised, reason)
	return nil
}

func (m *memAlarms) Cleared(_ context.Context, _, reason string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cleared = append(m.cleared, reason)
	return nil
}

func (m *memAlarms) told() (raised, cleared []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.raised...), append([]string(nil), m.cleared...)
}

// logLines keeps the log's records as "LEVEL msg attrs".
type logLines struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// errors returns the ERROR lines containing s.
func (l *logLines) errors(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.HasPrefix(line, "ERROR") && strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// watched is a checkpointer of the fixture's stream on a test clock, with
// its witness, alarms and log.
type watched struct {
	cpr     *store.Checkpointer
	clock   *clocktest.Clock
	witness *memWitness
	alarms  *memAlarms
	log     *logLines
}

const testInterval = 3 * time.Second // the attacker's deployment: checkpoints every 3 s

// watch builds a checkpointer over f's stream with f's key (edit, when
// set, changes its options).
func (f checkpointFixture) watch(t *testing.T, edit func(*store.CheckpointOptions)) watched {
	t.Helper()
	w := watched{clock: clocktest.New(clocktest.Opts{}), witness: &memWitness{}, alarms: &memAlarms{}, log: &logLines{}}
	opts := store.CheckpointOptions{Key: f.key, Every: f.every, Witnesses: []store.Witness{w.witness}, Alarms: w.alarms, Interval: testInterval,
		Now: w.clock.Now, Logger: slog.New(w.log)}
	if edit != nil {
		edit(&opts)
	}
	w.cpr = store.NewCheckpointer(f.audit, opts)
	return w
}

// tick is one look of the checkpointer.
func (w watched) tick(t *testing.T) error {
	t.Helper()
	return w.cpr.Tick(t.Context())
}

// TestCheckpointLockWithoutTTL: a lock no replica wrote — set with no
// expiry, a value nobody signed, a copy of a replica's expired lock, a key
// of another type — does not stop checkpoints: it is taken over and
// raised as an alarm. A replica's own lock is respected.
func TestCheckpointLockWithoutTTL(t *testing.T) {
	tests := []struct {
		name string
		hold func(t *testing.T, f checkpointFixture, a storetest.Attacker)
	}{
		{"any value, no expiry", func(t *testing.T, _ checkpointFixture, a storetest.Attacker) {
			a.HoldCheckpointLock(t, "attacker")
		}},
		{"a value no replica signed, with an expiry", func(t *testing.T, f checkpointFixture, a storetest.Attacker) {
			if err := f.rdb.Set(t.Context(), a.CheckpointLockKey(), "op_x 99999999999999 c2lnbmF0dXJl", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"a replica's lock copied, kept with no expiry", func(t *testing.T, f checkpointFixture, a storetest.Attacker) {
			// A replica takes the lock and is stopped mid-checkpoint (its
			// witness blocks); the attacker copies the value and keeps it
			// for ever once the replica is done.
			var value string
			replica := f.watch(t, func(o *store.CheckpointOptions) {
				o.Witnesses = []store.Witness{witnessFunc(func() {
					v, err := f.rdb.Get(context.Background(), a.CheckpointLockKey()).Result()
					if err != nil {
						t.Errorf("GET lock: %v", err)
					}
					value = v
				})}
			})
			if _, _, err := replica.cpr.Checkpoint(t.Context()); err != nil {
				t.Fatal(err)
			}
			mustAppend(t, f.audit, 1)
			a.HoldCheckpointLock(t, value)
		}},
		{"a key of another type", func(t *testing.T, f checkpointFixture, a storetest.Attacker) {
			if err := f.rdb.HSet(t.Context(), a.CheckpointLockKey(), "holder", "attacker").Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustCheckpointFixture(t, 0)
			a := storetest.Attacker{RDB: f.rdb, Stream: f.stream}
			t.Cleanup(func() { _ = f.rdb.Del(context.Background(), a.CheckpointLockKey()).Err() })
			tt.hold(t, f, a)
			w := f.watch(t, nil)
			w.clock.Advance(time.Hour) // past any lock a replica signed during hold
			cp, made, err := w.cpr.Checkpoint(t.Context())
			if err != nil || !made {
				t.Fatalf("Checkpoint with the lock held by the attacker = %v, %v; want a checkpoint (the lock taken over)", made, err)
			}
			if err := w.tick(t); err != nil {
				t.Fatalf("Tick = %v", err)
			}
			alarm := w.cpr.Health().Alarm
			if !strings.Contains(alarm, "took over the checkpoint lock") || !strings.Contains(alarm, "which no replica wrote") {
				t.Errorf("Health().Alarm = %q, want the lock taken over", alarm)
			}
			if raised, _ := w.alarms.told(); len(raised) != 1 {
				t.Errorf("Alarms told %q, want one alarm", raised)
			}
			if len(w.log.errors("audit checkpoint lock taken over")) != 1 || len(w.log.errors("audit checkpoint ALARM")) != 1 {
				t.Errorf("log = %q, want an ERROR line for the lock and one for the alarm", w.log.lines)
			}
			if got := len(w.witness.all()); got != 1 || cp.Seq < 8 {
				t.Errorf("witness holds %d checkpoints (last seq %d), want the stream covered", got, cp.Seq)
			}
			// The alarm lasts the bound, then clears.
			w.clock.Advance(approval.CheckpointBound(testInterval) + time.Second)
			if err := w.tick(t); err != nil || w.cpr.Health().Alarm != "" {
				t.Errorf("after the bound: Tick = %v, alarm %q, want none", err, w.cpr.Health().Alarm)
			}
			if _, cleared := w.alarms.told(); len(cleared) != 1 {
				t.Errorf("Alarms cleared %q, want once", cleared)
			}
		})
	}
}

// witnessFunc is a witness that runs fn on each checkpoint and keeps
// nothing.
type witnessFunc func()

func (w witnessFunc) Name() string { return "func" }
func (w witnessFunc) Publish(context.Context, approval.Checkpoint) error {
	w()
	return nil
}

// TestCheckpointRespectsReplicaLock: while one replica makes a checkpoint,
// another finds its lock (signed, not expired): busy, no alarm.
func TestCheckpointRespectsReplicaLock(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	other := f.watch(t, nil)
	var busy error
	holder := f.watch(t, func(o *store.CheckpointOptions) {
		o.Witnesses = []store.Witness{witnessFunc(func() { _, _, busy = other.cpr.Checkpoint(context.Background()) })}
	})
	if _, _, err := holder.cpr.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(busy, store.ErrCheckpointBusy) {
		t.Errorf("Checkpoint while a replica holds the lock = %v, want ErrCheckpointBusy", busy)
	}
	if a := other.cpr.Health().Alarm; a != "" {
		t.Errorf("Health().Alarm = %q, want none: the lock is a replica's", a)
	}
}

// TestCheckpointRefusesRewriteAfterRead: entries written after the last
// checkpoint, read by the checkpointer, then rewritten in Redis (the
// attack: bob's approval given to an unknown user, everything after
// hashed again) are never signed, and the alarm says so.
func TestCheckpointRefusesRewriteAfterRead(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, f checkpointFixture, a storetest.Attacker, decided approval.Entry)
		want   string
	}{
		{"decided entry's actor rewritten, rehashed after", func(t *testing.T, _ checkpointFixture, a storetest.Attacker, d approval.Entry) {
			a.Rewrite(t, d.Seq, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
		}, "changed since it was read"},
		{"rewritten, and the server appends on the forged head", func(t *testing.T, f checkpointFixture, a storetest.Attacker, d approval.Entry) {
			a.Rewrite(t, d.Seq, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
			mustAppend(t, f.audit, 2)
		}, "does not link to the hash read"},
		{"entries read cut off the end", func(t *testing.T, _ checkpointFixture, a storetest.Attacker, _ approval.Entry) {
			a.CutTail(t, 2)
		}, "are gone from the stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustCheckpointFixture(t, 0)
			a := storetest.Attacker{RDB: f.rdb, Stream: f.stream}
			w := f.watch(t, nil)
			if _, _, err := w.cpr.Checkpoint(t.Context()); err != nil {
				t.Fatal(err)
			}
			// 12 more entries, one an approval by bob; the checkpointer
			// reads them (a look before the interval: no checkpoint yet).
			mustAppend(t, f.audit, 5)
			decided, err := f.audit.Append(t.Context(), approval.Record{Event: approval.EventDecided, RequestID: "req_b", Actor: "U0BOB0001", Tool: "refund",
				Data: map[string]any{"verdict": "approve"}})
			if err != nil {
				t.Fatal(err)
			}
			mustAppend(t, f.audit, 6)
			if err := w.tick(t); err != nil {
				t.Fatalf("Tick = %v", err)
			}
			if h := w.cpr.Health(); h.Uncovered != 12 || h.Alarm != "" {
				t.Fatalf("Health() = %+v, want 12 entries read, no alarm", h)
			}
			tt.tamper(t, f, a, decided)
			if n, err := f.audit.Verify(t.Context()); err != nil {
				t.Fatalf("Verify (keyless) = %d, %v; the attack passes it", n, err)
			}

			w.clock.Advance(testInterval)
			if err := w.tick(t); !errors.Is(err, store.ErrCheckpointDiverged) {
				t.Errorf("Tick after the rewrite = %v, want ErrCheckpointDiverged", err)
			}
			if _, _, err := w.cpr.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) {
				t.Errorf("Checkpoint after the rewrite = %v, want ErrCheckpointDiverged", err)
			}
			if got := w.witness.all(); len(got) != 1 {
				t.Errorf("witness holds %d checkpoints, want only the one before the rewrite: the forged history is never signed", len(got))
			}
			alarm := w.cpr.Health().Alarm
			if !strings.Contains(alarm, "refusing to sign") || !strings.Contains(alarm, tt.want) {
				t.Errorf("Health().Alarm = %q, want a refusal naming %q", alarm, tt.want)
			}
			if raised, _ := w.alarms.told(); len(raised) != 1 || !strings.Contains(raised[0], tt.want) {
				t.Errorf("Alarms told %q, want the refusal", raised)
			}
			if len(w.log.errors("audit checkpoint ALARM")) != 1 {
				t.Errorf("log = %q, want one ERROR line for the alarm", w.log.lines)
			}
			// Removing the lock, waiting, looking again: still refused.
			w.clock.Advance(time.Hour)
			if err := w.tick(t); !errors.Is(err, store.ErrCheckpointDiverged) || len(w.witness.all()) != 1 {
				t.Errorf("Tick an hour later = %v (%d checkpoints), want still refused", err, len(w.witness.all()))
			}
			if n := len(w.log.errors("audit checkpoint ALARM")); n != 2 {
				t.Errorf("%d ERROR alarm lines an hour on, want the alarm repeated once (a minute apart at most)", n)
			}
		})
	}
}

// TestCheckpointRefusesForgedStored: a checkpoint kept in Redis that this
// key did not sign — no signature, a bad one, another key's "hand-over"
// to this one, seq 2^40 so that none is ever due — is refused and
// raised; it is never built on.
func TestCheckpointRefusesForgedStored(t *testing.T) {
	forged := func(t *testing.T, f checkpointFixture, sign ed25519.PrivateKey, edit func(*approval.Checkpoint)) string {
		t.Helper()
		cp := approval.Checkpoint{Stream: f.stream, Seq: 1 << 40, EntryID: "99999999999999-0", Head: strings.Repeat("ab", 32), From: 1,
			Covered: approval.CoveredDigest(nil), First: 1, Time: time.Now().UTC(), NextKey: approval.EncodePublicKey(f.key.Public().(ed25519.PublicKey))}
		if sign != nil {
			cp = approval.SignCheckpoint(sign, cp)
		}
		if edit != nil {
			edit(&cp)
		}
		b, _ := json.Marshal(cp)
		return string(b)
	}
	_, stranger, _ := ed25519.GenerateKey(nil)
	tests := []struct {
		name  string
		store func(t *testing.T, f checkpointFixture) string
		want  string
	}{
		{"unsigned, seq 2^40, naming this key next", func(t *testing.T, f checkpointFixture) string {
			return forged(t, f, nil, nil)
		}, "this process cannot check"},
		{"signed by another key, naming this key next", func(t *testing.T, f checkpointFixture) string {
			return forged(t, f, stranger, nil)
		}, "this process cannot check"},
		{"signed by this key, then edited to seq 2^40", func(t *testing.T, f checkpointFixture) string {
			return forged(t, f, f.key, func(c *approval.Checkpoint) { c.NextKey = ""; c.Seq = 1<<40 + 1 })
		}, "signature does not match its content"},
		{"signed by this key, about another stream", func(t *testing.T, f checkpointFixture) string {
			cp := approval.SignCheckpoint(f.key, approval.Checkpoint{Stream: "countersign:{other}", Seq: 1 << 40, From: 1, First: 1, Time: time.Now().UTC()})
			b, _ := json.Marshal(cp)
			return string(b)
		}, "is about stream"},
		{"not JSON", func(*testing.T, checkpointFixture) string { return "{" }, "is not a checkpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// At start: nothing to build on but the forgery.
			f := mustCheckpointFixture(t, 0)
			a := storetest.Attacker{RDB: f.rdb, Stream: f.stream}
			a.SetCheckpoint(t, tt.store(t, f))
			w := f.watch(t, nil)
			if _, _, err := w.cpr.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Checkpoint over a forged checkpoint = %v, want ErrCheckpointDiverged naming %q", err, tt.want)
			}
			if err := w.tick(t); !errors.Is(err, store.ErrCheckpointDiverged) {
				t.Errorf("Tick over a forged checkpoint = %v, want ErrCheckpointDiverged", err)
			}
			if alarm := w.cpr.Health().Alarm; !strings.Contains(alarm, "refused") || !strings.Contains(alarm, tt.want) {
				t.Errorf("Health().Alarm = %q, want the refusal", alarm)
			}
			if raised, _ := w.alarms.told(); len(raised) != 1 {
				t.Errorf("Alarms told %q, want one alarm", raised)
			}
			if n := len(w.witness.all()); n != 0 {
				t.Errorf("witness holds %d checkpoints, want none built on a forgery", n)
			}

			// While running: the forgery replaces a real checkpoint. The
			// checkpointer goes on from its own last, and says so.
			f = mustCheckpointFixture(t, 0)
			a = storetest.Attacker{RDB: f.rdb, Stream: f.stream}
			w = f.watch(t, nil)
			if _, _, err := w.cpr.Checkpoint(t.Context()); err != nil {
				t.Fatal(err)
			}
			a.SetCheckpoint(t, tt.store(t, f))
			mustAppend(t, f.audit, 3)
			w.clock.Advance(testInterval)
			if err := w.tick(t); err != nil {
				t.Errorf("Tick = %v", err)
			}
			if got := w.witness.all(); len(got) != 2 || got[1].Seq != 11 {
				t.Fatalf("witness holds %+v, want a second checkpoint up to seq 11", got)
			}
			if raised, _ := w.alarms.told(); len(raised) != 1 || !strings.Contains(raised[0], "kept in Redis") {
				t.Errorf("Alarms told %q, want the refused checkpoint named", raised)
			}
			if ok, out := f.verify(t, w.witness.all()); !ok {
				t.Errorf("VerifyCheckpointed = %v, %q", ok, out)
			}
			if !strings.Contains(a.StoredCheckpoint(t), `"seq":11`) {
				t.Errorf("Redis keeps %s, want the checkpoint of seq 11 in place of the forgery", a.StoredCheckpoint(t))
			}
		})
	}
}

// TestCheckpointStartsFromItsWitness: with the file witness read back
// (Record), a forged or rolled-back checkpoint in Redis is not built on:
// the witness's last is, with an alarm.
func TestCheckpointStartsFromItsWitness(t *testing.T) {
	for _, tt := range []struct {
		name string
		want string
	}{{"rolled back", "rolled back"}, {"deleted", "deleted"}, {"forged", "refused"}} {
		t.Run(tt.name, func(t *testing.T) {
			f := mustCheckpointFixture(t, 3)
			a := storetest.Attacker{RDB: f.rdb, Stream: f.stream}
			file := &witness.File{Path: filepath.Join(t.TempDir(), "checkpoints.jsonl")}
			first := f.watch(t, func(o *store.CheckpointOptions) { o.Witnesses = []store.Witness{file} })
			if _, _, err := first.cpr.Checkpoint(t.Context()); err != nil { // 3 checkpoints: seq 3, 6, 8
				t.Fatal(err)
			}
			cps, _ := witness.ReadFile(file.Path)
			switch tt.name {
			case "rolled back":
				cps[0].Hashes = nil
				b, _ := json.Marshal(cps[0])
				a.SetCheckpoint(t, string(b))
			case "deleted":
				if err := f.rdb.Del(t.Context(), a.CheckpointKey()).Err(); err != nil {
					t.Fatal(err)
				}
			case "forged":
				a.SetCheckpoint(t, `{"seq":1099511627776,"next_key":"`+approval.EncodePublicKey(f.key.Public().(ed25519.PublicKey))+`"}`)
			}
			mustAppend(t, f.audit, 2)
			w := f.watch(t, func(o *store.CheckpointOptions) { o.Witnesses, o.Record = []store.Witness{file}, file })
			w.clock.Advance(testInterval)
			if err := w.tick(t); err != nil {
				t.Fatalf("Tick = %v", err)
			}
			if alarm := w.cpr.Health().Alarm; !strings.Contains(alarm, tt.want) {
				t.Errorf("Health().Alarm = %q, want %q", alarm, tt.want)
			}
			cps, _ = witness.ReadFile(file.Path)
			if len(cps) != 4 || cps[3].Seq != 10 {
				t.Fatalf("witness file holds %d checkpoints, want a fourth up to seq 10", len(cps))
			}
			if ok, out := f.verify(t, cps); !ok {
				t.Errorf("VerifyCheckpointed = %v, %q: the chain must go on from the witness's last", ok, out)
			}
		})
	}
}

// TestCheckpointLagAlarm: whatever stops checkpoints (here every witness
// failing), an entry left uncovered past the bound is an alarm — in
// Health, the log and Alarms — and its end is told too; `audit verify`
// then says NOT PROVEN for those entries.
func TestCheckpointLagAlarm(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	w := f.watch(t, nil)
	if _, _, err := w.cpr.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	w.witness.err = errors.New("disk full")
	mustAppend(t, f.audit, 2)
	bound := approval.CheckpointBound(testInterval)
	for elapsed := time.Duration(0); elapsed <= bound; elapsed += time.Second {
		_ = w.tick(t)
		if h := w.cpr.Health(); h.Alarm != "" {
			t.Fatalf("after %s: Health() = %+v, want no alarm within the bound", elapsed, h)
		}
		w.clock.Advance(time.Second)
	}
	_ = w.tick(t)
	h := w.cpr.Health()
	if h.Uncovered != 2 || h.Lag <= bound || !strings.Contains(h.Alarm, "no checkpoint covers the 2 entries") || !strings.Contains(h.Alarm, "disk full") {
		t.Errorf("past the bound: Health() = %+v, want the lag alarm naming why", h)
	}
	if raised, _ := w.alarms.told(); len(raised) != 1 {
		t.Errorf("Alarms told %q, want one alarm", raised)
	}
	if len(w.log.errors("audit checkpoint ALARM")) != 1 {
		t.Errorf("log = %q, want one ERROR line for the alarm", w.log.lines)
	}
	if ok, out := f.verifyAt(t, w.witness.all(), time.Now().Add(time.Hour)); ok || !strings.Contains(out, "audit NOT PROVEN: 2 entries after the last checkpoint (seq 8") {
		t.Errorf("VerifyCheckpointed an hour after = %v, %q; want NOT PROVEN", ok, out)
	}

	w.witness.err = nil
	if err := w.tick(t); err != nil {
		t.Fatalf("Tick = %v", err)
	}
	if h := w.cpr.Health(); h.Alarm != "" || h.Uncovered != 0 {
		t.Errorf("after a checkpoint: Health() = %+v, want all covered, no alarm", h)
	}
	if _, cleared := w.alarms.told(); len(cleared) != 1 {
		t.Errorf("Alarms cleared %q, want once", cleared)
	}
}

// TestCheckpointReplicasShare: two replicas with the same key continue
// one chain: each takes over the other's checkpoint from Redis (its
// signature checked, its head the one it read), and the witnesses' copies
// merged prove the stream.
func TestCheckpointReplicasShare(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	one, two := f.watch(t, nil), f.watch(t, nil)
	if err := two.tick(t); err != nil { // reads the 8 entries, signs them
		t.Fatal(err)
	}
	mustAppend(t, f.audit, 3)
	one.clock.Advance(testInterval)
	if err := one.tick(t); err != nil { // starts from two's seq 8, reads 9-11, signs them
		t.Fatal(err)
	}
	if err := two.tick(t); err != nil { // reads 9-11, takes over one's seq 11
		t.Fatal(err)
	}
	for i, w := range []watched{one, two} {
		if h := w.cpr.Health(); h.Uncovered != 0 || h.Alarm != "" {
			t.Errorf("replica %d: Health() = %+v, want everything covered, no alarm", i+1, h)
		}
	}
	cps := approval.MergeCheckpoints(one.witness.all(), two.witness.all())
	if ok, out := f.verify(t, cps); !ok || !strings.Contains(out, "11 entries up to seq 11 by 2 checkpoints") {
		t.Errorf("VerifyCheckpointed = %v, %q", ok, out)
	}
}

// TestCheckpointFollowsLive: Run reads entries as they are appended
// (XREAD), before any look, so a rewrite after that is caught.
func TestCheckpointFollowsLive(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	tick := make(chan time.Time)
	w := f.watch(t, func(o *store.CheckpointOptions) {
		o.Ticker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
	})
	read := make(chan int64, 16)
	store.SetCheckpointReadHook(w.cpr, func(seq int64) { read <- seq })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.cpr.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitRead := func(want int64) {
		t.Helper()
		for seq := range read {
			if seq == want {
				return
			}
		}
	}
	waitRead(8)
	mustAppend(t, f.audit, 2)
	waitRead(10) // no look yet: the follower read them
	if h := w.cpr.Health(); h.Uncovered != 10 {
		t.Fatalf("Health() = %+v, want the 10 entries read", h)
	}
	storetest.Attacker{RDB: f.rdb, Stream: f.stream}.Rewrite(t, 9, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
	tick <- w.clock.Advance(testInterval)
	tick <- w.clock.Now() // the first look has returned
	if got := w.witness.all(); len(got) != 0 {
		t.Errorf("witness holds %+v, want nothing signed over the rewrite", got)
	}
	if alarm := w.cpr.Health().Alarm; !strings.Contains(alarm, "changed since it was read") {
		t.Errorf("Health().Alarm = %q, want the rewrite named", alarm)
	}
}
