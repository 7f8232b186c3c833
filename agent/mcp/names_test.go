package mcp_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	gateway "github.com/countersign/countersign/agent/mcp"
)

// rejectingAPI answers every request rejected by Bob, named by the API.
type rejectingAPI struct{}

func (rejectingAPI) Request(context.Context, client.Call) (*client.Request, error) {
	return &client.Request{ID: "req_1", Status: client.Rejected, Approver: "U0BOB0001", ApproverName: "Bob Baker", Reason: "not today"}, nil
}

func (rejectingAPI) Get(context.Context, string, time.Duration) (*client.Request, error) {
	return nil, context.Canceled
}

func (rejectingAPI) Claim(context.Context, string) (*client.Claimed, error) {
	return nil, context.Canceled
}

func (rejectingAPI) Result(context.Context, string, string, client.Status, string) (*client.Request, error) {
	return nil, nil
}

func (rejectingAPI) Self(context.Context) (*client.Key, error) {
	return &client.Key{Name: "any", Tools: []string{"*"}}, nil
}

// TestRefusalNamesTheApprover: the text the model receives for a rejected
// call names the approver as people know them, never by Slack id.
func TestRefusalNamesTheApprover(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	up.AddTool(&mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(ctx, gateway.Options{Upstreams: []gateway.Upstream{{Name: "orders", Transport: ct}}, Prefix: true,
		API: func(string) gateway.API { return rejectingAPI{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, gc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__refund", Arguments: json.RawMessage(`{"amount":5}`)})
	if err != nil || !res.IsError {
		t.Fatalf("CallTool = %+v, %v; want an error result", res, err)
	}
	txt := res.Content[0].(*mcp.TextContent).Text
	if want := "The call to orders__refund was rejected by Bob Baker: not today (request req_1). It did not run."; txt != want || strings.Contains(txt, "U0BOB0001") {
		t.Errorf("rejection text = %q, want %q", txt, want)
	}
}
