package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// TestRateLimitSharedByReplicas: two API servers (two processes' worth of
// store and server) of one deployment spend one budget per key: once the
// key's calls are spent on one replica, the other refuses it too, with
// Retry-After; another key keeps its own budget.
func TestRateLimitSharedByReplicas(t *testing.T) {
	rdb, prefix := storetest.New(t)
	shared := func(s *store.Store) api.Limiter { return s.Limiter() }
	a := newHarness(t, harnessOptions{rate: 3, rdb: rdb, prefix: prefix, limiter: shared})
	b := newHarness(t, harnessOptions{rate: 3, rdb: rdb, prefix: prefix, limiter: shared})
	call := func(h *harness, key, id string) error {
		_, err := h.client(key).Request(h.ctx, client.Call{Tool: "lookup", CallID: id, Arguments: json.RawMessage(`{}`)})
		return err
	}
	for i, h := range []*harness{a, a, b} {
		if err := call(h, fullKey, fmt.Sprint("c", i)); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	for name, h := range map[string]*harness{"replica a": a, "replica b": b} {
		err := call(h, fullKey, "c-over")
		var e *client.Error
		if !errors.As(err, &e) || e.HTTPStatus != 429 || e.Code != "rate_limited" || e.RetryAfter != 20*time.Second {
			t.Errorf("%s, fourth call of the key: %v, want 429 rate_limited with Retry-After 20s (the budget is shared)", name, err)
		}
	}
	if _, err := b.client(narrowKey).Request(b.ctx, client.Call{Tool: "refund", CallID: "n1", Arguments: json.RawMessage(`{"amount":1}`)}); err != nil {
		t.Errorf("other key: %v", err)
	}
	a.clock.Advance(20 * time.Second)
	if err := call(a, fullKey, "c-later"); err != nil {
		t.Errorf("after 20s: %v, want one call allowed again", err)
	}
}

// failingLimiter cannot read any budget.
type failingLimiter struct{}

func (failingLimiter) Take(context.Context, string, int) (time.Duration, bool, error) {
	return 0, false, errors.New("redis: connection refused")
}

// TestRateLimitFailsClosed: when the budget cannot be read the call is
// refused (a server error the client retries) and no request is made.
func TestRateLimitFailsClosed(t *testing.T) {
	h := newHarness(t, harnessOptions{limiter: func(*store.Store) api.Limiter { return failingLimiter{} }})
	c := h.client(fullKey)
	_, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":1}`)})
	var e *client.Error
	if !errors.As(err, &e) || e.HTTPStatus != 500 || e.Code != "internal" {
		t.Fatalf("Request with the limiter down = %v, want 500 internal", err)
	}
	if n := len(h.events(approval.EventRequested)); n != 0 {
		t.Errorf("%d requests created with the limiter down, want 0", n)
	}
}
