package auditweb_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

// login sends one request from addr with the basic-auth password pass
// ("" sends no credentials) and returns the status and Retry-After.
func login(h http.Handler, addr, pass string) (int, string) {
	return loginVia(h, addr, "", pass)
}

// loginVia is login with the X-Forwarded-For header xff ("" for none).
func loginVia(h http.Handler, addr, xff, pass string) (int, string) {
	req := httptest.NewRequest(http.MethodGet, "/audit/", nil)
	req.RemoteAddr = addr
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	if pass != "" {
		req.SetBasicAuth("ops", pass)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("Retry-After")
}

// TestAuditWebThrottlesFailedLogins: the fifth wrong password of a source
// within a minute locks it out (429 with Retry-After, right credentials
// included) for a minute, the next lockout for two, then four; another
// source's logins are unaffected; a right login clears the count; a
// request without credentials is no failure.
func TestAuditWebThrottlesFailedLogins(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: base})
	f := &fakeAudit{}
	history(f, base)
	h := newView(t, f, base, func(o *auditweb.Options) { o.Now = clock.Now })
	const mallory, alice = "198.51.100.7:4711", "203.0.113.9:5000"

	for i := range 4 {
		if code, _ := login(h, mallory, "guess"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d = %d, want 401", i+1, code)
		}
	}
	for range 10 {
		if code, _ := login(h, mallory, ""); code != http.StatusUnauthorized {
			t.Fatalf("no credentials = %d, want 401 (not counted)", code)
		}
	}
	if code, _ := login(h, mallory, "s3cret"); code != http.StatusOK {
		t.Fatalf("right password after 4 failures = %d, want 200", code)
	}
	// The right login cleared the count: four more failures still pass.
	for i := range 4 {
		if code, _ := login(h, mallory, "guess"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d after a right one = %d, want 401", i+1, code)
		}
	}

	for i, lockout := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		if i > 0 {
			for range 4 {
				login(h, mallory, "guess")
			}
		}
		code, after := login(h, mallory, "guess")
		if want := fmt.Sprint(int(lockout.Seconds())); code != http.StatusTooManyRequests || after != want {
			t.Fatalf("lockout %d: fifth failure = %d Retry-After %q, want 429 Retry-After %s", i+1, code, after, want)
		}
		clock.Advance(lockout - time.Second)
		if code, after := login(h, mallory, "s3cret"); code != http.StatusTooManyRequests || after != "1" {
			t.Fatalf("lockout %d: right password while locked out = %d Retry-After %q, want 429 Retry-After 1", i+1, code, after)
		}
		if code, _ := login(h, alice, "s3cret"); code != http.StatusOK {
			t.Fatalf("lockout %d: another source's right login = %d, want 200", i+1, code)
		}
		if code, _ := login(h, alice, "typo"); code != http.StatusUnauthorized {
			t.Fatalf("lockout %d: another source's wrong password = %d, want 401", i+1, code)
		}
		clock.Advance(time.Second)
	}
	if code, _ := login(h, mallory, "s3cret"); code != http.StatusOK {
		t.Fatalf("right password after the lockout = %d, want 200", code)
	}
}

// TestAuditWebLockoutsStayBounded: a source that keeps guessing, a day
// long, is locked out each time for at most MaxLockout and never for
// less than FirstLockout (its doubling lockout must not overflow into a
// negative one that lets it guess freely).
func TestAuditWebLockoutsStayBounded(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: base})
	h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.Now = clock.Now })
	const mallory = "198.51.100.7:4711"
	for round := range 40 {
		for i := range auditweb.MaxLoginFailures - 1 {
			if code, after := login(h, mallory, "guess"); code != http.StatusUnauthorized {
				t.Fatalf("round %d, wrong password %d = %d Retry-After %q, want 401", round+1, i+1, code, after)
			}
		}
		code, after := login(h, mallory, "guess")
		secs, _ := strconv.Atoi(after)
		lockout := time.Duration(secs) * time.Second
		if code != http.StatusTooManyRequests || lockout < auditweb.FirstLockout || lockout > auditweb.MaxLockout {
			t.Fatalf("round %d, fifth wrong password = %d Retry-After %q, want 429 for %v to %v", round+1, code, after, auditweb.FirstLockout, auditweb.MaxLockout)
		}
		clock.Advance(lockout)
	}
}

