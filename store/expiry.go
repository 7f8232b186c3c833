package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// RecordExpiries expires every pending request whose deadline is at or
// before now and returns those this call expired, without waking their
// waiters: the lifecycle owner (approval.Lifecycle.ExpireDue) audits each
// expiry, then pushes its wake-up with Wake. Each request is expired by
// one script that checks it is still pending and due, so any number of
// processes may call it at once: each expiry is returned by exactly one
// call. An expired request has Status approval.StatusExpired and a
// Decision{Verdict: expire, Approver: "system", At: now}. A review-after
// request (approval.ModeAfter) whose cancel window ended is approved
// instead, with Decision{Verdict: window_elapsed}: the same script decides
// between a cancel and the window's end, so exactly one wins.
//
// It walks the deadline index in pages; entries whose request is already
// final or gone are removed from the index on the way.
func (s *Store) RecordExpiries(ctx context.Context, now time.Time) ([]*approval.Request, error) {
	now = now.UTC()
	max := strconv.FormatInt(now.UnixMilli(), 10)
	var (
		out    []*approval.Request
		offset int64
	)
	for {
		ids, err := s.rdb.ZRangeByScore(ctx, s.k.deadlines(), &redis.ZRangeBy{
			Min: "-inf", Max: max, Offset: offset, Count: int64(s.page),
		}).Result()
		if err != nil {
			return out, fmt.Errorf("expire due: %w", err)
		}
		for _, id := range ids {
			r, err := s.expire(ctx, id, now)
			if r != nil {
				out = append(out, r)
			}
			switch {
			case err != nil:
				return out, fmt.Errorf("expire due: %w", err)
			case r != nil:
			default:
				// not removed from the index: skip it in the next page
				offset++
			}
		}
		if len(ids) < s.page {
			abandoned, err := s.recordAbandons(ctx, now)
			return append(out, abandoned...), err
		}
	}
}

// expire expires one request if it is pending and due, without waking its
// waiters. It returns the request when this call expired it, nil when it
// was not due, or already final or gone (then it is dropped from the
// indexes). An error with a request means it was expired but not dropped
// from the indexes.
func (s *Store) expire(ctx context.Context, id string, now time.Time) (*approval.Request, error) {
	dec, err := json.Marshal(expiryDecision(id, now))
	if err != nil {
		return nil, fmt.Errorf("expire %s: %w", id, err)
	}
	elapse, err := json.Marshal(elapseDecision(id, now))
	if err != nil {
		return nil, fmt.Errorf("expire %s: %w", id, err)
	}
	rep, err := run(ctx, s.rdb, closeScript, []string{s.k.request(id), s.k.wake(id)},
		"expire", now.UnixMilli(), dec, int64(wakeTTL/time.Second), "1", elapse, newOp(), s.k.channel(id))
	if err != nil {
		return nil, fmt.Errorf("expire %s: %w", id, err)
	}
	switch rep.code {
	case codeOK:
		r, err := rep.record()
		if rep.status() != string(approval.StatusApproved) {
			s.retire(ctx, id) // an elapsed cancel window is approved: it runs next
		}
		if err != nil {
			// Waiters must still learn that the request is final.
			if werr := s.Wake(ctx, id, approval.StatusExpired); werr != nil {
				s.log.WarnContext(ctx, "store: wake after expiry", "request_id", id, "err", werr)
			}
			_ = s.unindex(ctx, id)
			return nil, fmt.Errorf("expire %s: %w", id, err)
		}
		s.awaitClaim(ctx, r) // an elapsed cancel window is approved: someone must claim it
		// An index entry left behind would be visited again by this call.
		return r, s.unindex(ctx, id)
	case codeDecided, codeNotFound:
		return nil, s.unindex(ctx, id)
	case codeNotDue:
		return nil, nil
	}
	return nil, fmt.Errorf("expire %s: unexpected script reply %q", id, rep.code)
}
