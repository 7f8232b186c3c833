package api

import (
	"sync"
	"time"
)

// limiter is a token bucket: n calls per period, refilled continuously,
// with a burst of n. It reads time from an injected clock.
type limiter struct {
	n      float64
	period time.Duration
	now    func() time.Time

	mu     sync.Mutex // guards tokens and last
	tokens float64
	last   time.Time
}

func newLimiter(n int, period time.Duration, now func() time.Time) *limiter {
	return &limiter{n: float64(n), period: period, now: now, tokens: float64(n), last: now()}
}

// take spends one token; when none is left it reports how long until one
// is.
func (l *limiter) take() (wait time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(l.n, l.tokens+el.Seconds()*l.n/l.period.Seconds())
		l.last = now
	}
	if l.tokens >= 1 {
		l.tokens--
		return 0, true
	}
	need := (1 - l.tokens) * l.period.Seconds() / l.n
	return time.Duration(need * float64(time.Second)), false
}
