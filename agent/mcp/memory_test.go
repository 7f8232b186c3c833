package mcp_test

import (
	"context"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
)

// holdAPI leaves every request pending and holds each long poll until its
// ctx ends; polling receives the request's call id as each poll starts.
type holdAPI struct {
	letThrough
	polling chan string
}

func (a *holdAPI) Request(_ context.Context, c client.Call) (*client.Request, error) {
	return &client.Request{ID: "req_" + c.CallID, CallID: c.CallID, Status: client.Pending}, nil
}

func (a *holdAPI) Get(ctx context.Context, id string, _ time.Duration) (*client.Request, error) {
	a.polling <- id
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestGatewayMemoryBounded: a call answered leaves nothing behind (50
// distinct calls answered: nothing remembered), and calls never answered
// (their clients waiting, or gone without a retry) are remembered up to
// Options.MaxPendingCalls, the oldest forgotten first.
func TestGatewayMemoryBounded(t *testing.T) {
	g, cs, _ := MustGateway(t, mcp.Options{Prefix: true, API: func(string) mcp.API { return &letThrough{} },
		Upstreams: []mcp.Upstream{{Name: "orders", Transport: inMemoryUpstream(t)}}})
	for i := range 50 {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "orders__refund", Arguments: map[string]any{"n": i}})
		if err != nil || res.IsError {
			t.Fatalf("CallTool %d = %+v, %v", i, res, err)
		}
	}
	if n := g.PendingCalls(); n != 0 {
		t.Errorf("after 50 answered calls the gateway remembers %d, want 0", n)
	}

	const limit = 5
	api := &holdAPI{polling: make(chan string, 16)}
	g, cs, _ = MustGateway(t, mcp.Options{Prefix: true, API: func(string) mcp.API { return api }, MaxPendingCalls: limit,
		Upstreams: []mcp.Upstream{{Name: "orders", Transport: inMemoryUpstream(t)}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range limit + 3 {
		go func() { // returns when ctx ends (the test's end)
			_, _ = cs.CallTool(ctx, &sdk.CallToolParams{Name: "orders__refund", Arguments: map[string]any{"n": i}})
		}()
		<-api.polling
	}
	if n := g.PendingCalls(); n != limit {
		t.Errorf("with %d calls waiting the gateway remembers %d, want at most %d", limit+3, n, limit)
	}
}

// inMemoryUpstream is an upstream with one tool, refund, that answers
// "refunded".
func inMemoryUpstream(tb testing.TB) sdk.Transport {
	tb.Helper()
	s := sdk.NewServer(&sdk.Implementation{Name: "orders", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "refunded"}}}, nil
		})
	st, ct := sdk.NewInMemoryTransports()
	if _, err := s.Connect(context.Background(), st, nil); err != nil {
		tb.Fatal(err)
	}
	return ct
}
