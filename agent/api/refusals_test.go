package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// streamBytes is the size of every entry of stream: each field's and
// value's bytes, as XRANGE returns them.
func streamBytes(ctx context.Context, tb testing.TB, rdb redis.UniversalClient, stream string) int {
	tb.Helper()
	msgs, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		tb.Fatalf("XRANGE %s: %v", stream, err)
	}
	n := 0
	for _, m := range msgs {
		for k, v := range m.Values {
			n += len(k) + len(fmt.Sprint(v))
		}
	}
	return n
}

// TestUnauthenticatedFloodBounded: 1,000 requests without a valid key,
// with 60 KB paths, on /v1 and /humanlayer/v1, grow the audit stream by
// less than 100 KB: each source (address, and whether it showed a key) is
// written once a minute with its count, its path cut. The counts written
// once the minute has passed add up to every refusal.
func TestUnauthenticatedFloodBounded(t *testing.T) {
	rdb, prefix := storetest.New(t)
	h := newHarness(t, harnessOptions{rdb: rdb, prefix: prefix})
	stream := prefix + ":{audit}"
	before := streamBytes(h.ctx, t, rdb, stream)

	long := strings.Repeat("A", 60<<10)
	send := func(i int) {
		t.Helper()
		path, key := "/v1/requests/"+long, ""
		switch i % 3 {
		case 1:
			path, key = "/v1/"+long, fmt.Sprintf("csk_guess_%d", i) // an unknown key, a path that is no endpoint
		case 2:
			path = "/humanlayer/v1/function_calls/" + long
		}
		req, err := http.NewRequestWithContext(h.ctx, http.MethodGet, h.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusNotFound {
			t.Fatalf("request %d: %d, want 401 or 404", i, resp.StatusCode)
		}
	}
	const flood = 1000
	for i := range flood {
		send(i)
	}
	grown := streamBytes(h.ctx, t, rdb, stream) - before
	if grown >= 100<<10 {
		t.Errorf("%d unauthenticated requests with 60 KB paths grew the audit stream by %d bytes, want < 100 KB", flood, grown)
	}
	if mem, err := rdb.MemoryUsage(h.ctx, stream).Result(); err == nil {
		t.Logf("audit stream: %d bytes of entries grown; MEMORY USAGE %d", grown, mem)
	}

	// A minute later each source's next refusal writes what was held
	// (flood%3 == 1: the key's source, then the no-key one).
	h.clock.Advance(time.Minute)
	for i := range 2 {
		send(flood + i)
	}
	total := 0
	for _, e := range h.events(approval.EventAPIRefused) {
		var ev struct {
			Path  string `json:"path"`
			Count int    `json:"count"`
		}
		if err := json.Unmarshal(e.Data, &ev); err != nil || len(ev.Path) > 1024 {
			t.Fatalf("api_refused entry %s: path of %d bytes (%v), want it cut", e.ID, len(ev.Path), err)
		}
		total += max(ev.Count, 1)
	}
	if total != flood+2 {
		t.Errorf("api_refused entries count %d refusals, want %d", total, flood+2)
	}
}

// TestRefusalsFlushed: refusals held in a source's minute are written,
// with their count and since when, by FlushRefusals once the minute has
// passed, without waiting for that source's next refusal.
func TestRefusalsFlushed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for range 5 {
		if status, _ := post(t, h, "", "/v1/requests", `{}`); status != http.StatusUnauthorized {
			t.Fatalf("POST without a key = %d, want 401", status)
		}
	}
	start := h.clock.Now()
	h.server.FlushRefusals(h.ctx, false)
	if n := len(h.events(approval.EventAPIRefused)); n != 1 {
		t.Fatalf("api_refused entries within the minute = %d, want 1", n)
	}
	h.clock.Advance(time.Minute)
	h.server.FlushRefusals(h.ctx, false)
	entries := h.events(approval.EventAPIRefused)
	if len(entries) != 2 {
		t.Fatalf("api_refused entries after the minute = %d, want 2", len(entries))
	}
	for i, want := range []approval.APIRefusedEvent{
		{Code: "unauthenticated", Source: "127.0.0.1, no key", Count: 1},
		{Code: "unauthenticated", Source: "127.0.0.1, no key", Count: 4, Since: start},
	} {
		ev, _ := approval.DecodeEvent(entries[i]).(*approval.APIRefusedEvent)
		if ev == nil || ev.Code != want.Code || ev.Source != want.Source || ev.Count != want.Count || !ev.Since.Equal(want.Since) {
			t.Errorf("entry %d = %+v, want code %s from %q, count %d since %v", i, ev, want.Code, want.Source, want.Count, want.Since)
		}
	}
}

// refusalLines counts the server's warnings about refused calls and the
// refusals they stand for (their count).
type refusalLines struct {
	mu     sync.Mutex // guards lines and counts
	lines  int
	counts int
}

