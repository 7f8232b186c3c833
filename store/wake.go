package store

import (
	"context"
	"fmt"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// wakeScript pushes the wake-up of a final transition recorded without one
// (Store.wake): the wake list element, its TTL and the hint, which carries
// the record (snapshot).
//
//	KEYS[1]   wake list
//	KEYS[2]   record
//	KEYS[3]   the audit chain head (Audit.AppendWake only)
//	ARGV[1]   status
//	ARGV[2]   wake list TTL (seconds)
//	ARGV[3]   "1" to first check that the record here is final
//	          (Options.WaitReplicas: the WAIT that follows must cover the
//	          decision, and after a failover the primary this connection
//	          reaches may not have it; a record that vanished is final only
//	          as "lost"): then 0, nothing pushed, when it is not
//	ARGV[4]   the hint channel (keys.channel)
//	ARGV[5]   with KEYS[3]: the op id of the append this wake-up follows
//	          (appendScript's ARGV[5]): 0, nothing pushed, unless that
//	          append wrote the head (it failed, or another entry came
//	          after it: the caller pushes the wake-up itself)
var wakeScript = redis.NewScript(luaHint + `
if KEYS[3] and redis.call('HGET', KEYS[3], 'op') ~= ARGV[5] then return 0 end
if ARGV[3] == '1' then
  local st = redis.call('HGET', KEYS[2], 'status')
  if st == 'pending' or (not st and ARGV[1] ~= 'lost') then return 0 end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
hint(ARGV[4], snapshot(KEYS[2]))
return 1
`)

// Wake pushes the wake-up of request id, which became final (status st),
// for whoever waits on it. The lifecycle owner calls it after recording and
// auditing the transition. A lost wake-up loses no decision: waiters re-read
// the record.
func (s *Store) Wake(ctx context.Context, id string, st approval.Status) error {
	return s.wake(ctx, id, st)
}

// wake pushes the wake-up for a final transition recorded without one
// (RecordDecision and friends), with the same TTL the scripts give it, and
// publishes the hint the wake hub listens for (wakeScript, wait.go).
//
// With Options.WaitReplicas it then waits (WAIT, on the same connection)
// until that many replicas have everything written so far, the decision
// included, and returns an error wrapping ErrNotReplicated when fewer did
// or when the primary it reaches does not hold the transition at all (a
// failover since it was recorded: the script checks the record first).
//
// The request is final, so the same pipeline drops it from the pending and
// deadline indexes (global keys: another slot, another node on a Cluster,
// where go-redis sends the pipeline to each node at once): the wake-up
// costs no extra round trip for it. A failed clean-up is logged, not
// returned (readers skip index entries whose record is final). A wake-up
// that never comes (the caller stopped) leaves the entries to those
// readers.
func (s *Store) wake(ctx context.Context, id string, st approval.Status) error {
	keys, args := s.wakeArgs(id, st)
	var woke, acked *redis.Cmd
	var unindex func()
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if s.replicas > 0 {
			woke = wakeScript.Eval(ctx, p, keys, args...)
			acked = p.Do(ctx, "wait", s.replicas, s.replicaWait.Milliseconds()) // same connection: WAIT covers it
		} else {
			woke = wakeScript.EvalSha(ctx, p, keys, args...) // NOSCRIPT is retried below
		}
		unindex = s.unindexIn(ctx, p, id)
		return nil
	})
	unindex()
	err := woke.Err()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = wakeScript.Run(ctx, s.rdb, keys, args...).Err() // loads it
	}
	if err != nil {
		return fmt.Errorf("wake %s: %w", id, err)
	}
	if acked == nil {
		return nil
	}
	if pushed, _ := woke.Int64(); pushed == 0 {
		// Recorded on a primary this connection no longer reaches (a
		// failover since): a WAIT here would vouch for a decision that is
		// not here. The caller records it again.
		return fmt.Errorf("wake %s: the record is not %s on the primary reached now (a failover since it was recorded): %w", id, st, ErrNotReplicated)
	}
	n, err := acked.Int64()
	if err != nil {
		return fmt.Errorf("wake %s: WAIT: %w", id, err)
	}
	if n < int64(s.replicas) {
		return fmt.Errorf("wake %s: %d of %d replicas within %v: %w", id, n, s.replicas, s.replicaWait, ErrNotReplicated)
	}
	return nil
}

// wakeArgs are wakeScript's keys and arguments for request id, final
// with status st.
func (s *Store) wakeArgs(id string, st approval.Status) ([]string, []any) {
	check := "0"
	if s.replicas > 0 {
		check = "1"
	}
	return []string{s.k.wake(id), s.k.request(id)}, []any{string(st), int64(wakeTTL / time.Second), check, s.k.channel(id)}
}

// unindexIn queues in p the removal of request id, final, from the
// pending and deadline indexes; the function it returns, called once p
// ran, logs a failure (readers skip index entries whose record is final).
func (s *Store) unindexIn(ctx context.Context, p redis.Pipeliner, id string) func() {
	cmds := [2]*redis.IntCmd{p.ZRem(ctx, s.k.pending(), id), p.ZRem(ctx, s.k.deadlines(), id)}
	return func() {
		for _, c := range cmds {
			if err := c.Err(); err != nil {
				s.log.WarnContext(ctx, "store: unindex request", "request_id", id, "err", err)
				return
			}
		}
	}
}

// wakeAfter queues in p, behind an audit append whose op id is op (the
// head key head), the wake-up of request id, final with status st, and
// the clean-up of its indexes: the wake-up is pushed only if that append
// wrote the head (wakeScript, KEYS[3]). It reports, once p ran, whether
// the wake-up was pushed. Only on a single node without WaitReplicas
// (wakesWith): on a Cluster the head and the request are in different
// slots, and a WAIT must follow the wake-up on its connection.
func (s *Store) wakeAfter(ctx context.Context, p redis.Pipeliner, head, op, id string, st approval.Status) func() bool {
	return s.wakeBehind(ctx, p, head, op, id, st, true)
}

// wakeBehind is wakeAfter; without unindex the indexes are left alone (a
// decision's script cleaned them up: Audit.DecideAppendWake).
func (s *Store) wakeBehind(ctx context.Context, p redis.Pipeliner, head, op, id string, st approval.Status, unindex bool) func() bool {
	keys, args := s.wakeArgs(id, st)
	woke := wakeScript.EvalSha(ctx, p, append(keys, head), append(args, op)...)
	unindexed := func() {}
	if unindex {
		unindexed = s.unindexIn(ctx, p, id)
	}
	return func() bool {
		unindexed()
		n, err := woke.Int64()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			_ = wakeScript.Load(ctx, s.rdb).Err() // for the next one; this one is the caller's
		}
		return err == nil && n == 1
	}
}

// wakesWith reports whether wake-ups can ride with audit appends
// (wakeAfter): a single node (or Sentinel's primary) and no WAIT.
func (s *Store) wakesWith() bool {
	_, cluster := s.rdb.(*redis.ClusterClient)
	return !cluster && s.replicas == 0
}

// retire sets the retention TTL on a record nothing more can happen to.
// It is housekeeping after the transition: a failure is logged and the
// record simply stays.
func (s *Store) retire(ctx context.Context, id string) {
	if s.retain < 0 {
		return
	}
	if err := s.rdb.Expire(ctx, s.k.request(id), s.retain).Err(); err != nil {
		s.log.WarnContext(ctx, "store: set record retention", "request_id", id, "err", err)
	}
}
