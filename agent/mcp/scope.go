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

// keyTools answers tools/list with only the tools the caller's key may
// ask for (the policy's api.keys[].tools, read through GET
// /v1/keys/self): a key allowed orders__refund alone sees only it. When
// the key's tools cannot be read, tools/list fails (closed) rather than
// show every tool.
func (g *Gateway) keyTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		list, ok := res.(*mcp.ListToolsResult)
		if err != nil || !ok || list == nil {
			return res, err
		}
		k, err := g.opts.API(g.key(req.GetExtra())).Self(ctx)
		if err != nil {
			g.opts.Logger.Error("mcp tools/list: the key's tools not read", "err", err)
			return nil, fmt.Errorf("countersign: the tools this key may use could not be read: %s", apiMessage(err))
		}
		out := *list
		out.Tools = nil
		for _, t := range list.Tools {
			if k.Allows(t.Name) {
				out.Tools = append(out.Tools, t)
			}
		}
		return &out, nil
	}
}
