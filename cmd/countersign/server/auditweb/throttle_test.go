package auditweb_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

// login sends one request from addr with the basic-auth password pass
// ("" sends no credentials) and returns the status and Retry-After.
func login(h http.Handler, addr, pass string) (int, string) {
	req := httptest.NewRequest(http.MethodGet, "/audit/", nil)
	req.RemoteAddr = addr
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
