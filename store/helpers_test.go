package store_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// t0 is the test epoch: clocks start here.
var t0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// fixture is a Store under test with its client and clock.
type fixture struct {
	s      *store.Store
	rdb    redis.UniversalClient
	prefix string
	clock  *clocktest.Clock
}

// mustStore returns a Store on a fresh prefix with a test clock; opts.Prefix
// and opts.Now are filled in. It is closed in t.Cleanup.
func mustStore(tb testing.TB, opts store.Options) fixture {
	tb.Helper()
	rdb, prefix := storetest.New(tb)
	return mustStoreOn(tb, rdb, prefix, opts)
}

func mustStoreOn(tb testing.TB, rdb redis.UniversalClient, prefix string, opts store.Options) fixture {
	tb.Helper()
	c := clocktest.New(clocktest.Opts{Start: t0})
	opts.Prefix = prefix
	if opts.Now == nil {
		opts.Now = c.Now
	}
	s := store.New(rdb, opts)
	tb.Cleanup(func() { _ = s.Close() })
	return fixture{s: s, rdb: rdb, prefix: prefix, clock: c}
}

// testArgs has the shapes JSON round trips like to break: a big integer, a
// long decimal, an exponent, an empty array and object, unicode.
const testArgs = `{"amount":12.50,"big":12345678901234567890123,"exp":1e400,"tags":[],"meta":{},"note":"café <b>&"}`

// request returns a pending request with sensible defaults; edit adjusts it.
func request(tb testing.TB, edit func(*approval.Request)) *approval.Request {
	tb.Helper()
	r := &approval.Request{
		ID:        approval.NewID("req"),
		RunID:     "run_test",
		Requester: "U_REQ",
		Tool:      "refund",
		Risk:      approval.RiskHigh,
		Args:      json.RawMessage(testArgs),
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
		Quorum:    1,
		Created:   t0,
		Deadline:  t0.Add(time.Hour),
	}
	if edit != nil {
		edit(r)
	}
	return r
}

// mustCreate saves a new request (see request) and returns it.
func (f fixture) mustCreate(tb testing.TB, edit func(*approval.Request)) *approval.Request {
	tb.Helper()
	r := request(tb, edit)
	if err := f.s.CreateRequest(context.Background(), r); err != nil {
		tb.Fatalf("CreateRequest(%s) = %v", r.ID, err)
	}
	return r
}

// decision returns a decision on r by approver with r's current digest.
func decision(r *approval.Request, v approval.Verdict, approver string) approval.Decision {
	return approval.Decision{RequestID: r.ID, Verdict: v, Approver: approver, Digest: r.Digest, At: t0.Add(time.Minute)}
}

// registered returns a hook and a function that blocks until id has n
// registered waiters (or the test times out).
type registrations struct {
	mu sync.Mutex // guards n, ch
	n  map[string]int
	ch chan struct{} // closed and replaced on every registration
}

func newRegistrations() *registrations {
	return &registrations{n: map[string]int{}, ch: make(chan struct{})}
}

func (r *registrations) hook(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[id]++
	close(r.ch)
	r.ch = make(chan struct{})
}

// await blocks until id has had at least n registrations.
func (r *registrations) await(tb testing.TB, id string, n int) {
	tb.Helper()
	timeout := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		got, ch := r.n[id], r.ch
		r.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			tb.Fatalf("waiters registered for %s = %d, want %d", id, got, n)
		}
	}
}

// refundGate is the policy the lifecycles of these tests judge claims by:
// the refund tool of request, and the same rule for outside callers.
func refundGate(tb testing.TB) *approval.Gate {
	tb.Helper()
	refund := approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewAlways,
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject}}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"refund": refund}, External: &refund})
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return gate
}