func (l *refusalLines) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *refusalLines) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *refusalLines) WithGroup(string) slog.Handler                 { return l }

func (l *refusalLines) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "refused") {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines++
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			l.counts += int(a.Value.Int64())
		}
		return true
	})
	return nil
}

func (l *refusalLines) read() (lines, counts int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines, l.counts
}

// TestKeyRefusalFloodBounded: a flood of refusals of a valid key — past
// its rate limit, a tool outside its scope, an id it has no request of, a
// bad field — adds one audit entry and one log line within the minute
// (per key and code); once the minute has passed, one more of each,
// whose counts add up to every refusal.
func TestKeyRefusalFloodBounded(t *testing.T) {
	cases := []struct {
		name                    string
		method, key, path, body string
		calls, allowed, status  int
		code, keyName           string
	}{
		{"past the rate limit", http.MethodGet, fullKey, "/v1/keys/self", "", 2000, 5, http.StatusTooManyRequests, "rate_limited", "full"},
		{"a tool outside the key's scope", http.MethodPost, narrowKey, "/v1/requests", `{"tool":"lookup","call_id":"c1","arguments":{}}`, 100, 0, http.StatusForbidden, "forbidden_tool", "narrow"},
		{"no such request", http.MethodGet, fullKey, "/v1/requests/req_nope", "", 100, 0, http.StatusNotFound, "not_found", "full"},
		{"a bad field", http.MethodPost, fullKey, "/v1/requests", `{"tool":"refund","arguments":{}}`, 100, 0, http.StatusBadRequest, "invalid_field", "full"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logs := &refusalLines{}
			rate := 1000
			if c.allowed > 0 {
				rate = c.allowed
			}
			h := newHarness(t, harnessOptions{rate: rate, logger: slog.New(logs)})
			for i := range c.calls {
				status, e := send(t, h, c.method, c.key, c.path, c.body)
				want := c.status
				if i < c.allowed {
					want = http.StatusOK
				}
				if status != want || want != http.StatusOK && e["code"] != c.code {
					t.Fatalf("call %d: %s %s = %d %v, want %d %s", i+1, c.method, c.path, status, e, want, c.code)
				}
			}
			refused := c.calls - c.allowed
			if n := len(h.events(approval.EventAPIRefused)); n != 1 {
				t.Errorf("%d refusals of key %s: %d api_refused entries within the minute, want 1", refused, c.keyName, n)
			}
			if lines, _ := logs.read(); lines != 1 {
				t.Errorf("%d refusals of key %s: %d log lines within the minute, want 1", refused, c.keyName, lines)
			}

			h.clock.Advance(time.Minute)
			h.server.FlushRefusals(h.ctx, false)
			entries := h.events(approval.EventAPIRefused)
			total := 0
			for _, e := range entries {
				ev, _ := approval.DecodeEvent(e).(*approval.APIRefusedEvent)
				if ev == nil || ev.Key != c.keyName || ev.Code != c.code || ev.Status != c.status {
					t.Fatalf("api_refused entry %s = %s, want key %s, code %s, status %d", e.ID, e.Data, c.keyName, c.code, c.status)
				}
				total += ev.Count
			}
			if len(entries) != 2 || total != refused {
				t.Errorf("after the minute: %d api_refused entries counting %d refusals, want 2 counting %d", len(entries), total, refused)
			}
			if lines, counts := logs.read(); lines != 2 || counts != refused {
				t.Errorf("after the minute: %d log lines counting %d refusals, want 2 counting %d", lines, counts, refused)
			}
		})
	}
}

// TestKeyRefusalsByCode: a key's refusals are counted per code, so one
// refusal of a kind is audited at once even in a flood of another kind
// (a tool outside the key's scope amid its rate-limited calls), and the
// count of each code stays exact.
func TestKeyRefusalsByCode(t *testing.T) {
	h := newHarness(t, harnessOptions{rate: 3})
	for i := range 50 {
		if status, _ := send(t, h, http.MethodGet, fullKey, "/v1/keys/self", ""); i >= 3 && status != http.StatusTooManyRequests {
			t.Fatalf("call %d = %d, want 429", i+1, status)
		}
	}
	if status, e := post(t, h, narrowKey, "/v1/requests", `{"tool":"lookup","call_id":"c1","arguments":{}}`); status != http.StatusForbidden {
		t.Fatalf("narrow key asking for lookup = %d %v, want 403", status, e)
	}
	got := map[string]int{}
	for _, e := range h.events(approval.EventAPIRefused) {
		ev, _ := approval.DecodeEvent(e).(*approval.APIRefusedEvent)
		got[ev.Key+" "+ev.Code]++
	}
	if want := map[string]int{"full rate_limited": 1, "narrow forbidden_tool": 1}; !maps.Equal(got, want) {
		t.Errorf("api_refused entries by key and code = %v, want %v", got, want)
	}
}
