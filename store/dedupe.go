package store

import (
	"context"
	"fmt"
	"time"
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

// FirstSeen reports whether this is the first time any process sees
// eventID (SET NX), remembering it for ttl, at least MinEventTTL. Callers
// drop an event when it returns false.
func (s *Store) FirstSeen(ctx context.Context, eventID string, ttl time.Duration) (bool, error) {
	ttl = max(ttl, MinEventTTL)
	ok, err := s.rdb.SetNX(ctx, s.k.event(eventID), 1, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("first seen %s: %w", eventID, err)
	}
	return ok, nil
}
