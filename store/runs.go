package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
)

// Run keys. The record, its lease and its inbox share the run id as hash tag,
// so the fenced save script stays within one Redis Cluster slot. The thread
// index and the active set live in their own slots and are only ever touched
// by single commands.
//
//	<prefix>:run:{<id>}                          run record (opaque JSON, written by the agent)
//	<prefix>:run:{<id>}:lease                    owner token, SET NX PX; extended by heartbeat
//	<prefix>:run:{<id>}:inbox                    LIST of queued tasks (opaque JSON) not yet in the record
//	<prefix>:thread:{<channel>:<thread_ts>}      run id of a task thread
//	<prefix>:runs:active                         ZSET run id → first activity (unix ms): runs to adopt
type runKeys struct{ prefix string }

func (k runKeys) run(id string) string { return k.prefix + ":run:{" + id + "}" }

func (k runKeys) lease(id string) string { return k.run(id) + ":lease" }

func (k runKeys) inbox(id string) string { return k.run(id) + ":inbox" }

func (k runKeys) thread(channel, threadTS string) string {
	return k.prefix + ":thread:{" + channel + ":" + threadTS + "}"
}

func (k runKeys) active() string { return k.prefix + ":runs:active" }

// RunsOptions configures Runs.
type RunsOptions struct {
	// Prefix is the key prefix, default "countersign".
	Prefix string
	// Retain is how long a finished run (record, inbox, thread index) is
	// kept after its last save, default 30 days. Active runs never expire.
	Retain time.Duration
	// Now is the clock used for the active set's scores, default time.Now.
	Now func() time.Time
}

// Runs keeps the agent's runs durable: an opaque record per run, a lease
// that says which process owns the run, a per-run inbox of queued
// follow-ups, the thread → run index and the set of runs to adopt after a
// crash. It knows nothing of the record's content.
//
// Ownership is a lease (SET NX PX) that only its owner can extend or delete
// (compare-and-extend / compare-and-delete in Lua), and every save is fenced
// by it: a process whose lease lapsed cannot overwrite the record of a run
// another process adopted.
type Runs struct {
	rdb    redis.UniversalClient
	k      runKeys
	retain time.Duration
	now    func() time.Time
}

// NewRuns returns Runs over rdb.
func NewRuns(rdb redis.UniversalClient, opts RunsOptions) *Runs {
	opts.Prefix = cmp.Or(opts.Prefix, "countersign")
	opts.Retain = option.PositiveOr(opts.Retain, 30*24*time.Hour)
	opts.Now = option.FuncOr(opts.Now, time.Now)
	return &Runs{rdb: rdb, k: runKeys{prefix: opts.Prefix}, retain: opts.Retain, now: opts.Now}
}

// extendLease extends the lease while owner holds it.
//
//	KEYS[1]   lease
//	ARGV[1]   owner
//	ARGV[2]   TTL (ms)
//
// Reply: 1 extended, 0 not held by owner.
var extendLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)

// releaseLease deletes the lease while owner holds it.
//
//	KEYS[1]   lease
//	ARGV[1]   owner
//
// Reply: 1 deleted, 0 not held by owner.
var releaseLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0`)

// saveRun writes a run's record and trims its inbox while owner holds the
// lease.
//
//	KEYS[1]   lease
//	KEYS[2]   record
//	KEYS[3]   inbox
//	ARGV[1]   owner
//	ARGV[2]   data
//	ARGV[3]   inbox entries consumed
//	ARGV[4]   "1" when active
//	ARGV[5]   retain (ms): an inactive record expires after it
//
// Reply: 1 saved, 0 when the caller does not hold the lease.
var saveRun = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
local n = tonumber(ARGV[3])
if n > 0 then
  redis.call('LTRIM', KEYS[3], n, -1)
end
if ARGV[4] ~= '1' then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return 1`)

// Acquire takes the lease on run id for owner when nobody holds it (SET NX
// PX). It reports false, with a nil error, when another owner (or owner
// itself) holds it.
func (s *Runs) Acquire(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	ok, err := s.rdb.SetNX(ctx, s.k.lease(id), owner, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("acquire run %s: %w", id, err)
	}
	return ok, nil
}

