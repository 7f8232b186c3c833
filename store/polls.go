package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Polls counts the long polls begun on each request, for every process of
// the deployment (agent/api.Polls): the API withdraws the request of a
// caller that went away unless a poll of it began since, and the caller
// may come back through any replica. Get it from Store.Polls.
type Polls struct {
	s *Store
}

// PollCountTTL is how long a request's poll count is kept after its last
// poll began: far longer than a poll and a grace period.
const PollCountTTL = time.Hour

// Polls returns the deployment's poll counts.
func (s *Store) Polls() *Polls { return &Polls{s: s} }

// polls is the count of long polls begun on request id.
func (k keys) polls(id string) string { return k.prefix + ":polls:{" + id + "}" }

// Begin counts one more poll of request id and returns the count; the
// count is kept PollCountTTL from now.
func (p *Polls) Begin(ctx context.Context, id string) (int64, error) {
	var incr *redis.IntCmd
	_, err := p.s.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		incr = tx.Incr(ctx, p.s.k.polls(id))
		tx.PExpire(ctx, p.s.k.polls(id), PollCountTTL)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count a poll of %s: %w", id, err)
	}
	return incr.Val(), nil
}

// Count returns how many polls of request id have begun: 0 for none, or
// when the count expired.
func (p *Polls) Count(ctx context.Context, id string) (int64, error) {
	n, err := p.s.rdb.Get(ctx, p.s.k.polls(id)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the poll count of %s: %w", id, err)
	}
	return n, nil
}
