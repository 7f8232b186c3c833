package store

import (
	"context"
	"github.com/redis/go-redis/v9"
	"time"

	"github.com/countersign/countersign/approval"
)

// HubHooks lets tests watch the wake hub instead of sleeping. Set them with
// SetHubHooks right after New, before the first Wait.
type HubHooks struct {
	// Registered is called after a waiter for id is registered.
	Registered func(id string)
	// Round is called by hub lane lane (numbered in creation order) after
	// it re-read records on subscription and after each idle BlockTimeout,
	// with the number of its waited requests whose hint subscription is
	// confirmed and whose record was re-read since.
	Round func(lane, keys int)
	// Backoff is called before each pause after a Redis error.
	Backoff func(lane int, d time.Duration)
	// RecheckRounds overrides how many BlockTimeouts pass between full
	// re-reads.
	RecheckRounds int
}

// SetHubHooks installs test hooks on s's wake hub.
func SetHubHooks(s *Store, h HubHooks) {
	s.hub.hooks.registered = h.Registered
	s.hub.hooks.recheck = h.RecheckRounds
	s.hub.hooks.round = h.Round
	s.hub.hooks.backoff = h.Backoff
}

// PushWake runs s.wake, the wake-up a lifecycle owner pushes after
// recording a decision (what the exported Store.Wake will call).
func PushWake(ctx context.Context, s *Store, id string, st approval.Status) error {
	return s.wake(ctx, id, st)
}

// SetAppendHook makes a run fn before each compare-and-set of an Append.
func SetAppendHook(a *Audit, fn func(attempt int)) { a.beforeAttempt = fn }

// SetQueuedHook makes a run fn once an append's entries are queued for
// a group commit.
func SetQueuedHook(a *Audit, fn func()) { a.afterQueued = fn }

// ReplayBatch writes the entries of rs as one group commit twice with
// the same op id, as go-redis does when it runs a script again after a
// reply it missed, and returns each run's stream IDs.
func ReplayBatch(ctx context.Context, a *Audit, rs []approval.Record) (first, again []string, err error) {
	es := make([]approval.Entry, len(rs))
	for i, r := range rs {
		if es[i], err = newEntry(r); err != nil {
			return nil, nil, err
		}
	}
	prev := a.last
	head := chain(es, prev, a.now())
	args := batchEntryFields([]any{prev.token(), head.seq, head.hash, a.maxLen, newOp(), newOp(), "0"}, es)
	keys := []string{a.stream, a.head, a.claimKey}
	ids := func() ([]string, error) {
		res, err := batchAppendScript.Run(ctx, a.rdb, keys, args...).Slice()
		if err != nil {
			return nil, err
		}
		var got []string
		for _, v := range res[1:] {
			id, _ := v.(string)
			got = append(got, id)
		}
		return got, nil
	}
	if first, err = ids(); err != nil {
		return nil, nil, err
	}
	a.last = head
	again, err = ids()
	return first, again, err
}

// Snapshot returns request id's record as a wake-up hint carries it:
// encoded by luaHint's snapshot in a script, decoded as the hub decodes
// it; false when the hub would not take it for a record.
func Snapshot(ctx context.Context, s *Store, id string) (map[string]string, bool, error) {
	msg, err := snapshotScript.Run(ctx, s.rdb, []string{s.k.request(id)}).Text()
	if err != nil {
		return nil, false, err
	}
	f, ok := decodeSnapshot(msg)
	return f, ok, nil
}

// DecodeSnapshot is the hub's decoding of a hint.
func DecodeSnapshot(msg string) (map[string]string, bool) { return decodeSnapshot(msg) }

var snapshotScript = redis.NewScript(luaHint + `return snapshot(KEYS[1])`)

// SetPageSize sets how many records s reads per page of an index (500
// outside tests), so a test walks several pages over fewer records. Set it
// right after New.
func SetPageSize(s *Store, n int) { s.page = n }

// DecodeRecord is the store's decoding of a record's hash fields.
func DecodeRecord(f map[string]string) (*approval.Request, error) { return decodeRecord(f) }

// DecodeSnapshotRecord decodes a snapshot's record the way a decision's
// reply is read (snapshotFields, no map), and the way a hint's is
// (decodeSnapshot, then decodeRecord); ok is whether each took msg for a
// snapshot.
func DecodeSnapshotRecord(msg string) (direct *approval.Request, directOK bool, viaMap *approval.Request, mapOK bool, directErr, mapErr error) {
	if rf, ok := snapshotFields(msg); ok {
		directOK = true
		direct, directErr = decodeFields(rf)
	}
	if f, ok := decodeSnapshot(msg); ok {
		mapOK = true
		viaMap, mapErr = decodeRecord(f)
	}
	return
}

// WakeKey is the name of request id's wake list.
func WakeKey(s *Store, id string) string { return s.k.wake(id) }

// WithdrawClaim runs withdrawScript on request id for the claim of op id
// op: 1 when it withdrew that claim.
func WithdrawClaim(ctx context.Context, s *Store, id, op string) (int64, error) {
	return withdrawScript.Run(ctx, s.rdb, []string{s.k.request(id)}, op).Int64()
}

// SetCheckpointReadHook makes c call fn after it has read entries, with
// the seq of the last one (tests wait on it instead of sleeping).
func SetCheckpointReadHook(c *Checkpointer, fn func(seq int64)) { c.afterRead = fn }

// SetAskHook has f called whenever a call of l asks Redis itself (not a
// refill taken ahead of need).
func SetAskHook(l *Limiter, f func()) { l.onAsk = f }

// FinishScript is Finish's script, for TestFinishOneTrip to load on every
// node of a Cluster.
var FinishScript = finishScript
