package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
)

// This file: what step-up votes keep (approval/stepup.go): one-time links,
// the confirmations still fresh, the registration ceremonies under way
// and each user's passkeys. Every key has one owner and no script: each
// operation is one command (a link is used by GETDEL, so two pages can
// never both take it).

var _ approval.StepUps = (*Store)(nil)

// SaveStepUpLink keeps link under key (the SHA-256 of its token) until
// link.Expires.
func (s *Store) SaveStepUpLink(ctx context.Context, key string, link approval.StepUpLink) error {
	ttl := link.Expires.Sub(s.now())
	if ttl <= 0 {
		return fmt.Errorf("save step-up link: expires %s, already past", link.Expires.Format(time.RFC3339))
	}
	b, err := json.Marshal(link)
	if err != nil {
		return fmt.Errorf("save step-up link: %w", err)
	}
	if err := s.rdb.Set(ctx, s.k.stepUpLink(key), b, ttl).Err(); err != nil {
		return fmt.Errorf("save step-up link: %w", err)
	}
	return nil
}

// StepUpLink reads a link without using it; approval.ErrNotFound when
// used, expired or unknown.
func (s *Store) StepUpLink(ctx context.Context, key string) (approval.StepUpLink, error) {
	return s.readLink(ctx, s.rdb.Get(ctx, s.k.stepUpLink(key)))
}

// TakeStepUpLink reads and deletes a link in one command (GETDEL);
// approval.ErrNotFound when used, expired or unknown.
func (s *Store) TakeStepUpLink(ctx context.Context, key string) (approval.StepUpLink, error) {
	return s.readLink(ctx, s.rdb.GetDel(ctx, s.k.stepUpLink(key)))
}

func (s *Store) readLink(_ context.Context, cmd *redis.StringCmd) (approval.StepUpLink, error) {
	b, err := cmd.Bytes()
	if errors.Is(err, redis.Nil) {
		return approval.StepUpLink{}, approval.ErrNotFound
	}
	if err != nil {
		return approval.StepUpLink{}, fmt.Errorf("read step-up link: %w", err)
	}
	var link approval.StepUpLink
	if err := json.Unmarshal(b, &link); err != nil {
		return approval.StepUpLink{}, fmt.Errorf("read step-up link: %w", err)
	}
	return link, nil
}

// NoteStepUp remembers until when user's confirmation covers further
// votes.
func (s *Store) NoteStepUp(ctx context.Context, user string, until time.Time) error {
	ttl := until.Sub(s.now())
	if ttl <= 0 {
		return nil
	}
	return s.rdb.Set(ctx, s.k.stepUpFresh(user), until.UnixMilli(), ttl).Err()
}

// SteppedUp returns until when user's last confirmation covers further
// votes; the zero time when none does.
func (s *Store) SteppedUp(ctx context.Context, user string) (time.Time, error) {
	v, err := s.rdb.Get(ctx, s.k.stepUpFresh(user)).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("step-up freshness of %s: %w", user, err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("step-up freshness of %s: %w", user, err)
	}
	return time.UnixMilli(ms), nil
}

// SaveStepUpSession keeps a registration ceremony's state under key for
// ttl.
func (s *Store) SaveStepUpSession(ctx context.Context, key string, data []byte, ttl time.Duration) error {
	return s.rdb.Set(ctx, s.k.stepUpSession(key), data, ttl).Err()
}

// TakeStepUpSession reads and deletes a ceremony's state;
// approval.ErrNotFound when there is none.
func (s *Store) TakeStepUpSession(ctx context.Context, key string) ([]byte, error) {
	b, err := s.rdb.GetDel(ctx, s.k.stepUpSession(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, approval.ErrNotFound
	}
	return b, err
}

// AddPasskey keeps user's passkey id (data is the passkey as the step-up
// page encodes it).
func (s *Store) AddPasskey(ctx context.Context, user, id string, data []byte) error {
	return s.rdb.HSet(ctx, s.k.passkeys(user), id, data).Err()
}

// Passkeys returns user's passkeys by id, in id order.
func (s *Store) Passkeys(ctx context.Context, user string) ([][]byte, error) {
	m, err := s.rdb.HGetAll(ctx, s.k.passkeys(user)).Result()
	if err != nil {
		return nil, fmt.Errorf("passkeys of %s: %w", user, err)
	}
	var out [][]byte
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, []byte(m[id]))
	}
	return out, nil
}

// RemovePasskey removes user's passkey id; false when there was none.
func (s *Store) RemovePasskey(ctx context.Context, user, id string) (bool, error) {
	n, err := s.rdb.HDel(ctx, s.k.passkeys(user), id).Result()
	return n > 0, err
}
