// Package clock holds the real-time defaults of the waits code takes
// injected (a sleep function, a ticker): production passes these, tests
// pass approval/clocktest's clock or a channel they drive. It is time's
// adapter, not the domain: the domain package approval holds no helpers.
package clock

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done (then it returns ctx.Err()). It is
// the one cancellable wait between retries; code under test takes a clock
// or a sleep function instead, defaulting to this.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// NewTicker is the default of every injected ticker (tests pass a channel
// they drive): a time.Ticker's channel and its Stop.
func NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}
