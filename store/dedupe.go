package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MinEventTTL is the shortest time FirstSeen remembers an event: Slack
// retries an event for about five minutes.
const MinEventTTL = 10 * time.Minute

// Remember records that requester's call of tool with arguments digest was
// approved, so an identical call may skip the human for ttl (ask-once). A
// ttl of zero or less remembers nothing.
func (s *Store) Remember(ctx context.Context, requester, tool, digest string, ttl time.Duration) error {
	if ttl <= 0 {
		return nil
	}
	if err := s.rdb.Set(ctx, s.k.remember(requester, tool, digest), 1, ttl).Err(); err != nil {
		return fmt.Errorf("remember %s %s: %w", requester, tool, err)
	}
	return nil
}

// Remembered reports whether Remember recorded this call and its ttl has not
// passed.
func (s *Store) Remembered(ctx context.Context, requester, tool, digest string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.k.remember(requester, tool, digest)).Result()
	if err != nil {
		return false, fmt.Errorf("remembered %s %s: %w", requester, tool, err)
	}
	return n == 1, nil
}

// firstSeenScript is SET NX that a second run of the same call answers
// like the first: the key holds the op id of the call that set it.
//
//	KEYS[1]   event key
//	ARGV[1]   the op id of this call
//	ARGV[2]   TTL (ms)
//
// Reply: 1 first, 0 seen.
var firstSeenScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == ARGV[1] then return 1 end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// FirstSeen reports whether this is the first time any process sees
// eventID, remembering it for ttl, at least MinEventTTL. Callers drop an
// event when it returns false. A run of the script that go-redis repeats
// after a read timeout answers like the first run (luaOp), so an event is
// not dropped as a duplicate of itself.
func (s *Store) FirstSeen(ctx context.Context, eventID string, ttl time.Duration) (bool, error) {
	ttl = max(ttl, MinEventTTL)
	n, err := firstSeenScript.Run(ctx, s.rdb, []string{s.k.event(eventID)}, newOp(), ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("first seen %s: %w", eventID, err)
	}
	return n == 1, nil
}
