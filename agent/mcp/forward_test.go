package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
)

// passAPI lets every call through (no request: the policy let it pass).
type passAPI struct{ *fakeAPI }

func (passAPI) Request(_ context.Context, c client.Call) (*client.Request, error) {
	return &client.Request{Status: client.Approved, Arguments: c.Arguments}, nil
}

// samplingClient is an MCP client of g whose sampling requests are
// counted and answered with its name.
type samplingClient struct {
	cs *mcp.ClientSession
	mu sync.Mutex
	n  int // sampling requests received
}

func connectSampling(t *testing.T, g *Gateway, name string) *samplingClient {
	t.Helper()
	sc := &samplingClient{}
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			sc.mu.Lock()
			sc.n++
			sc.mu.Unlock()
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "answer of " + name}}, nil
		},
	})
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(context.Background(), gs, nil); err != nil {
		t.Fatal(err)
	}
	// 2025-11-25: on 2026-07-28 a server sends no sampling request while
	// serving a call (it returns input requests instead).
	cs, err := c.Connect(context.Background(), gc, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	sc.cs = cs
	return sc
}

func (sc *samplingClient) requests() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.n
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestSamplingGoesOnlyToItsCaller: an upstream's sampling request made
// while one client's call runs reaches that client and its answer comes
// back; made while calls of two clients run on the upstream, it is refused
// (the upstream gets an error) and reaches neither client.
func TestSamplingGoesOnlyToItsCaller(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
	started, release := make(chan struct{}), make(chan struct{})
	up.AddTool(&mcp.Tool{Name: "ask", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}})
			if err != nil {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampling refused: " + err.Error()}}}, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled: " + res.Content.(*mcp.TextContent).Text}}}, nil
		})
	up.AddTool(&mcp.Tool{Name: "hold", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			close(started)
			<-release
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held"}}}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, b := connectSampling(t, g, "a"), connectSampling(t, g, "b")

	res, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: json.RawMessage(`{}`)})
	if err != nil || text(res) != "sampled: answer of a" {
		t.Fatalf("a's ask = %q, %v; want a's own sampling answer", text(res), err)
	}
	if a.requests() != 1 || b.requests() != 0 {
		t.Fatalf("sampling requests: a %d, b %d; want 1, 0", a.requests(), b.requests())
	}

	held := make(chan error, 1)
	go func() { // exits when hold is released
		_, err := b.cs.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: json.RawMessage(`{}`)})
		held <- err
	}()
	<-started // b's call runs upstream
	res, err = a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: json.RawMessage(`{}`)})
	close(release)
	if err != nil || !strings.Contains(text(res), "sampling refused") || !strings.Contains(text(res), "cannot tell which MCP client") {
		t.Errorf("a's ask while b's call runs = %q, %v; want the upstream's sampling refused", text(res), err)
	}
	if a.requests() != 1 || b.requests() != 0 {
		t.Errorf("sampling requests: a %d, b %d; want 1, 0 (none relayed while two clients run calls)", a.requests(), b.requests())
	}
	if err := <-held; err != nil {
		t.Errorf("b's hold: %v", err)
	}
}