// TestAuditWebLoginFailuresForgotten: two hours after its last failure a
// source starts afresh: its next lockout is the first one's again.
func TestAuditWebLoginFailuresForgotten(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: base})
	h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.Now = clock.Now })
	const mallory = "198.51.100.7:4711"
	lockout := func() string {
		t.Helper()
		for range auditweb.MaxLoginFailures - 1 {
			login(h, mallory, "guess")
		}
		code, after := login(h, mallory, "guess")
		if code != http.StatusTooManyRequests {
			t.Fatalf("fifth wrong password = %d, want 429", code)
		}
		return after
	}
	for _, want := range []string{"60", "120", "240"} {
		if got := lockout(); got != want {
			t.Fatalf("lockout Retry-After %q, want %q", got, want)
		}
		clock.Advance(4 * time.Minute)
	}
	clock.Advance(2*auditweb.MaxLockout - 4*time.Minute)
	if got := lockout(); got != "60" {
		t.Errorf("lockout two hours after the last failure: Retry-After %q, want 60 (afresh)", got)
	}
}

// TestAuditWebLoginThrottleBounded: failures from ever new sources do not
// grow the throttle's memory past its bound.
func TestAuditWebLoginThrottleBounded(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: base})
	f := &fakeAudit{}
	h := newView(t, f, base, func(o *auditweb.Options) { o.Now = clock.Now })
	for i := range 30000 {
		login(h, fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255), "guess")
	}
	if n := auditweb.LoginSources(h); n > 10001 {
		t.Errorf("sources remembered after 30,000 = %d, want at most 10,001", n)
	}
}

// TestAuditWebLoginFloodLocksOutNobody: after one wrong login from each
// of 10,005 loopback addresses (more than the throttle remembers), all at
// one instant, the right password gets in at once from an address that
// did not fail (a new one, or 127.0.0.1, which the flood did not use),
// and from an address that failed once after at most UserBackoff. The
// flood is one warning line.
func TestAuditWebLoginFloodLocksOutNobody(t *testing.T) {
	const flood = 10005
	addr := func(i int) string { return fmt.Sprintf("127.0.%d.%d:4000", (i+2)>>8, (i+2)&255) } // from 127.0.0.2
	cases := []struct {
		name       string
		addr       string
		failedOnce bool
	}{
		{"a new address", "203.0.113.9:5000", false},
		{"127.0.0.1, which did not fail", "127.0.0.1:5000", false},
		{"the flood's last address", addr(flood - 1), true},
		{"the flood's first address", addr(0), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktest.New(clocktest.Opts{Start: base})
			logs := &warnings{}
			h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.Now, o.Logger = clock.Now, slog.New(logs) })
			for i := range flood {
				login(h, addr(i), "guess")
			}
			if got := logs.read(); len(got) > 1 {
				t.Errorf("%d wrong logins from as many addresses: %d warning lines, want at most 1", flood, len(got))
			}
			code, after := login(h, c.addr, "s3cret")
			if !c.failedOnce {
				if code != http.StatusOK {
					t.Fatalf("right password from %s after the flood = %d (Retry-After %q), want 200", c.addr, code, after)
				}
				return
			}
			if code == http.StatusOK {
				return
			}
			secs, _ := strconv.Atoi(after)
			if code != http.StatusTooManyRequests || secs < 1 || time.Duration(secs)*time.Second > auditweb.UserBackoff {
				t.Fatalf("right password from %s, which failed once = %d Retry-After %q, want 200 or 429 within %v", c.addr, code, after, auditweb.UserBackoff)
			}
			clock.Advance(time.Duration(secs) * time.Second)
			if code, after := login(h, c.addr, "s3cret"); code != http.StatusOK {
				t.Fatalf("right password from %s %ds later = %d (Retry-After %q), want 200", c.addr, secs, code, after)
			}
		})
	}
}

