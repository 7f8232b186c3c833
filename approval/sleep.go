package approval

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
