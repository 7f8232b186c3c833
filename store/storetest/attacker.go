package storetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// Attacker edits an audit stream the way someone with write access to
// Redis can, and leaves it consistent as far as Redis can tell: every
// entry after an edit hashed again, the chain head key moved, "trimmed"
// set after deleting the oldest entries. It is what the red team's tool
// did (issue 29); tests show that signed checkpoints catch each edit.
// It also writes the checkpointer's keys (issue 46): its lock, and the
// checkpoint it keeps in Redis. The field and key names are those store
// writes (store/audit.go appendEntryFields, store/checkpoint.go).
type Attacker struct {
	RDB    redis.UniversalClient
	Stream string
}

// head is the chain head key of the stream (store's auditHeadKey).
func (a Attacker) head() string {
	if i := strings.IndexByte(a.Stream, '{'); i >= 0 && strings.IndexByte(a.Stream[i+1:], '}') > 0 {
		return a.Stream + ":head"
	}
	return "{" + a.Stream + "}:head"
}

// CheckpointKey is the key of the checkpoint the checkpointer keeps in
// Redis.
func (a Attacker) CheckpointKey() string { return a.head() + ":checkpoint" }

// CheckpointLockKey is the key of the checkpointer's lock.
func (a Attacker) CheckpointLockKey() string { return a.head() + ":checkpoint:lock" }

// HoldCheckpointLock sets the checkpointer's lock to value, with no
// expiry: the attack of issue 46 that silenced checkpoints.
func (a Attacker) HoldCheckpointLock(tb testing.TB, value string) {
	tb.Helper()
	if err := a.RDB.Set(context.Background(), a.CheckpointLockKey(), value, 0).Err(); err != nil {
		tb.Fatalf("attacker: SET lock: %v", err)
	}
}

// SetCheckpoint replaces the checkpoint kept in Redis with raw (JSON, or
// anything).
func (a Attacker) SetCheckpoint(tb testing.TB, raw string) {
	tb.Helper()
	if err := a.RDB.Set(context.Background(), a.CheckpointKey(), raw, 0).Err(); err != nil {
		tb.Fatalf("attacker: SET checkpoint: %v", err)
	}
}

// StoredCheckpoint returns the checkpoint kept in Redis, as stored.
func (a Attacker) StoredCheckpoint(tb testing.TB) string {
	tb.Helper()
	raw, err := a.RDB.Get(context.Background(), a.CheckpointKey()).Result()
	if err != nil {
		tb.Fatalf("attacker: GET checkpoint: %v", err)
	}
	return raw
}

func (a Attacker) entries(tb testing.TB) []approval.Entry {
	tb.Helper()
	es, err := store.NewAudit(a.RDB, store.AuditOptions{Stream: a.Stream}).Range(context.Background(), "", 1<<30)
	if err != nil {
		tb.Fatalf("attacker: read %s: %v", a.Stream, err)
	}
	return es
}

// Rewrite applies edit to the entry with seq, hashes it and every entry
// after it again (each keeps its stream id), and moves the head key to
// the new last hash.
func (a Attacker) Rewrite(tb testing.TB, seq int64, edit func(*approval.Entry)) {
	tb.Helper()
	ctx := context.Background()
	es := a.entries(tb)
	prev, found := "", false
	for i := range es {
		e := &es[i]
		if e.Seq == seq {
			edit(e)
			found = true
		}
		if found {
			e.PrevHash = prev
			if e.Seq == 1 {
				e.PrevHash = ""
			}
			e.Hash = approval.ChainHash(e.PrevHash, *e)
		}
		prev = e.Hash
	}
	if !found {
		tb.Fatalf("attacker: no entry with seq %d", seq)
	}
	if err := a.RDB.Del(ctx, a.Stream).Err(); err != nil {
		tb.Fatal(err)
	}
	for _, e := range es {
		if err := a.RDB.XAdd(ctx, &redis.XAddArgs{Stream: a.Stream, ID: e.ID, Values: fields(e)}).Err(); err != nil {
			tb.Fatalf("attacker: XADD %s: %v", e.ID, err)
		}
	}
	last := es[len(es)-1]
	a.setHead(tb, last, "")
}

// CutTail deletes the last n entries and moves the head key back.
func (a Attacker) CutTail(tb testing.TB, n int) {
	tb.Helper()
	es := a.entries(tb)
	for _, e := range es[len(es)-n:] {
		if err := a.RDB.XDel(context.Background(), a.Stream, e.ID).Err(); err != nil {
			tb.Fatal(err)
		}
	}
	a.setHead(tb, es[len(es)-n-1], "")
}

// TrimHead deletes the first n entries and marks the stream trimmed, as
// the writer's own XADD MAXLEN would.
func (a Attacker) TrimHead(tb testing.TB, n int) {
	tb.Helper()
	es := a.entries(tb)
	for _, e := range es[:n] {
		if err := a.RDB.XDel(context.Background(), a.Stream, e.ID).Err(); err != nil {
			tb.Fatal(err)
		}
	}
	a.setHead(tb, es[len(es)-1], "1")
}

func (a Attacker) setHead(tb testing.TB, last approval.Entry, trimmed string) {
	tb.Helper()
	vals := []any{"seq", strconv.FormatInt(last.Seq, 10), "hash", last.Hash, "id", last.ID, "op", "attacker"}
	if trimmed != "" {
		vals = append(vals, "trimmed", trimmed)
	}
	if err := a.RDB.HSet(context.Background(), a.head(), vals...).Err(); err != nil {
		tb.Fatal(err)
	}
}

func fields(e approval.Entry) map[string]any {
	f := map[string]any{
		"seq": strconv.FormatInt(e.Seq, 10), "time": e.Time.UTC().Format(time.RFC3339Nano),
		"event": string(e.Event), "request_id": e.RequestID, "run_id": e.RunID, "actor": e.Actor,
		"tool": e.Tool, "data": string(e.Data), "prev_hash": e.PrevHash, "hash": e.Hash,
	}
	if e.TraceID != "" {
		f["trace_id"] = e.TraceID
	}
	return f
}
