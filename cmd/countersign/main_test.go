package main_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store/storetest"
)

// The end-to-end tests run the process as `serve` and `demo` do, through
// package main's exported Main and Demo (benbjohnson/wtf's
// cmd/wtfd/main_test.go is the model): MustRunMain and MustStartDemo start
// one and close it when the test ends. Process-level tests (signals, the
// static binary) run the built binary instead (sigterm_test.go).
//
// Every test here runs in parallel (t.Parallel) unless it sets the process
// environment (t.Setenv: the audit CLI and config tests): each has its own
// Redis key prefix, loopback ports and workspace, so they share nothing.

// MustRunMain starts m on the test's Redis (real when REDIS_URL is set)
// and a free loopback port, unless m sets them, and closes it when the
// test ends; a Start error fails the test.
func MustRunMain(tb testing.TB, m *main.Main) *main.Main {
	tb.Helper()
	if err := runMain(tb, m); err != nil {
		tb.Fatalf("Main.Start: %v", err)
	}
	return m
}

// runMain is MustRunMain returning Start's error, for tests of start-up
// refusals.
func runMain(tb testing.TB, m *main.Main) error {
	tb.Helper()
	if m.Redis == nil {
		rdb, prefix := storetest.New(tb)
		m.Redis, m.Config.RedisPrefix, m.Config.AuditStream = rdb, prefix, prefix+":{audit}"
	}
	if m.Config.Addr == "" {
		m.Config.Addr = "127.0.0.1:0"
	}
	ctx, cancel := context.WithCancel(context.Background())
	err := m.Start(ctx)
	tb.Cleanup(func() {
		cancel()
		if cerr := m.Close(); cerr != nil && err == nil {
			tb.Errorf("Main.Close: %v", cerr)
		}
	})
	return err
}

// MustStartDemo starts d — the production Main in the demo world: the
// local workspace, the demo system of record and the scripted model — on
// the test's Redis (real when REDIS_URL is set) unless d names one, with
// its page on a free port, and closes it when the test ends.
func MustStartDemo(tb testing.TB, d *main.Demo) *main.Demo {
	tb.Helper()
	if d.Redis == nil && d.RedisURL == "" {
		d.Redis, d.Prefix = storetest.New(tb)
	}
	if d.Addr == "" {
		d.Addr = "127.0.0.1:0"
	}
	if d.Manifest == nil {
		// The workspace grants what the checkout's manifest.yml grants,
		// and refuses the rest as Slack would.
		d.Manifest = slacksimtest.Manifest(tb)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := d.Start(ctx); err != nil {
		cancel()
		_ = d.Close()
		tb.Fatalf("Demo.Start: %v", err)
	}
	tb.Cleanup(func() {
		cancel()
		if err := d.Close(); err != nil {
			tb.Errorf("Demo.Close: %v", err)
		}
	})
	return d
}

// TestMainServesProbes: Main run as `serve` runs it (Socket Mode, the
// demo's policy, a local workspace) answers /healthz, /readyz (Redis and
// Slack) and /metrics once Start has returned.
func TestMainServesProbes(t *testing.T) {
	t.Parallel()
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	m := MustRunMain(t, &main.Main{Config: main.Config{SlackBotToken: "xoxb-sim", SlackAppToken: "xapp-sim",
		SlackAPIURL: ws.APIURL(), OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m",
		LogLevel: "warn"}, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
	for _, tc := range []struct{ path, want string }{
		{"/healthz", "ok"},
		{"/readyz", "ok"},
		{"/metrics", "countersign_"},
	} {
		resp, err := http.Get("http://" + m.Addr() + tc.path)
		if err != nil {
			t.Fatalf("GET %s: %v", tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
			t.Errorf("GET %s = %d %q, want 200 with %q", tc.path, resp.StatusCode, body, tc.want)
		}
	}
}

// TestMainMetricsListener: with COUNTERSIGN_METRICS_ADDR set, /metrics is
// served on that listener only: the main listener (Slack, /v1, the
// probes) answers 404 for it, and the metrics listener serves nothing
// else.
func TestMainMetricsListener(t *testing.T) {
	t.Parallel()
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	m := MustRunMain(t, &main.Main{Config: main.Config{SlackBotToken: "xoxb-sim", SlackAppToken: "xapp-sim",
		SlackAPIURL: ws.APIURL(), OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m",
		LogLevel: "warn", MetricsAddr: "127.0.0.1:0"}, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
	if m.MetricsAddr() == "" || m.MetricsAddr() == m.Addr() {
		t.Fatalf("MetricsAddr() = %q (main %q), want a listener of its own", m.MetricsAddr(), m.Addr())
	}
	for _, tc := range []struct {
		addr, path string
		status     int
		want       string
	}{
		{m.MetricsAddr(), "/metrics", http.StatusOK, "countersign_"},
		{m.Addr(), "/metrics", http.StatusNotFound, ""},
		{m.Addr(), "/healthz", http.StatusOK, "ok"},
		{m.Addr(), "/readyz", http.StatusOK, "ok"},
		{m.MetricsAddr(), "/healthz", http.StatusNotFound, ""},
		{m.MetricsAddr(), "/v1/openapi.json", http.StatusNotFound, ""},
	} {
		resp, err := http.Get("http://" + tc.addr + tc.path)
		if err != nil {
			t.Fatalf("GET %s%s: %v", tc.addr, tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("GET %s%s = %d %.80q, want %d with %q", tc.addr, tc.path, resp.StatusCode, body, tc.status, tc.want)
		}
	}
}