// Extend pushes the lease of run id out to ttl from now when owner still
// holds it, and reports false when it does not (the lease lapsed).
func (s *Runs) Extend(ctx context.Context, id, owner string, ttl time.Duration) (bool, error) {
	n, err := extendLease.Run(ctx, s.rdb, []string{s.k.lease(id)}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("extend run %s: %w", id, err)
	}
	return n == 1, nil
}

// Release deletes the lease of run id when owner holds it, so another
// process may adopt the run at once. It reports whether it did.
func (s *Runs) Release(ctx context.Context, id, owner string) (bool, error) {
	n, err := releaseLease.Run(ctx, s.rdb, []string{s.k.lease(id)}, owner).Int()
	if err != nil {
		return false, fmt.Errorf("release run %s: %w", id, err)
	}
	return n == 1, nil
}

// Save writes the record of run id, fenced by owner's lease, and drops the
// first consumed entries of its inbox (the tasks the record now contains)
// in the same atomic step. It returns approval.ErrLeaseLost when owner does not hold
// the lease. An active run stays in the adoption set and never expires; an
// inactive one leaves the set (unless tasks are queued) and is kept for
// RunsOptions.Retain.
func (s *Runs) Save(ctx context.Context, id, owner string, data []byte, consumed int, active bool) error {
	if active {
		// Into the adoption set before the record says active, so a crash
		// in between leaves at worst a stale hint (readers check the record).
		if err := s.markActive(ctx, id); err != nil {
			return err
		}
	}
	flag := "0"
	if active {
		flag = "1"
	}
	keys := []string{s.k.lease(id), s.k.run(id), s.k.inbox(id)}
	n, err := saveRun.Run(ctx, s.rdb, keys, owner, data, consumed, flag, s.retain.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("save run %s: %w", id, err)
	}
	if n == 0 {
		if active {
			// The hint added above must not outlive a run the store lost
			// (no record, no inbox): nobody could ever drive it.
			_ = s.Forget(ctx, id)
		}
		return fmt.Errorf("save run %s: %w", id, approval.ErrLeaseLost)
	}
	if active {
		return nil
	}
	// Leave the adoption set, then look at the inbox: a task queued
	// concurrently is either seen here (and the run re-marked) or its
	// Enqueue adds the run to the set after this ZREM.
	if err := s.rdb.ZRem(ctx, s.k.active(), id).Err(); err != nil {
		return fmt.Errorf("save run %s: leave active set: %w", id, err)
	}
	queued, err := s.rdb.LLen(ctx, s.k.inbox(id)).Result()
	if err != nil {
		return fmt.Errorf("save run %s: inbox length: %w", id, err)
	}
	if queued > 0 {
		return s.markActive(ctx, id)
	}
	return nil
}

func (s *Runs) markActive(ctx context.Context, id string) error {
	score := float64(s.now().UnixMilli())
	if err := s.rdb.ZAddNX(ctx, s.k.active(), redis.Z{Score: score, Member: id}).Err(); err != nil {
		return fmt.Errorf("mark run %s active: %w", id, err)
	}
	return nil
}

// Load returns the record of run id (nil when none was saved yet) and the
// tasks queued in its inbox, oldest first. It returns approval.ErrNotFound
// when there is neither.
func (s *Runs) Load(ctx context.Context, id string) (record []byte, inbox [][]byte, err error) {
	pipe := s.rdb.Pipeline()
	get := pipe.Get(ctx, s.k.run(id))
	lr := pipe.LRange(ctx, s.k.inbox(id), 0, -1)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("load run %s: %w", id, err)
	}
	record, err = get.Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, fmt.Errorf("load run %s: %w", id, err)
	}
	items, err := lr.Result()
	if err != nil {
		return nil, nil, fmt.Errorf("load run %s inbox: %w", id, err)
	}
	for _, it := range items {
		inbox = append(inbox, []byte(it))
	}
	if record == nil && len(inbox) == 0 {
		return nil, nil, fmt.Errorf("load run %s: %w", id, approval.ErrNotFound)
	}
	return record, inbox, nil
}

