package bot

// This file: Slack's rate limits as its Retry-After answers told them,
// shared by every call of the process (slackcall.go).

import (
	"sync"
	"time"
)

// rateLimits remembers, per limit key, until when Slack asked this app to
// hold back (Retry-After), for every goroutine of the process.
type rateLimits struct {
	mu    sync.Mutex // guards until
	until map[string]time.Time
}

// delay is how long a call under key must still wait at now.
func (l *rateLimits) delay(key string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.until[key]
	if !ok {
		return 0
	}
	if !now.Before(t) {
		delete(l.until, key)
		return 0
	}
	return t.Sub(now)
}

// hold makes calls under key wait until t (never shortening a hold).
func (l *rateLimits) hold(key string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.until[key]; !ok || t.After(cur) {
		l.until[key] = t
	}
}
