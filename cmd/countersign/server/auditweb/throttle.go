package auditweb

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Failed logins are throttled per source (the request's remote host; the
// view trusts no X-Forwarded-For): after MaxLoginFailures wrong
// credentials within LoginWindow the source is answered 429, with
// Retry-After, for FirstLockout; each further lockout of the same source
// doubles it, up to MaxLockout. While a source is locked out nothing it
// sends is checked, right credentials included, so guessing gains nothing
// from the answers. A request without credentials (a browser's first,
// before it asks for them) is not a failure; a right login clears its
// source's record.
const (
	MaxLoginFailures = 5
	LoginWindow      = time.Minute
	FirstLockout     = time.Minute
	MaxLockout       = time.Hour
	// maxLoginSources bounds the sources remembered at once. When that
	// many are remembered, stale ones are forgotten first; failures from
	// sources that still find no room count under one shared source,
	// loginOverflow, so a sender with many addresses cannot grow the map.
	maxLoginSources = 10000
	loginOverflow   = "other sources"
)

// loginThrottle counts failed logins per source.
type loginThrottle struct {
	now func() time.Time

	mu      sync.Mutex // guards sources and swept
	sources map[string]*loginFailures
	swept   time.Time // when sweep last ran: at most once per LoginWindow
}

// loginFailures is one source's record.
type loginFailures struct {
	failures int       // within the window that began at since
	since    time.Time // the first failure of the window
	lockouts int       // lockouts so far; the next lasts FirstLockout << lockouts
	until    time.Time // the end of the current lockout
}

func newLoginThrottle(now func() time.Time) *loginThrottle {
	return &loginThrottle{now: now, sources: map[string]*loginFailures{}}
}

// loginSource is where r comes from: its remote host.
func loginSource(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// locked tells how long source is still locked out (0: it is not).
func (t *loginThrottle) locked(source string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.sources[source]
	if f == nil {
		f = t.sources[loginOverflow]
		if f == nil || len(t.sources) < maxLoginSources {
			return 0
		}
	}
	return max(f.until.Sub(t.now()), 0)
}

// succeeded forgets source's failures.
func (t *loginThrottle) succeeded(source string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sources, source)
}

// failed counts a failed login of source; it reports the lockout it
// starts, 0 for none.
func (t *loginThrottle) failed(source string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	f := t.sources[source]
	if f == nil {
		if len(t.sources) >= maxLoginSources && now.Sub(t.swept) >= LoginWindow {
			t.sweep(now)
			t.swept = now
		}
		if len(t.sources) >= maxLoginSources {
			source = loginOverflow
		}
		if f = t.sources[source]; f == nil {
			f = &loginFailures{}
			t.sources[source] = f
		}
	}
	if now.Sub(f.since) >= LoginWindow {
		f.failures, f.since = 0, now
	}
	f.failures++
	if f.failures < MaxLoginFailures {
		return 0
	}
	d := min(FirstLockout<<min(f.lockouts, 30), MaxLockout)
	f.failures, f.lockouts, f.until = 0, f.lockouts+1, now.Add(d)
	return d
}

// sweep forgets the sources that are not locked out and whose last
// lockout ended, and whose window began, more than MaxLockout ago: their
// next failure starts afresh.
func (t *loginThrottle) sweep(now time.Time) {
	for s, f := range t.sources {
		if now.Sub(f.until) > MaxLockout && now.Sub(f.since) > MaxLockout {
			delete(t.sources, s)
		}
	}
}

// size is how many sources are remembered.
func (t *loginThrottle) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sources)
}