// Enqueue appends a task to the inbox of run id and marks the run active,
// in that order: a run with queued tasks is always adoptable.
func (s *Runs) Enqueue(ctx context.Context, id string, task []byte) error {
	if err := s.rdb.RPush(ctx, s.k.inbox(id), task).Err(); err != nil {
		return fmt.Errorf("enqueue task for run %s: %w", id, err)
	}
	return s.markActive(ctx, id)
}

// Queued returns how many tasks wait in the inbox of run id.
func (s *Runs) Queued(ctx context.Context, id string) (int64, error) {
	n, err := s.rdb.LLen(ctx, s.k.inbox(id)).Result()
	if err != nil {
		return 0, fmt.Errorf("inbox of run %s: %w", id, err)
	}
	return n, nil
}

// ThreadRun returns the run of a task thread, binding newID to the thread
// when it has none yet (SET NX, so concurrent first messages agree on one
// run). The binding is kept for RunsOptions.Retain after its last use.
func (s *Runs) ThreadRun(ctx context.Context, channel, threadTS, newID string) (string, error) {
	key := s.k.thread(channel, threadTS)
	ok, err := s.rdb.SetNX(ctx, key, newID, s.retain).Result()
	if err != nil {
		return "", fmt.Errorf("bind thread %s/%s: %w", channel, threadTS, err)
	}
	if ok {
		return newID, nil
	}
	id, err := s.rdb.GetEx(ctx, key, s.retain).Result()
	if errors.Is(err, redis.Nil) {
		// Expired between the two commands: bind again.
		return s.ThreadRun(ctx, channel, threadTS, newID)
	}
	if err != nil {
		return "", fmt.Errorf("thread %s/%s: %w", channel, threadTS, err)
	}
	return id, nil
}

// Active returns the ids of runs that are active or have queued tasks, the
// oldest first. It is a hint: the record (and its lease) is the truth.
// One command for the whole set: for operators and tests; the agent
// reads it by pages (ActivePage).
func (s *Runs) Active(ctx context.Context) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, s.k.active(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("active runs: %w", err)
	}
	return ids, nil
}

// ActivePage returns at most count ids of the adoption set (Active) from
// rank start, the oldest first: O(count) for Redis, however many runs are
// active, so reading 10,000 of them does not hold Redis for milliseconds
// at a time. Ranks shift as runs leave the set between pages; an id missed
// is read on the next pass (the set is a hint).
func (s *Runs) ActivePage(ctx context.Context, start, count int64) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, s.k.active(), start, start+count-1).Result()
	if err != nil {
		return nil, fmt.Errorf("active runs: %w", err)
	}
	return ids, nil
}

// AcquireEach is Acquire for each of ids, in one pipeline: one round trip
// per call, not one per run. won[i] reports whether ids[i]'s lease is now
// owner's.
func (s *Runs) AcquireEach(ctx context.Context, ids []string, owner string, ttl time.Duration) (won []bool, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	set := make([]*redis.BoolCmd, len(ids))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			set[i] = p.SetNX(ctx, s.k.lease(id), owner, ttl)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire %d runs: %w", len(ids), err)
	}
	won = make([]bool, len(ids))
	for i, c := range set {
		won[i] = c.Val()
	}
	return won, nil
}

// Forget removes run id from the adoption set when it has neither a record
// nor queued tasks (a run the store lost, or one long expired), so no
// process adopts it again and again. A task enqueued meanwhile puts it
// back: Enqueue adds the run to the set after pushing its task, and Forget
// looks at the run again after removing it.
func (s *Runs) Forget(ctx context.Context, id string) error {
	if err := s.rdb.ZRem(ctx, s.k.active(), id).Err(); err != nil {
		return fmt.Errorf("forget run %s: %w", id, err)
	}
	if _, _, err := s.Load(ctx, id); !errors.Is(err, approval.ErrNotFound) {
		if err != nil {
			return err
		}
		return s.markActive(ctx, id) // it came back meanwhile
	}
	return nil
}

// LeaseOwner returns who holds the lease of run id, "" when nobody does.
// For operators and tests.
func (s *Runs) LeaseOwner(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.k.lease(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("lease of run %s: %w", id, err)
	}
	return v, nil
}
