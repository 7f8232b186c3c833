package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
)

// newMCP builds the MCP gateway the server mounts at server.PathMCP (nil
// when the policy lists no upstreams): each MCP client's bearer key is its
// API key, and the gateway
// reaches the API handler in this process (same code path, no socket). An
// upstream that fails to start does not stop serve: the gateway logs it,
// answers its tools "unavailable" and retries it with backoff.
func (m *Main) newMCP(ctx context.Context) (http.Handler, error) {
	if len(m.Policy.MCP.Upstreams) == 0 {
		return nil, nil
	}
	api := mcp.Clients("http://countersign.internal", client.InProcess(m.API.Handler(), ""))
	gw, err := mcp.New(ctx, mcp.Options{Upstreams: mcp.Upstreams(m.Policy.MCP, m.Env), Prefix: m.Policy.MCP.Prefix, API: api, Authorize: m.API.KnowsKey,
		Ticker: m.MCPTicker, After: m.MCPAfter, Now: m.Now, Version: version, Logger: m.Logger.With("component", "mcp")})
	if err != nil {
		return nil, err
	}
	m.mcp = gw
	return gw.Handler(), nil
}

// mcpUnavailable names each MCP upstream that is down, with why, one line
// each in name order: /readyz's detail; its length is the gauge
// countersign_mcp_upstreams_unavailable. None without a gateway.
func (m *Main) mcpUnavailable() []string {
	if m.mcp == nil {
		return nil
	}
	var out []string
	for name, err := range m.mcp.Unavailable() {
		out = append(out, fmt.Sprintf("mcp upstream %s unavailable: %v", name, err))
	}
	slices.Sort(out)
	return out
}