// warnings counts the view's warning lines.
type warnings struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (w *warnings) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler            { return w }
func (w *warnings) WithGroup(string) slog.Handler                 { return w }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, r.Message)
	return nil
}

func (w *warnings) read() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines)
}

// TestAuditWebLoginUnderAttack: when MaxUserFailures logins fail within a
// minute, from any sources, the login is under attack: each failure then
// makes its source wait (UserBackoff, doubling with each of its
// failures), while a source that has not failed, or whose failures came
// before the attack, is checked at once; UserLockout after the last
// failure the attack is over. It is logged once.
func TestAuditWebLoginUnderAttack(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: base})
	logs := &warnings{}
	h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.Now, o.Logger = clock.Now, slog.New(logs) })
	src := func(i int) string { return fmt.Sprintf("198.51.100.%d:4711", i) }
	last := src(auditweb.MaxUserFailures)
	wait := func(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) }
	once, twice := wait(auditweb.UserBackoff), wait(2*auditweb.UserBackoff)
	type attackStep struct {
		what       string
		advance    time.Duration // before the login
		addr, pass string
		code       int
		retryAfter string
	}
	var steps []attackStep
	step := func(what string, advance time.Duration, addr, pass string, code int, retryAfter string) {
		steps = append(steps, attackStep{what, advance, addr, pass, code, retryAfter})
	}
	for i := 1; i <= auditweb.MaxUserFailures; i++ {
		step("one wrong password from each of many sources", 0, src(i), "guess", http.StatusUnauthorized, "")
	}
	step("a source whose failure came before the attack, right", 0, src(1), "s3cret", http.StatusOK, "")
	step("the source whose failure started the attack, right", 0, last, "s3cret", http.StatusTooManyRequests, once)
	step("a source that never failed, right", 0, "203.0.113.9:5000", "s3cret", http.StatusOK, "")
	step("a source that failed before the attack, wrong again", 0, src(2), "guess", http.StatusUnauthorized, "")
	step("its second failure doubles its wait", 0, src(2), "s3cret", http.StatusTooManyRequests, twice)
	step("waiting, nothing it sends is checked", 0, src(2), "guess", http.StatusTooManyRequests, twice)
	step("the first wait over", auditweb.UserBackoff, last, "s3cret", http.StatusOK, "")
	step("the second not yet", 0, src(2), "s3cret", http.StatusTooManyRequests, once)
	step("the second wait over", auditweb.UserBackoff, src(2), "s3cret", http.StatusOK, "")
	step("the attack over, a wrong password", auditweb.UserLockout, src(3), "guess", http.StatusUnauthorized, "")
	step("and at once the right one", 0, src(3), "s3cret", http.StatusOK, "")
	for i, s := range steps {
		clock.Advance(s.advance)
		if code, after := login(h, s.addr, s.pass); code != s.code || after != s.retryAfter {
			t.Fatalf("step %d (%s): %s = %d Retry-After %q, want %d Retry-After %q", i+1, s.what, s.addr, code, after, s.code, s.retryAfter)
		}
	}
	if got := logs.read(); len(got) != 1 || !strings.Contains(got[0], "many failed logins") {
		t.Errorf("warnings = %q, want the attack's one", got)
	}
}

