package auditweb

import (
	"container/list"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Failed logins are throttled on failures only, so the right credentials
// from a source that has not failed are always checked (and let in):
//
//   - Per source. A source is the address a request came from
//     (loginSource: the connection's peer, or, when the peer is one of
//     Options.TrustedProxies, the address X-Forwarded-For names before
//     them; an IPv6 address counts by its /64). A source's
//     MaxLoginFailures-th wrong credentials within LoginWindow lock it out
//     for FirstLockout; each further lockout of it doubles, up to
//     MaxLockout. While a source waits nothing it sends is checked, right
//     credentials included, so guessing gains nothing from the answers. A
//     request without credentials (a browser's first) is no failure; a
//     right login forgets the source.
//   - Per user. The view has one login (its token, or its user and
//     password), so every failure counts against it: when
//     MaxUserFailures fail within LoginWindow, from any sources, the
//     login is under attack until UserLockout after the latest failure
//     that kept the count there. Then each failure also makes its source
//     wait before its next try: UserBackoff after its first failure,
//     doubling with each, up to MaxLockout — a few guesses an hour per
//     address — while a source that has not failed is still checked at
//     once: the right password from a new address is never refused, and
//     one typo during an attack costs UserBackoff. (A lockout that refused
//     every source would let anyone lock the operators out of their own
//     view.)
//   - Bounded. At most maxLoginSources sources are remembered, each for
//     at most forgetAfter after its last failure; when that many are
//     remembered, the one whose last failure is oldest is forgotten to
//     make room. A sender with more addresses than that can make its own
//     addresses new again, never lock out an address that did not fail.
const (
	MaxLoginFailures = 5
	LoginWindow      = time.Minute
	FirstLockout     = time.Minute
	MaxLockout       = time.Hour
	MaxUserFailures  = 20
	UserLockout      = 15 * time.Minute
	UserBackoff      = 5 * time.Second
	// maxLoginSources bounds the sources remembered at once.
	maxLoginSources = 10000
	// forgetAfter is how long a source is remembered after its last
	// failure: its lockout (at most MaxLockout) ended at least MaxLockout
	// before, so its next failure may start afresh.
	forgetAfter = 2 * MaxLockout
)

// loginThrottle counts failed logins per source and for the view's login.
type loginThrottle struct {
	now func() time.Time
	log *slog.Logger
	max int // sources remembered at most: maxLoginSources (tests lower it)

	mu      sync.Mutex               // guards the fields below
	sources map[string]*list.Element // each source's element of order
	order   *list.List               // of *sourceFailures, oldest last failure first
	// The login's failures from every source within the window that
	// began at since, and the end of the attack they started.
	userFailures int
	userSince    time.Time
	userUntil    time.Time
}

// sourceFailures is one source's record.
type sourceFailures struct {
	source   string
	failures int       // within the window that began at since
	since    time.Time // the first failure of the window
	strikes  int       // failures since the source was remembered
	lockouts int       // per-source lockouts so far; the next lasts FirstLockout doubled this often
	until    time.Time // nothing from the source is checked before then
	last     time.Time // its latest failure
}

func newLoginThrottle(now func() time.Time, log *slog.Logger) *loginThrottle {
	return &loginThrottle{now: now, log: log, max: maxLoginSources, sources: map[string]*list.Element{}, order: list.New()}
}

// doubled is first doubled n times, at most MaxLockout (without
// overflowing, however large n is).
func doubled(first time.Duration, n int) time.Duration {
	d := first
	for ; n > 0 && d < MaxLockout; n-- {
		d *= 2
	}
	return min(d, MaxLockout)
}

// wait tells how long source must still wait before what it sends is
// checked (0: it need not). A source that has not failed never waits.
func (t *loginThrottle) wait(source string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.sources[source]
	if e == nil {
		return 0
	}
	return max(e.Value.(*sourceFailures).until.Sub(t.now()), 0)
}

// succeeded forgets source's failures.
func (t *loginThrottle) succeeded(source string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.sources[source]; e != nil {
		t.order.Remove(e)
		delete(t.sources, source)
	}
}

// failed counts a failed login of source; it reports the per-source
// lockout it starts (0 for none), which the failing request is answered
// with. A wait it sets because the login is under attack starts with the
// source's next request.
func (t *loginThrottle) failed(source string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	f := t.remember(now, source)
	f.last = now
	f.strikes++

	if now.Sub(t.userSince) >= LoginWindow {
		t.userFailures, t.userSince = 0, now
	}
	t.userFailures++
	if t.userFailures >= MaxUserFailures {
		if t.userFailures == MaxUserFailures { // once a window
			t.log.Warn("audit view: many failed logins; each failing source now waits before its next try",
				"failures", t.userFailures, "within", LoginWindow, "sources_remembered", len(t.sources))
		}
		t.userUntil = now.Add(UserLockout)
	}
	attack := now.Before(t.userUntil)
	if attack {
		f.until = later(f.until, now.Add(doubled(UserBackoff, f.strikes-1)))
	}

	if now.Sub(f.since) >= LoginWindow {
		f.failures, f.since = 0, now
	}
	f.failures++
	if f.failures < MaxLoginFailures {
		return 0
	}
	d := doubled(FirstLockout, f.lockouts)
	f.failures, f.lockouts = 0, f.lockouts+1
	f.until = later(f.until, now.Add(d))
	if !attack { // under attack the line above says it, once a window
		t.log.Warn("audit view: failed logins throttled", "source", source, "lockout", d)
	}
	return d
}

// remember returns source's record, made the newest: a new one when it
// has none (after forgetting the records past forgetAfter and, with no
// room left, the oldest), a fresh one when its last failure is
// forgetAfter old. t.mu must be held.
func (t *loginThrottle) remember(now time.Time, source string) *sourceFailures {
	if e := t.sources[source]; e != nil {
		t.order.MoveToBack(e)
		f := e.Value.(*sourceFailures)
		if now.Sub(f.last) >= forgetAfter {
			*f = sourceFailures{source: source}
		}
		return f
	}
	for e := t.order.Front(); e != nil; e = t.order.Front() {
		f := e.Value.(*sourceFailures)
		if len(t.sources) < t.max && now.Sub(f.last) < forgetAfter {
			break
		}
		t.order.Remove(e)
		delete(t.sources, f.source)
	}
	f := &sourceFailures{source: source}
	t.sources[source] = t.order.PushBack(f)
	return f
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// size is how many sources are remembered.
func (t *loginThrottle) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sources)
}

