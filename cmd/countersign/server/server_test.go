package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/countersign/countersign/cmd/countersign/server"
)

// TestServerStartingReadyShutdown: 503 "starting" from Listen on, the
// handler given to Ready once ready, and nothing once shut down.
func TestServerStartingReadyShutdown(t *testing.T) {
	t.Parallel()
	s, err := server.Listen("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + s.Addr() + "/healthz"
	if code, body := get(t, url); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("GET before Ready = %d %q, want 503 starting", code, body)
	}
	s.Ready(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	if code, body := get(t, url); code != http.StatusOK || body != "ok" {
		t.Errorf("GET after Ready = %d %q, want 200 ok", code, body)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if resp, err := http.Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("GET after Shutdown = %d, want a refused connection", resp.StatusCode)
	}
}

// TestListenRefusesBadAddr: an address that cannot be listened on is
// Listen's error, not a server that never serves.
func TestListenRefusesBadAddr(t *testing.T) {
	t.Parallel()
	if s, err := server.Listen("127.0.0.1:http-alt-not-a-port", slog.New(slog.DiscardHandler)); err == nil {
		_ = s.Shutdown(context.Background())
		t.Fatal("Listen(bad port) = nil error, want one")
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
