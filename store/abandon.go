package store

// This file: the claim window. An approved request of an outside caller
// (approval.Request.ClaimWindow > 0) is indexed by the end of its claim
// window when it is approved; the expiry sweep (RecordExpiries) abandons
// every one still approved at that time, once across processes.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// awaitClaim indexes r, just approved, by the end of its claim window,
// when it has one. The approval is recorded already: a failure is logged,
// and the request then simply waits for a claim without ever being
// abandoned.
func (s *Store) awaitClaim(ctx context.Context, r *approval.Request) {
	if r == nil || r.Status != approval.StatusApproved || r.ClaimWindow <= 0 {
		return
	}
	at := s.now()
	if d := r.Decision; d != nil && !d.At.IsZero() {
		at = d.At
	}
	end := at.Add(r.ClaimWindow)
	if err := s.rdb.ZAdd(ctx, s.k.claims(), redis.Z{Score: float64(end.UnixMilli()), Member: r.ID}).Err(); err != nil {
		s.log.WarnContext(ctx, "store: index the claim window; the request will not be abandoned", "request_id", r.ID, "err", err)
	}
}

// abandonScript ends an approved request that nobody claimed within its
// claim window: status abandoned, the approval kept (who approved, when).
// A request claimed, or otherwise no longer approved, is left as it is.
//
//	KEYS[1]   record
//	ARGV[1]   now (unix ms)
//	ARGV[2]   the op id (luaOp)
//
// Reply: {ok, record} abandoned now; {claimed, record} not approved any
// more; {not_found}.
var abandonScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[2]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status ~= 'approved' then return {'claimed', redis.call('HGETALL', rec)} end
redis.call('HSET', rec, 'status', 'abandoned', 'abandoned_at', ARGV[1])
redis.call('HINCRBY', rec, 'rev', 1)
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// recordAbandons abandons every request of the claim-window index due at
// now that is still approved, and returns those this call abandoned (each
// exactly once across processes: the script checks and sets the status in
// one step, so a claim and the window's end race atomically). Entries of
// requests claimed or gone are dropped from the index on the way.
func (s *Store) recordAbandons(ctx context.Context, now time.Time) ([]*approval.Request, error) {
	max := strconv.FormatInt(now.UnixMilli(), 10)
	var out []*approval.Request
	for {
		ids, err := s.rdb.ZRangeByScore(ctx, s.k.claims(), &redis.ZRangeBy{Min: "-inf", Max: max, Count: int64(s.page)}).Result()
		if err != nil {
			return out, fmt.Errorf("abandon due: %w", err)
		}
		for _, id := range ids {
			what := "abandon " + id
			code, r, err := s.transition(ctx, what, abandonScript, []string{s.k.request(id)}, now.UnixMilli(), newOp())
			switch {
			case err != nil && code != codeNotFound:
				return out, err
			case code == codeOK:
				s.retire(ctx, id)
				out = append(out, r)
			case code == codeNotFound, code == codeClaimed:
			default:
				return out, unexpectedReply(what, code)
			}
			// Removed before the next page is read: it would be read again.
			if err := s.rdb.ZRem(ctx, s.k.claims(), id).Err(); err != nil {
				return out, fmt.Errorf("abandon due: unindex %s: %w", id, err)
			}
		}
		if len(ids) < s.page {
			return out, nil
		}
	}
}