// TestAuditWebForwardedFor: X-Forwarded-For is read only from a trusted
// proxy (Options.TrustedProxies), and then only the address the proxy
// appended: behind a proxy each client counts alone, while a client
// cannot choose its source by writing the header.
func TestAuditWebForwardedFor(t *testing.T) {
	trusted, err := auditweb.ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		t.Fatalf("ParseTrustedProxies: %v", err)
	}
	const proxy, mallory = "10.0.0.1:443", "198.51.100.7:4711"
	cases := []struct {
		name     string
		wrongVia string // the peer of the wrong logins
		wrongXFF func(i int) string
		rightVia string // the peer of the right login that follows
		rightXFF string
		want     int
	}{
		{"X-Forwarded-For from an untrusted peer is ignored", mallory, func(i int) string { return fmt.Sprintf("203.0.113.%d", i) },
			mallory, "203.0.113.99", http.StatusTooManyRequests},
		{"behind a trusted proxy another client gets in", proxy, func(int) string { return "198.51.100.7" },
			proxy, "203.0.113.9", http.StatusOK},
		{"behind a trusted proxy the failing client waits", proxy, func(int) string { return "198.51.100.7" },
			proxy, "198.51.100.7", http.StatusTooManyRequests},
		{"what a client writes before the proxy's entry is not read", proxy, func(i int) string { return fmt.Sprintf("203.0.113.%d, 198.51.100.7", i) },
			proxy, "203.0.113.99, 198.51.100.7", http.StatusTooManyRequests},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.TrustedProxies = trusted })
			for i := range auditweb.MaxLoginFailures {
				loginVia(h, c.wrongVia, c.wrongXFF(i), "guess")
			}
			if code, after := loginVia(h, c.rightVia, c.rightXFF, "s3cret"); code != c.want {
				t.Errorf("right password via %s, X-Forwarded-For %q = %d (Retry-After %q), want %d", c.rightVia, c.rightXFF, code, after, c.want)
			}
		})
	}
}

// TestAuditWebLoginSource: the source a login counts under.
func TestAuditWebLoginSource(t *testing.T) {
	trusted, err := auditweb.ParseTrustedProxies("10.0.0.0/8, fd00::/8, 192.0.2.1")
	if err != nil {
		t.Fatalf("ParseTrustedProxies: %v", err)
	}
	h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.TrustedProxies = trusted })
	tests := []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"an untrusted peer", "198.51.100.7:4711", nil, "198.51.100.7"},
		{"an untrusted peer's header", "198.51.100.7:4711", []string{"203.0.113.9"}, "198.51.100.7"},
		{"a peer next to a trusted one", "192.0.2.2:1", []string{"203.0.113.9"}, "192.0.2.2"},
		{"a trusted proxy without the header", "10.0.0.1:443", nil, "10.0.0.1"},
		{"the client a trusted proxy names", "10.0.0.1:443", []string{"203.0.113.9"}, "203.0.113.9"},
		{"the client's own entries skipped", "10.0.0.1:443", []string{"6.6.6.6, 203.0.113.9"}, "203.0.113.9"},
		{"a chain of trusted proxies", "10.0.0.1:443", []string{"6.6.6.6, 203.0.113.9, 10.0.0.2", "192.0.2.1"}, "203.0.113.9"},
		{"an entry with a port", "10.0.0.1:443", []string{"203.0.113.9:5000"}, "203.0.113.9"},
		{"an IPv4-mapped entry", "10.0.0.1:443", []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"an entry that is no address", "10.0.0.1:443", []string{"203.0.113.9, not-an-ip"}, "10.0.0.1"},
		{"an entry that is no address behind another proxy", "10.0.0.1:443", []string{"not-an-ip, 10.0.0.7"}, "10.0.0.7"},
		{"proxies only", "10.0.0.1:443", []string{"10.0.0.3"}, "10.0.0.3"},
		{"empty entries", "10.0.0.1:443", []string{" , 203.0.113.9 ,, "}, "203.0.113.9"},
		{"an IPv6 peer, by its /64", "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"an IPv6 client behind an IPv6 proxy", "[fd00::1]:443", []string{"2001:db8:1:2:bbbb::9"}, "2001:db8:1:2::/64"},
		{"an IPv4-mapped peer", "[::ffff:198.51.100.7]:1", nil, "198.51.100.7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/audit/", nil)
			r.RemoteAddr = tt.peer
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := auditweb.LoginSource(h, r); got != tt.want {
				t.Errorf("LoginSource(%s, X-Forwarded-For %q) = %q, want %q", tt.peer, tt.xff, got, tt.want)
			}
		})
	}
}

