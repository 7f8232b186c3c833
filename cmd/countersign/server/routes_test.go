package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/cmd/countersign/server"
)

// named answers its name, so a test sees which handler a path reached.
func named(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })
}

// TestMuxMountsEachPath: every path of the process reaches its handler;
// a handler left nil is not mounted (404).
func TestMuxMountsEachPath(t *testing.T) {
	t.Parallel()
	if server.PathHumanLayer != api.HumanLayerPrefix {
		t.Fatalf("server.PathHumanLayer = %q, want api.HumanLayerPrefix %q", server.PathHumanLayer, api.HumanLayerPrefix)
	}
	full := server.Mux(server.Routes{Live: named("live"), Ready: named("ready"), Metrics: named("metrics"),
		Slack: named("slack"), API: named("api"), HumanLayer: named("humanlayer"), MCP: named("mcp"), Audit: named("audit")})
	socket := server.Mux(server.Routes{Live: named("live"), API: named("api")}) // Socket Mode, no extras
	for _, tt := range []struct {
		mux          http.Handler
		method, path string
		want         string // "" for a 404
	}{
		{full, "GET", "/healthz", "live"},
		{full, "GET", "/readyz", "ready"},
		{full, "GET", "/metrics", "metrics"},
		{full, "POST", "/slack/interactions", "slack"},
		{full, "POST", "/v1/requests", "api"},
		{full, "POST", "/humanlayer/v1/function_calls", "humanlayer"},
		{full, "POST", "/mcp", "mcp"},
		{full, "GET", "/audit/requests", "audit"},
		{full, "GET", "/elsewhere", ""},
		{socket, "POST", "/slack/interactions", ""},
		{socket, "GET", "/metrics", ""},
		{socket, "GET", "/audit/", ""},
		{server.MetricsOnly(named("metrics")), "GET", "/metrics", "metrics"},
		{server.MetricsOnly(named("metrics")), "GET", "/healthz", ""},
	} {
		rec := httptest.NewRecorder()
		tt.mux.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		got := rec.Body.String()
		if tt.want == "" && rec.Code != http.StatusNotFound {
			t.Errorf("%s %s = %d %q, want 404 (not mounted)", tt.method, tt.path, rec.Code, got)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("%s %s reached %q (%d), want %q", tt.method, tt.path, got, rec.Code, tt.want)
		}
	}
}
