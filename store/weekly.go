package store

import (
	"context"
	"fmt"
	"time"
)

// weeklyRetain is how long a week's summary claim is kept: past the week
// after the one it names, when no process asks for it any more.
const weeklyRetain = 15 * 24 * time.Hour

func (k keys) weekly(week string) string { return k.prefix + ":weekly:" + week }

// ClaimWeek claims the ops summary of week ("2026-W49") for this process
// (weekly.Claims): SET NX, so of every process that asks exactly one gets
// true. The claim expires after two weeks and a day.
func (s *Store) ClaimWeek(ctx context.Context, week string) (bool, error) {
	ok, err := s.rdb.SetNX(ctx, s.k.weekly(week), s.now().UTC().Format(time.RFC3339), weeklyRetain).Result()
	if err != nil {
		return false, fmt.Errorf("claim the weekly summary of %s: %w", week, err)
	}
	return ok, nil
}
