package mcp_test

import (
	"context"
	"slices"
	"strings"
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

// scopedAPI lets through the calls of the tools its key may ask for and
// refuses the others as the API does (403 forbidden_tool).
type scopedAPI struct {
	keyAPI
}

func (a *scopedAPI) Request(ctx context.Context, c client.Call) (*client.Request, error) {
	k, _ := a.Self(ctx)
	if !k.Allows(c.Tool) {
		return nil, &client.Error{HTTPStatus: 403, Code: "forbidden_tool", Field: "tool",
			Message: "key k may not ask for tool \"" + c.Tool + "\""}
	}
	return a.keyAPI.Request(ctx, c)
}

// readsUpstream is an upstream with a resource, a resource template and a
// prompt, each named after it.
func readsUpstream(name string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: name, Version: "1"}, nil)
	read := func(_ context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: name + " text"}}}, nil
	}
	s.AddResource(&sdk.Resource{URI: name + "://doc", Name: name + "-doc"}, read)
	s.AddResourceTemplate(&sdk.ResourceTemplate{URITemplate: name + "://item/{id}", Name: name + "-item"}, read)
	s.AddPrompt(&sdk.Prompt{Name: "hello"}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		return &sdk.GetPromptResult{Messages: []*sdk.PromptMessage{{Role: "user", Content: &sdk.TextContent{Text: name + " prompt"}}}}, nil
	})
	return s
}

// TestReadsListedByKey: resources/list, resources/templates/list and
// prompts/list show only what the caller's key may read (its
// <upstream>__resources_read, <upstream>__prompts_get), and a read or get
// of anything else is refused; a key with "*" sees and reads everything.
func TestReadsListedByKey(t *testing.T) {
	cases := []struct {
		name                       string
		tools                      []string
		resources, templates, gets []string
	}{
		{"orders' resources and docs' prompts", []string{"orders__resources_read", "docs__prompts_get"},
			[]string{"orders://doc"}, []string{"orders://item/{id}"}, []string{"docs__hello"}},
		{"tools only", []string{"orders__hello"}, nil, nil, nil},
		{"everything", []string{"*"}, []string{"docs://doc", "orders://doc"}, []string{"docs://item/{id}", "orders://item/{id}"},
			[]string{"docs__hello", "orders__hello"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, cs, _ := MustGateway(t, mcp.Options{Prefix: true, Key: "k",
				API:       func(string) mcp.API { return &scopedAPI{keyAPI{tools: tc.tools}} },
				Upstreams: []mcp.Upstream{{Name: "orders", Server: readsUpstream("orders")}, {Name: "docs", Server: readsUpstream("docs")}}})
			ctx := context.Background()
			var resources, templates, prompts []string
			for r, err := range cs.Resources(ctx, nil) {
				if err != nil {
					t.Fatal(err)
				}
				resources = append(resources, r.URI)
			}
			for r, err := range cs.ResourceTemplates(ctx, nil) {
				if err != nil {
					t.Fatal(err)
				}
				templates = append(templates, r.URITemplate)
			}
			for p, err := range cs.Prompts(ctx, nil) {
				if err != nil {
					t.Fatal(err)
				}
				prompts = append(prompts, p.Name)
			}
			for _, l := range [][]string{resources, templates, prompts} {
				slices.Sort(l)
			}
			if !slices.Equal(resources, tc.resources) || !slices.Equal(templates, tc.templates) || !slices.Equal(prompts, tc.gets) {
				t.Errorf("listed resources %v, templates %v, prompts %v; want %v, %v, %v", resources, templates, prompts, tc.resources, tc.templates, tc.gets)
			}
			for _, up := range []string{"orders", "docs"} {
				_, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: up + "://doc"})
				if want := slices.Contains(tc.resources, up+"://doc"); (err == nil) != want {
					t.Errorf("ReadResource(%s://doc) = %v, want allowed %v", up, err, want)
				}
				_, err = cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: up + "://item/7"})
				if want := slices.Contains(tc.templates, up+"://item/{id}"); (err == nil) != want {
					t.Errorf("ReadResource(%s://item/7) = %v, want allowed %v", up, err, want)
				}
				_, err = cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: up + "__hello"})
				if want := slices.Contains(tc.gets, up+"__hello"); (err == nil) != want {
					t.Errorf("GetPrompt(%s__hello) = %v, want allowed %v", up, err, want)
				}
			}
		})
	}
}

// failingSelf cannot read its key's tools.
type failingSelf struct{ letThrough }

func (*failingSelf) Self(context.Context) (*client.Key, error) {
	return nil, &client.Error{HTTPStatus: 503, Code: "unavailable", Message: "try later"}
}

// TestReadsListClosedWithoutKey: when the key's tools cannot be read, the
// resource and prompt lists fail rather than show everything.
func TestReadsListClosedWithoutKey(t *testing.T) {
	_, cs, _ := MustGateway(t, mcp.Options{Prefix: true, Key: "k", API: func(string) mcp.API { return &failingSelf{} },
		Upstreams: []mcp.Upstream{{Name: "orders", Server: readsUpstream("orders")}}})
	ctx := context.Background()
	if _, err := cs.ListResources(ctx, nil); err == nil || !strings.Contains(err.Error(), "could not be read") {
		t.Errorf("ListResources = %v, want it refused", err)
	}
	if _, err := cs.ListResourceTemplates(ctx, nil); err == nil {
		t.Error("ListResourceTemplates succeeded, want it refused")
	}
	if _, err := cs.ListPrompts(ctx, nil); err == nil {
		t.Error("ListPrompts succeeded, want it refused")
	}
}
