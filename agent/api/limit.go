package api

import (
	"context"
	"sync"
	"time"
)

// Limiter spends one call of an API key's budget (*store.Limiter: one
// budget per key shared by every process of the deployment).
type Limiter interface {
	// Take spends one call of the key named key, whose budget is
	// perMinute calls a minute (refilled continuously, a burst of
	// perMinute). ok false means none is left: wait is how long until
	// one is. An error means the budget could not be read; the API then
	// refuses the call (fails closed).
	Take(ctx context.Context, key string, perMinute int) (wait time.Duration, ok bool, err error)
}

// localLimiter is the Limiter of one process, used when Options.Limiter
// is nil: each process has its own budget per key.
type localLimiter struct {
	now func() time.Time

	mu      sync.Mutex // guards buckets
	buckets map[string]*bucket
}

var _ Limiter = (*localLimiter)(nil)

func newLocalLimiter(now func() time.Time) *localLimiter {
	return &localLimiter{now: now, buckets: map[string]*bucket{}}
}

// bucket is a token bucket: tokens left at last.
type bucket struct {
	tokens float64
	last   time.Time
}

// Take implements Limiter; it never fails.
func (l *localLimiter) Take(_ context.Context, key string, perMinute int) (time.Duration, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, now := float64(perMinute), l.now()
	b := l.buckets[key]
	if b == nil {
		b = &bucket{tokens: n, last: now}
		l.buckets[key] = b
	}
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(n, b.tokens+el.Seconds()*n/time.Minute.Seconds())
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true, nil
	}
	need := (1 - b.tokens) * time.Minute.Seconds() / n
	return time.Duration(need * float64(time.Second)), false, nil
}
