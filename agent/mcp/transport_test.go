package mcp_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
)

// decideLater leaves every request pending until decide is closed; then
// its long poll answers it rejected.
type decideLater struct {
	letThrough
	decide chan struct{}
}

func (a *decideLater) Request(_ context.Context, c client.Call) (*client.Request, error) {
	return &client.Request{ID: "req_held", CallID: c.CallID, Status: client.Pending}, nil
}

func (a *decideLater) Get(ctx context.Context, id string, _ time.Duration) (*client.Request, error) {
	select {
	case <-a.decide:
		return &client.Request{ID: id, Status: client.Rejected, Reason: "not today"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestHeldCallKeepsResponseFlowing: over streamable HTTP, the POST of a
// call held for a person gets its status and headers at once, then an SSE
// comment every KeepAliveEvery while the person decides (no client or
// proxy sees an idle response), then the call's answer on the same stream.
//
// Under a server whose write timeout is far shorter than the wait (serve's
// is 30 s, a person takes minutes), the held answer is not cut: each
// comment moves its write deadline on.
func TestHeldCallKeepsResponseFlowing(t *testing.T) {
	t.Run("no write timeout", func(t *testing.T) { heldCall(t, 0, time.Millisecond, 3) })
	// 40 comments 10 ms apart hold the call at least 390 ms: twice the
	// server's write timeout.
	t.Run("write timeout shorter than the wait", func(t *testing.T) { heldCall(t, 200*time.Millisecond, 10*time.Millisecond, 40) })
}

// heldCall holds one call over streamable HTTP on a server with the given
// write timeout (0: none) for n keep-alive comments every keepAlive, then
// decides it and reads its answer.
func heldCall(t *testing.T, writeTimeout, keepAlive time.Duration, n int) {
	api := &decideLater{decide: make(chan struct{})}
	g, err := mcp.New(context.Background(), mcp.Options{Prefix: true, API: func(string) mcp.API { return api },
		KeepAliveEvery: keepAlive, Upstreams: []mcp.Upstream{{Name: "orders", Transport: inMemoryUpstream(t)}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Config.WriteTimeout = writeTimeout
	srv.Start()
	t.Cleanup(srv.Close)

	post := func(session, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer csk_test")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	init := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	session := init.Header.Get("Mcp-Session-Id")
	if init.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize = %d, session %q", init.StatusCode, session)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	// Do returns once the status and headers have arrived: before any
	// decision.
	resp := post(session, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"orders__refund","arguments":{"n":1}}}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("held call's response = %d %q, want 200 text/event-stream at once", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(resp.Body)
	comments := 0
	for comments < n && lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, ":") {
			if !strings.Contains(line, "req_held") || !strings.Contains(line, "waits for a human approval") {
				t.Fatalf("keep-alive comment = %q, want it to name the request", line)
			}
			comments++
		} else if line != "" {
			t.Fatalf("before the decision the stream carried %q, want only comments", line)
		}
	}
	if comments < n {
		t.Fatalf("the stream ended after %d keep-alive comments: %v", comments, lines.Err())
	}
	close(api.decide)
	for lines.Scan() {
		if line := lines.Text(); strings.HasPrefix(line, "data: ") {
			if !strings.Contains(line, `"id":2`) || !strings.Contains(line, "not today") || !strings.Contains(line, `"isError":true`) {
				t.Fatalf("the call's answer = %s, want the rejection with its reason", line)
			}
			return
		}
	}
	t.Fatalf("no answer after the decision: %v", lines.Err())
}

// TestSessionBoundToItsKey: over streamable HTTP a session belongs to the
// key that started it. Another key naming its Mcp-Session-Id is refused,
// both a request in it and the GET of its standalone stream (where the
// session's server-to-client messages go), so knowing a session id is not
// enough to read or act in another client's session.
func TestSessionBoundToItsKey(t *testing.T) {
	g, err := mcp.New(context.Background(), mcp.Options{Prefix: true, API: func(string) mcp.API { return &letThrough{} },
		Authorize: func(key string) bool { return key == "csk_a" || key == "csk_b" },
		Upstreams: []mcp.Upstream{{Name: "orders", Transport: inMemoryUpstream(t)}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	send := func(method, key, session, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	init := send(http.MethodPost, "csk_a", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`)
	session := init.Header.Get("Mcp-Session-Id")
	if init.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize = %d, session %q", init.StatusCode, session)
	}
	send(http.MethodPost, "csk_a", session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	cases := []struct {
		name, method, key, body string
		want                    int
	}{
		{"another key's request in the session", http.MethodPost, "csk_b", list, http.StatusForbidden},
		{"another key's GET of the session's stream", http.MethodGet, "csk_b", "", http.StatusForbidden},
		{"another key ending the session", http.MethodDelete, "csk_b", "", http.StatusForbidden},
		{"its own key's request", http.MethodPost, "csk_a", list, http.StatusOK},
	}
	for _, tc := range cases {
		if got := send(tc.method, tc.key, session, tc.body).StatusCode; got != tc.want {
			t.Errorf("%s: %s = %d, want %d", tc.name, tc.method, got, tc.want)
		}
	}
}