// TestCheckSettingsTrustedProxies: the trusted proxies setting is
// addresses and CIDR prefixes; anything else, or a prefix of every
// address, is an error naming the variable and the entry.
func TestCheckSettingsTrustedProxies(t *testing.T) {
	tests := []struct {
		value string
		want  string // in the error; "" for none
	}{
		{"", ""},
		{"10.0.0.1", ""},
		{"10.0.0.0/8, 172.16.0.0/12 ,fd00::/8, ::1", ""},
		{"10.0.0.300", `COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: "10.0.0.300" is not an IP address or a CIDR prefix`},
		{"10.0.0.1, proxy.internal", `COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: "proxy.internal" is not an IP address`},
		{"10.0.0.0/33", `"10.0.0.0/33" is not`},
		{"0.0.0.0/0", `COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: "0.0.0.0/0" trusts every address`},
		{"::/0", `"::/0" trusts every address`},
		{"::ffff:0.0.0.0/96", `"::ffff:0.0.0.0/96" trusts every address`},
	}
	for _, tt := range tests {
		errs := auditweb.CheckSettings(false, "", "", "", "", tt.value)
		switch {
		case tt.want == "" && len(errs) != 0:
			t.Errorf("CheckSettings(trusted proxies %q) = %v, want no error", tt.value, errs)
		case tt.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want)):
			t.Errorf("CheckSettings(trusted proxies %q) = %v, want one error with %q", tt.value, errs, tt.want)
		}
	}
}

// FuzzLoginThrottle plays a sequence of logins — from a dozen sources,
// with the right password, a wrong one or none, time passing between
// them — against a view that remembers at most 8 sources, and checks what
// must always hold: the right password from a source with no failure
// since its last right login gets in; from a source with one, it gets in
// or waits at most UserBackoff; a wrong or missing password never gets
// in; a 429 says how long to wait (1 s to MaxLockout); the throttle never
// remembers more than its bound.
func FuzzLoginThrottle(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 0})
	// Twenty-four sources fail at once (an attack), then each tries the
	// right password, a second apart.
	var attack []byte
	for i := range 24 {
		attack = append(attack, byte(i), 1, 0)
	}
	for i := range 24 {
		attack = append(attack, byte(i), 0, 2)
	}
	f.Add(attack)
	// One source fails again and again, waiting a minute between tries.
	var hammer []byte
	for range 40 {
		hammer = append(hammer, 3, 1, 5, 3, 0, 0)
	}
	f.Add(hammer)
	advances := []time.Duration{0, 0, time.Second, 5 * time.Second, 59 * time.Second, time.Minute, 10 * time.Minute, 2 * time.Hour}
	f.Fuzz(func(t *testing.T, ops []byte) {
		clock := clocktest.New(clocktest.Opts{Start: base})
		h := newView(t, &fakeAudit{}, base, func(o *auditweb.Options) { o.Now = clock.Now })
		const limit = 8
		auditweb.LimitLoginSources(h, limit)
		failures := map[string]int{} // wrong logins since the source's last right one
		for i := 0; i+2 < len(ops) && i < 3*1000; i += 3 {
			addr := fmt.Sprintf("192.0.2.%d:1", ops[i]%12)
			clock.Advance(advances[int(ops[i+2])%len(advances)])
			pass := [...]string{"s3cret", "guess", "S3cret", ""}[ops[i+1]%4]
			code, after := login(h, addr, pass)
			if code == http.StatusTooManyRequests {
				secs, err := strconv.Atoi(after)
				if err != nil || secs < 1 || time.Duration(secs)*time.Second > auditweb.MaxLockout {
					t.Fatalf("op %d: %s got 429 with Retry-After %q, want 1 s to %v", i/3, addr, after, auditweb.MaxLockout)
				}
			}
			switch {
			case pass == "s3cret":
				n := failures[addr]
				secs, _ := strconv.Atoi(after)
				short := code == http.StatusTooManyRequests && time.Duration(secs)*time.Second <= auditweb.UserBackoff
				if n == 0 && code != http.StatusOK || n == 1 && code != http.StatusOK && !short {
					t.Fatalf("op %d: right password from %s after %d failures = %d (Retry-After %q), want 200%s",
						i/3, addr, n, code, after, map[bool]string{true: " or a wait of at most UserBackoff"}[n == 1])
				}
				if code == http.StatusOK {
					failures[addr] = 0
				}
			case code == http.StatusOK:
				t.Fatalf("op %d: password %q from %s = 200, want 401 or 429", i/3, pass, addr)
			case pass != "":
				failures[addr]++
			}
			if n := auditweb.LoginSources(h); n > limit {
				t.Fatalf("op %d: %d sources remembered, want at most %d", i/3, n, limit)
			}
		}
	})
}

