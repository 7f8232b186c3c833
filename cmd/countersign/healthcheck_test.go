package main_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// TestHealthcheck runs `countersign healthcheck`, compose.yaml's container
// health check (the distroless image has no shell and no curl), against a
// real serve found through COUNTERSIGN_ADDR as the container sets it, and
// against a serve that is not ready or not there.
func TestHealthcheck(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	m := MustRunMain(t, &main.Main{Config: main.Config{SlackBotToken: "xoxb-sim", SlackAppToken: "xapp-sim",
		SlackAPIURL: ws.APIURL(), OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m",
		LogLevel: "warn"}, Policy: policy, Logger: slog.New(slog.DiscardHandler)})
	_, port, err := net.SplitHostPort(m.Addr())
	if err != nil {
		t.Fatal(err)
	}

	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			http.Error(w, "redis: connection refused", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(notReady.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()

	tests := []struct {
		name     string
		addr     string // COUNTERSIGN_ADDR
		args     []string
		wantCode int
		wantOut  string // in stdout (0) or stderr
	}{
		{name: "ready, default /readyz on COUNTERSIGN_ADDR's port", addr: ":" + port, wantCode: 0, wantOut: "/readyz: ok"},
		{name: "live", addr: ":" + port, args: []string{"/healthz"}, wantCode: 0, wantOut: "/healthz: ok"},
		{name: "a URL", args: []string{"http://" + m.Addr() + "/readyz"}, wantCode: 0, wantOut: "ok"},
		{name: "not ready", args: []string{notReady.URL + "/readyz"}, wantCode: 1, wantOut: "503 Service Unavailable: redis: connection refused"},
		{name: "not ready on COUNTERSIGN_ADDR", addr: strings.TrimPrefix(notReady.URL, "http://"), wantCode: 1, wantOut: "redis: connection refused"},
		{name: "live but not ready", args: []string{notReady.URL + "/healthz"}, wantCode: 0, wantOut: "ok"},
		{name: "nothing listening", args: []string{gone.URL + "/readyz"}, wantCode: 1, wantOut: "connection refused"},
		{name: "bad COUNTERSIGN_ADDR", addr: "8080", wantCode: 2, wantOut: "COUNTERSIGN_ADDR"},
		{name: "two arguments", args: []string{"/readyz", "/healthz"}, wantCode: 2, wantOut: "usage: countersign healthcheck"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("COUNTERSIGN_ADDR", tc.addr)
			if tc.addr == "" {
				t.Setenv("COUNTERSIGN_ADDR", ":8080")
			}
			var stdout, stderr bytes.Buffer
			code := main.Run(context.Background(), append([]string{"healthcheck"}, tc.args...), main.Stdio{Stdout: &stdout, Stderr: &stderr})
			out := stdout.String()
			if tc.wantCode != 0 {
				out = stderr.String()
			}
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("countersign healthcheck %q (COUNTERSIGN_ADDR=%q) = %d, stdout %q, stderr %q; want %d with %q",
					tc.args, tc.addr, code, stdout.String(), stderr.String(), tc.wantCode, tc.wantOut)
			}
		})
	}
}
