package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

func TestReadyHandler(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	rdb, _ := storetest.New(t)
	get := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	slackOKCheck := func(context.Context) error { return nil }
	tests := []struct {
		name   string
		checks []Check
		code   int
		want   []string
	}{
		{"healthz: no checks", nil, 200, []string{"ok"}},
		{"redis and slack ok", []Check{Named("redis", store.Ready(rdb)), Named("slack auth.test", slackOKCheck)}, 200, []string{"ok"}},
		{"slack fails", []Check{Named("redis", store.Ready(rdb)), Named("slack auth.test", func(context.Context) error { return errors.New("invalid_auth") })},
			503, []string{"not ready", "slack auth.test: invalid_auth"}},
		{"redis unreachable", []Check{Named("redis", store.Ready(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})))},
			503, []string{"redis: dial tcp 127.0.0.1:1"}},
		{"a check that hangs is cut off", []Check{func(ctx context.Context) error { <-ctx.Done(); return fmt.Errorf("slow: %w", ctx.Err()) }},
			503, []string{"slow: context deadline exceeded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ReadyHandler(tt.checks...)
			if strings.Contains(tt.name, "hangs") {
				// The same handler with its 3 s cut to 50 ms, so the test
				// does not wait seconds for it.
				h = readyHandler(50*time.Millisecond, tt.checks, nil)
			}
			code, body := get(h)
			if code != tt.code {
				t.Errorf("status = %d, want %d; body %q", code, tt.code, body)
			}
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("body %q lacks %q", body, w)
				}
			}
		})
	}
}

func TestReadyCachedCheck(t *testing.T) {
	var calls int
	fail := false
	check := func(context.Context) error {
		calls++
		if fail {
			return errors.New("down")
		}
		return nil
	}
	now := time.Unix(0, 0)
	c := Cached(check, 30*time.Second, func() time.Time { return now })
	ctx := t.Context()
	for range 3 {
		if err := c(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Errorf("calls within the ttl = %d, want 1", calls)
	}
	now = now.Add(31 * time.Second)
	fail = true
	if err := c(ctx); err == nil || calls != 2 {
		t.Errorf("after the ttl: err %v, calls %d; want an error from a fresh call", err, calls)
	}
	if err := c(ctx); err == nil || calls != 3 {
		t.Errorf("failures are not cached: err %v, calls %d", err, calls)
	}
}
