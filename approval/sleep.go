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
