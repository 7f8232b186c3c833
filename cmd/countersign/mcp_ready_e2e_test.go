package main_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// TestReadyzNamesDeadUpstream: with one MCP upstream down, /readyz still
// answers 200 (the replica serves everything else) and names it in its
// body; /metrics has countersign_mcp_upstreams_unavailable 1; once it is
// up both clear.
func TestReadyzNamesDeadUpstream(t *testing.T) {
	t.Parallel()
	orders, late := newOrdersUpstream(t), newLateUpstream(t)
	policy := mcpPolicy(t, orders.url)
	src, err := os.ReadFile(policy)
	if err != nil {
		t.Fatal(err)
	}
	src = append(src, "    - name: late\n      url: "+late.url+"\n"...)
	if err := os.WriteFile(policy, src, 0o600); err != nil {
		t.Fatal(err)
	}
	retries := make(chan chan time.Time, 4)
	d := MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: policy},
		MCPAfter: func(time.Duration) (<-chan time.Time, func()) {
			c := make(chan time.Time, 1)
			retries <- c
			return c, func() {}
		}})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + d.Main.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/readyz")
	if code != http.StatusOK || !strings.HasPrefix(body, "ok\n") || !strings.Contains(body, "mcp upstream late unavailable") || strings.Contains(body, "upstream orders") {
		t.Errorf("/readyz with late down = %d %q; want 200 ok naming late only", code, body)
	}
	if _, m := get("/metrics"); !strings.Contains(m, "\ncountersign_mcp_upstreams_unavailable 1\n") {
		t.Errorf("/metrics with late down lacks countersign_mcp_upstreams_unavailable 1")
	}

	late.up.Store(true)
	select {
	case fire := <-retries:
		fire <- time.Now()
	case <-time.After(30 * time.Second):
		t.Fatal("serve never retried the dead upstream")
	}
	waitUntil(t, "the gauge to read 0", func() bool {
		_, m := get("/metrics")
		return strings.Contains(m, "\ncountersign_mcp_upstreams_unavailable 0\n")
	})
	if code, body := get("/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz with every upstream up = %d %q, want 200 \"ok\\n\"", code, body)
	}
}
