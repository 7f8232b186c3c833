package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// Two looks under the records that the domain's tests need and no
// production path does: what was pushed to a request's wake list, and a
// request lost as Redis loses its data. They are functions of the
// package, not methods of Store, so a type embedding *Store (the domain's
// test double, approval/approvaltest) gains nothing from them; they live
// here because only this package knows the keys (keys.go).

// WakeUps returns the wake-ups pushed for request id and still in its wake
// list (a waiter takes the newest), oldest first: the status of each
// final transition, as Wake and the transition scripts push them.
func WakeUps(ctx context.Context, s *Store, id string) ([]approval.Status, error) {
	vals, err := s.rdb.LRange(ctx, s.k.wake(id), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("wake-ups of %s: %w", id, err)
	}
	out := make([]approval.Status, 0, len(vals))
	for _, v := range vals {
		out = append(out, approval.Status(v))
	}
	slices.Reverse(out) // LPUSH: the newest is first in the list
	return out, nil
}

// ForgetRequest drops request id as a Redis that lost its data (restarted
// without persistence) has: its record, wake list and poll count, and its
// entries in the pending, deadline, claim-window, grant and requester
// indexes. From then on it is approval.ErrNotFound to every method. A
// grant it made stays in force under its scope, as the grant's own key is
// not the request's.
func ForgetRequest(ctx context.Context, s *Store, id string) error {
	requester := ""
	switch r, err := s.Request(ctx, id); {
	case err == nil:
		requester = r.Requester
	case !errors.Is(err, approval.ErrNotFound):
		return fmt.Errorf("forget %s: %w", id, err)
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, s.k.request(id), s.k.wake(id), s.k.polls(id)) // one slot: the id is their hash tag
		for _, k := range []string{s.k.pending(), s.k.deadlines(), s.k.claims(), s.k.grants()} {
			p.ZRem(ctx, k, id)
		}
		if requester != "" {
			p.ZRem(ctx, s.k.recent(requester), id)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("forget %s: %w", id, err)
	}
	return nil
}
