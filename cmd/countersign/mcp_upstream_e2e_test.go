package main_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// lateUpstream is an MCP server (streamable HTTP) that answers 503 until
// up is set: an upstream that fails to start.
type lateUpstream struct {
	url string
	up  atomic.Bool
}

func newLateUpstream(t *testing.T) *lateUpstream {
	t.Helper()
	l := &lateUpstream{}
	s := mcp.NewServer(&mcp.Implementation{Name: "late", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !l.up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	l.url = srv.URL
	return l
}

// TestServeWithDeadUpstream: serve starts with one MCP upstream down: the
// Slack bot and /v1 serve, the other upstream's tools run, the dead one's
// answer "unavailable" and nothing runs; once it comes up (the retry timer
// fired by hand) the MCP client is told tools/list_changed and its tools
// run.
func TestServeWithDeadUpstream(t *testing.T) {
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
	rig := &mcpRig{up: orders, ticks: make(chan time.Time)}
	rig.d = MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: policy},
		MCPTicker: func(time.Duration) (<-chan time.Time, func()) { return rig.ticks, func() {} },
		MCPAfter: func(time.Duration) (<-chan time.Time, func()) {
			c := make(chan time.Time, 1)
			retries <- c
			return c, func() {}
		}})
	d := rig.d
	ctx := context.Background()

	// /v1 and the Slack bot serve: a request posts its card.
	r, err := apiClient(d).Request(ctx, client.Call{Tool: "orders__refund", CallID: "call-dead-1",
		Arguments: json.RawMessage(`{"order_id":"1234","amount":5}`)})
	if err != nil || r.Status != client.Pending {
		t.Fatalf("/v1 Request = %+v, %v; want pending", r, err)
	}
	apiCard(t, d, r.ID)

	changed := make(chan struct{}, 8)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	bt := newBearerTransport(d.APIKey)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + d.Main.Addr() + "/mcp",
		HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	t.Cleanup(func() { bt.drop(); _ = cs.Close() })
	names := func() []string {
		var out []string
		for tl, err := range cs.Tools(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tl.Name)
		}
		return out
	}
	if got := names(); slices.Contains(got, "late__ping") || !slices.Contains(got, "orders__lookup") {
		t.Errorf("tools while late is down = %v, want orders' only", got)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__lookup", Arguments: map[string]any{"order_id": "1"}})
	if err != nil || res.IsError {
		t.Errorf("orders__lookup while late is down = %+v, %v", res, err)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "late__ping", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(resultString(res), "the MCP upstream late is unavailable") {
		t.Errorf("late__ping while down = %+v, %v; want unavailable", res, err)
	}

	late.up.Store(true)
	select {
	case fire := <-retries:
		fire <- time.Now()
	case <-time.After(30 * time.Second):
		t.Fatal("serve never retried the dead upstream")
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("no tools/list_changed once late came up")
	}
	if got := names(); !slices.Contains(got, "late__ping") {
		t.Errorf("tools once late is up = %v, want late__ping", got)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "late__ping", Arguments: map[string]any{}})
	if err != nil || res.IsError || resultString(res) != "pong" {
		t.Errorf("late__ping once up = %+v, %v; want pong", res, err)
	}
}