// loginSource is where r comes from, as failed logins are counted: the
// connection's peer; when the peer is a trusted proxy, the nearest
// address X-Forwarded-For names that is not one (the proxies append the
// address they saw, so what the client wrote before is never read; an
// entry that is no address ends the walk at the proxy after it). An IPv4
// address is itself, an IPv6 address its /64 (one host often has a whole
// /64).
func loginSource(r *http.Request, trusted []netip.Prefix) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return clip.Bytes(host, approval.MaxField) // not an IP connection
	}
	addr = addr.Unmap().WithZone("")
	if !trustedAddr(addr, trusted) {
		return sourceKey(addr)
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		rest := hops[i]
		for rest != "" {
			var hop string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				rest, hop = rest[:j], rest[j+1:]
			} else {
				rest, hop = "", rest
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				continue
			}
			a, ok := parseHop(hop)
			if !ok {
				return sourceKey(addr)
			}
			if !trustedAddr(a, trusted) {
				return sourceKey(a)
			}
			addr = a
		}
	}
	return sourceKey(addr) // every hop a proxy: the first of them
}

// parseHop reads one X-Forwarded-For entry: an address, or an address
// and port as some proxies write.
func parseHop(hop string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(hop)
	if err != nil {
		ap, err := netip.ParseAddrPort(hop)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), true
}

func trustedAddr(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// sourceKey names a source: an IPv4 address, or an IPv6 address's /64.
func sourceKey(a netip.Addr) string {
	if a.Is4() {
		return a.String()
	}
	p, err := a.Prefix(64)
	if err != nil {
		return a.String()
	}
	return p.String()
}

// ParseTrustedProxies reads the trusted proxies setting
// (COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES): addresses and CIDR prefixes
// separated by commas. A prefix of every address (0.0.0.0/0, ::/0) is
// refused: anyone could then name their own source.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(f, "/") {
			p, err = netip.ParsePrefix(f)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(f)
			a = a.WithZone("")
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address or a CIDR prefix (such as 10.0.0.5 or 10.0.0.0/8)", f)
		}
		p = p.Masked()
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%q trusts every address: anyone could then choose their source with X-Forwarded-For", f)
		}
		out = append(out, p)
	}
	return out, nil
}