// FuzzLoginSource: whatever X-Forwarded-For says, the source is an IPv4
// address or an IPv6 /64; an untrusted peer's does not depend on the
// header; a trusted proxy's is its own or that of an address the header
// names.
func FuzzLoginSource(f *testing.F) {
	f.Add(uint8(0), "203.0.113.9")
	f.Add(uint8(0), "6.6.6.6, 203.0.113.9, 10.0.0.2")
	f.Add(uint8(1), "203.0.113.9")
	f.Add(uint8(2), "[2001:db8::7]:443, fd00::9")
	f.Add(uint8(0), "::ffff:10.1.2.3, not-an-ip,")
	trusted, err := auditweb.ParseTrustedProxies("10.0.0.0/8, fd00::/8")
	if err != nil {
		f.Fatalf("ParseTrustedProxies: %v", err)
	}
	h := newView(f, &fakeAudit{}, base, func(o *auditweb.Options) { o.TrustedProxies = trusted })
	source := func(peer, xff string) string {
		r := httptest.NewRequest(http.MethodGet, "/audit/", nil)
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		return auditweb.LoginSource(h, r)
	}
	peers := []struct {
		addr    string
		trusted bool
	}{{"10.0.0.1:443", true}, {"198.51.100.7:1", false}, {"[fd00::1]:443", true}, {"[2001:db8:9::1]:1", false}}
	f.Fuzz(func(t *testing.T, which uint8, xff string) {
		peer := peers[int(which)%len(peers)]
		got := source(peer.addr, xff)
		a, aerr := netip.ParseAddr(got)
		p, perr := netip.ParsePrefix(got)
		if !(aerr == nil && a.Is4()) && !(perr == nil && p.Addr().Is6() && p.Bits() == 64) || len(got) > 43 {
			t.Fatalf("source via %s, X-Forwarded-For %q = %q, want an IPv4 address or an IPv6 /64", peer.addr, xff, got)
		}
		bare := source(peer.addr, "")
		if got == bare {
			return
		}
		if !peer.trusted {
			t.Fatalf("source via the untrusted %s, X-Forwarded-For %q = %q, want %q (the header ignored)", peer.addr, xff, got, bare)
		}
		for hop := range strings.SplitSeq(xff, ",") {
			hop = strings.TrimSpace(hop)
			a, err := netip.ParseAddr(hop)
			if ap, perr := netip.ParseAddrPort(hop); err != nil && perr == nil {
				a, err = ap.Addr(), nil
			}
			if err == nil && source(netip.AddrPortFrom(a.WithZone(""), 1).String(), "") == got {
				return
			}
		}
		t.Fatalf("source via %s, X-Forwarded-For %q = %q: neither the proxy's nor one the header names", peer.addr, xff, got)
	})
}

// TestAuditWebTrustsNotEveryone: New refuses trusted proxies that are
// every address (or none), as ParseTrustedProxies does.
func TestAuditWebTrustsNotEveryone(t *testing.T) {
	for _, p := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"), {}} {
		_, err := auditweb.New(auditweb.Options{Entries: &fakeAudit{}, Pending: &fakeAudit{}, Token: "t0ken", TrustedProxies: []netip.Prefix{p}})
		if err == nil {
			t.Errorf("New(TrustedProxies %v) = nil error, want one", p)
		}
	}
}
