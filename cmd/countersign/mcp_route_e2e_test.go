package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api"
)

// routeUpstream is an in-process upstream MCP server (go-sdk, streamable
// HTTP) whose messages to the gateway carry a caller's argument:
// summarise answers at once and, when the test sends on fire, logs
// "log: <text>" and asks for a sample of "summarise: <text>" (after its
// answer: nothing ties them to the call), reporting what the sampling
// request came to on after; ask samples while its call runs; slow runs
// until release is closed. Its tools are read-only (no person needed), and
// it has a resource and a prompt.
type routeUpstream struct {
	url     string
	fire    chan struct{}
	after   chan string
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newRouteUpstream(t *testing.T) *routeUpstream {
	t.Helper()
	u := &routeUpstream{fire: make(chan struct{}), after: make(chan string, 4), started: make(chan struct{}, 4), release: make(chan struct{})}
	s := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	arg := func(req *mcp.CallToolRequest) string {
		var a struct{ Text string }
		_ = json.Unmarshal(req.Params.Arguments, &a)
		return a.Text
	}
	sample := func(ctx context.Context, ss *mcp.ServerSession, text string) string {
		res, err := ss.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "summarise: " + text}}}})
		if err != nil {
			return "sampling refused: " + err.Error()
		}
		return "sampled: " + res.Content.(*mcp.TextContent).Text
	}
	answer := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	tool := func(name string) *mcp.Tool {
		return &mcp.Tool{Name: name, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}, InputSchema: map[string]any{"type": "object"}}
	}
	s.AddTool(tool("summarise"), func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, ss := arg(req), req.Session
		go func() { // exits once it has reported on after, or when the test ends
			select {
			case <-u.fire:
			case <-u.release:
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = ss.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "log: " + text})
			u.after <- sample(ctx, ss, text)
		}()
		return answer("noted"), nil
	})
	s.AddTool(tool("ask"), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return answer(sample(ctx, req.Session, arg(req))), nil
	})
	s.AddTool(tool("slow"), func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.started <- struct{}{}
		<-u.release
		return answer("slow done"), nil
	})
	s.AddResource(&mcp.Resource{URI: "orders://policy", Name: "refund-policy"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "refunds within 30 days"}}}, nil
	})
	s.AddPrompt(&mcp.Prompt{Name: "apology"}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "write an apology"}}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { u.once.Do(func() { close(u.release) }) })
	u.url = srv.URL
	return u
}

// routeClient is a go-sdk MCP client on /mcp with its own key that
// declares sampling: it records every sampling request and log message it
// receives and answers sampling with its name.
type routeClient struct {
	name string
	cs   *mcp.ClientSession
	mu   sync.Mutex
	got  []string
	logs chan string
}

func connectRouteClient(t *testing.T, addr, name, key string) *routeClient {
	t.Helper()
	rc := &routeClient{name: name, logs: make(chan string, 16)}
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			rc.record("sampling " + req.Params.Messages[0].Content.(*mcp.TextContent).Text)
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "answer of " + name}}, nil
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			rc.record(fmt.Sprint("log ", req.Params.Data))
			rc.logs <- fmt.Sprint(req.Params.Data)
		},
	})
	bt := newBearerTransport(key)
	// 2025-11-25: a session, over which server-to-client requests travel
	// (a 2026-07-28 client has none).
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("%s: MCP connect: %v", name, err)
	}
	t.Cleanup(func() { bt.drop(); _ = cs.Close() })
	if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatalf("%s: SetLoggingLevel: %v", name, err)
	}
	rc.cs = cs
	return rc
}

func (rc *routeClient) record(s string) {
	rc.mu.Lock()
	rc.got = append(rc.got, s)
	rc.mu.Unlock()
}

func (rc *routeClient) received() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return strings.Join(rc.got, " | ")
}

func (rc *routeClient) call(t *testing.T, tool, text string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := rc.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": text}})
	if err != nil {
		t.Fatalf("%s: %s: %v", rc.name, tool, err)
	}
	return resultString(res)
}

