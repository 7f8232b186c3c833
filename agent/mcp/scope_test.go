package mcp_test

import (
	"context"
	"slices"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
)

// keyAPI is letThrough for one key, allowed tools.
type keyAPI struct {
	letThrough
	tools []string
}

func (a *keyAPI) Self(context.Context) (*client.Key, error) {
	return &client.Key{Name: "k", Tools: a.tools}, nil
}

// TestStdioToolsListFilteredByKey: over stdio the configured key's tools
// (Options.Key, read through the API) are the only ones listed.
func TestStdioToolsListFilteredByKey(t *testing.T) {
	s := sdk.NewServer(&sdk.Implementation{Name: "orders", Version: "1"}, nil)
	for _, name := range []string{"refund", "lookup", "wipe"} {
		s.AddTool(&sdk.Tool{Name: name, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
				return &sdk.CallToolResult{}, nil
			})
	}
	st, ct := sdk.NewInMemoryTransports()
	if _, err := s.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	var asked []string
	_, cs, _ := MustGateway(t, mcp.Options{Prefix: true, Key: "csk_stdio",
		API: func(key string) mcp.API {
			asked = append(asked, key)
			return &keyAPI{tools: []string{"orders__refund"}}
		},
		Upstreams: []mcp.Upstream{{Name: "orders", Transport: ct}}})
	if got := toolNames(t, cs); !slices.Equal(got, []string{"orders__refund"}) {
		t.Errorf("tools = %v, want [orders__refund]", got)
	}
	if !slices.Contains(asked, "csk_stdio") {
		t.Errorf("keys asked = %v, want the configured key", asked)
	}
}
