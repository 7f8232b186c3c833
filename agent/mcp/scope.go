package mcp

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file: what the caller's API key may see.

// key is the API key an MCP request is made with: the client's bearer key
// over HTTP, Options.Key over stdio.
func (g *Gateway) key(extra *mcp.RequestExtra) string {
	if extra != nil {
		if k := bearer(extra.Header); k != "" {
			return k
		}
	}
	return g.opts.Key
}

// keyLists answers tools/list with only the tools the caller's key may
// ask for (the policy's api.keys[].tools, read through GET
// /v1/keys/self): a key allowed orders__refund alone sees only it; and
// resources/list, resources/templates/list and prompts/list with only
// what the key may read: the resources and templates of the upstreams
// whose <upstream>__resources_read it may ask for, the prompts of those
// whose <upstream>__prompts_get (reads.go). When the key's tools cannot be
// read, the list fails (closed) rather than show everything.
func (g *Gateway) keyLists(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || res == nil {
			return res, err
		}
		switch res.(type) {
		case *mcp.ListToolsResult, *mcp.ListResourcesResult, *mcp.ListResourceTemplatesResult, *mcp.ListPromptsResult:
		default:
			return res, err
		}
		k, err := g.opts.API(g.key(req.GetExtra())).Self(ctx)
		if err != nil {
			g.opts.Logger.Error("mcp list: the key's tools not read", "method", method, "err", err)
			return nil, fmt.Errorf("countersign: the tools this key may use could not be read: %s", apiMessage(err))
		}
		// may tells whether the key may use up's pseudo-tool op.
		may := func(up *upstream, op string) bool { return up != nil && k.Allows(up.name+Separator+op) }
		switch list := res.(type) {
		case *mcp.ListToolsResult:
			out := *list
			out.Tools = nil
			for _, t := range list.Tools {
				if k.Allows(t.Name) {
					out.Tools = append(out.Tools, t)
				}
			}
			return &out, nil
		case *mcp.ListResourcesResult:
			out := *list
			out.Resources = nil
			for _, r := range list.Resources {
				if may(g.resourceOwner(r.URI), ResourcesRead) {
					out.Resources = append(out.Resources, r)
				}
			}
			return &out, nil
		case *mcp.ListResourceTemplatesResult:
			out := *list
			out.ResourceTemplates = nil
			for _, t := range list.ResourceTemplates {
				if may(g.resourceOwner(t.URITemplate), ResourcesRead) {
					out.ResourceTemplates = append(out.ResourceTemplates, t)
				}
			}
			return &out, nil
		case *mcp.ListPromptsResult:
			out := *list
			out.Prompts = nil
			for _, p := range list.Prompts {
				if up, _ := g.promptOwner(p.Name); may(up, PromptsGet) {
					out.Prompts = append(out.Prompts, p)
				}
			}
			return &out, nil
		}
		return res, nil
	}
}