// TestMCPUpstreamMessagesOnlyToTheirCaller: issue 46's attack through
// /mcp. Client B (key B) has a slow call running on the upstream; client A
// (key A) calls summarise, which is answered at once, and then the
// upstream logs A's argument and asks for a sample of it. Both reach A
// and nothing of A's reaches B; each client's sampling while its own call
// runs reaches it. Key B, not allowed the upstream's reads, lists no
// resource or prompt and may read neither.
func TestMCPUpstreamMessagesOnlyToTheirCaller(t *testing.T) {
	t.Parallel()
	up := newRouteUpstream(t)
	const keyB = "csk_route_b_0123456789"
	rig := startMCPDemoWith(t, &ordersUpstream{url: up.url}, mcpPolicyWith(t, up.url, "",
		"\napi:\n  keys:\n    - name: client-b\n      sha256: "+api.HashKey(keyB)+"\n      tools: [orders__summarise, orders__ask, orders__slow]\n"))
	addr := rig.d.Main.Addr()
	a := connectRouteClient(t, addr, "a", rig.d.APIKey)
	b := connectRouteClient(t, addr, "b", keyB)

	slow := make(chan string, 1)
	go func() { // exits when slow is released (or the test ends)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := b.cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__slow", Arguments: map[string]any{}})
		if err != nil {
			slow <- err.Error()
			return
		}
		slow <- resultString(res)
	}()
	select {
	case <-up.started: // B's call runs upstream
	case <-time.After(30 * time.Second):
		t.Fatal("B's slow call never reached the upstream")
	}
	if got := a.call(t, "orders__summarise", "A-secret"); got != "noted" {
		t.Fatalf("A's summarise = %q", got)
	}
	up.fire <- struct{}{}
	select {
	case got := <-up.after:
		if got != "sampled: answer of a" {
			t.Errorf("the upstream's sampling request after A's answer came to %q, want A's own answer", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream's sampling request after A's answer never came back")
	}
	select {
	case got := <-a.logs:
		if got != "log: A-secret" {
			t.Errorf("A's log = %q", got)
		}
	case <-time.After(30 * time.Second):
		t.Error("the upstream's log message after A's answer never reached A")
	}
	if got := a.call(t, "orders__ask", "A-inflight"); got != "sampled: answer of a" {
		t.Errorf("A's ask = %q, want A's own sampling answer", got)
	}
	if got := b.call(t, "orders__ask", "B-inflight"); got != "sampled: answer of b" {
		t.Errorf("B's ask = %q, want B's own sampling answer", got)
	}
	up.once.Do(func() { close(up.release) })
	select {
	case got := <-slow:
		if got != "slow done" {
			t.Errorf("B's slow = %q", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("B's slow call did not return")
	}
	if got := b.received(); strings.Contains(got, "A-") || got != "sampling summarise: B-inflight" {
		t.Errorf("B received %q, want only its own sampling request (nothing of A's)", got)
	}
	if got := a.received(); !strings.Contains(got, "sampling summarise: A-secret") || !strings.Contains(got, "sampling summarise: A-inflight") {
		t.Errorf("A received %q, want its own two sampling requests", got)
	}

	ctx := context.Background()
	for _, c := range []struct {
		rc   *routeClient
		sees bool
	}{{a, true}, {b, false}} {
		resources, err := c.rc.cs.ListResources(ctx, nil)
		if err != nil {
			t.Fatalf("%s: ListResources: %v", c.rc.name, err)
		}
		prompts, err := c.rc.cs.ListPrompts(ctx, nil)
		if err != nil {
			t.Fatalf("%s: ListPrompts: %v", c.rc.name, err)
		}
		_, readErr := c.rc.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "orders://policy"})
		_, getErr := c.rc.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "orders__apology"})
		if got := len(resources.Resources) == 1 && len(prompts.Prompts) == 1; got != c.sees {
			t.Errorf("%s lists resources %d, prompts %d; want them listed %v", c.rc.name, len(resources.Resources), len(prompts.Prompts), c.sees)
		}
		if (readErr == nil) != c.sees || (getErr == nil) != c.sees {
			t.Errorf("%s: ReadResource = %v, GetPrompt = %v; want allowed %v", c.rc.name, readErr, getErr, c.sees)
		}
	}
}
