package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/cmd/countersign/gctune"
)

const mcpUsage = `usage: countersign mcp [--url URL] [--config policy.yaml]

Runs the MCP gateway over stdio for one MCP client (Claude Desktop, Cursor,
an agent framework). It proxies the MCP servers listed under mcp.upstreams
in the policy file and gates every tool call through the running
"countersign serve" at --url: a call waits for a human decision in Slack
and runs with the arguments as approved; a rejection is an error result
with the approver's reason. It needs no Redis or Slack of its own.
docs/mcp.md shows a client configuration.

  --url URL            the server, e.g. http://countersign:8080 (default $COUNTERSIGN_URL)
  --config FILE        the policy file naming the upstreams (default $COUNTERSIGN_CONFIG)
  COUNTERSIGN_API_KEY  the API key the calls are made with (docs/api.md); required
`

// runMCP is `countersign mcp`: the gateway over stdio. Logs go to stderr
// (stdout is the MCP connection).
func runMCP(ctx context.Context, args []string, std Stdio) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, mcpUsage) }
	url := fs.String("url", os.Getenv("COUNTERSIGN_URL"), "the Countersign server")
	config := fs.String("config", os.Getenv("COUNTERSIGN_CONFIG"), "the policy file")
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprint(std.Stdout, mcpUsage)
		return 0
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign mcp: unexpected arguments %q\n\n%s", fs.Args(), mcpUsage)
		return 2
	}
	key := os.Getenv("COUNTERSIGN_API_KEY")
	if errs := mcp.CheckStdio(*url, key, *config); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(std.Stderr, "countersign mcp:", err)
		}
		return 2
	}
	f, err := policyfile.Load(*config)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign mcp: %v\n", err)
		return 1
	}
	gctune.Apply(os.Getenv)
	log := slog.New(slog.NewTextHandler(std.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	api := mcp.Clients(*url, &http.Client{Timeout: 2 * time.Minute})
	gw, err := mcp.New(ctx, mcp.Options{Upstreams: mcpUpstreams(f.MCP, os.Getenv), Prefix: f.MCP.Prefix, API: api, Key: key,
		OneClient: true, Version: version, Logger: log})
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign mcp: %v\n", err)
		return 1
	}
	defer gw.Close()
	if err := gw.RunStdio(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintf(std.Stderr, "countersign mcp: %v\n", err)
		return 1
	}
	return 0
}

// mcpUpstreams are the policy's upstreams, resolved from env.
func mcpUpstreams(p policyfile.MCP, env func(string) string) []mcp.Upstream {
	var out []mcp.Upstream
	for _, u := range p.Upstreams {
		vars, headers := u.Resolve(env)
		out = append(out, mcp.Upstream{Name: u.Name, Command: u.Command, URL: u.URL, Env: vars, Headers: headers})
	}
	return out
}

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
	api := mcp.Clients("http://countersign.internal", mcp.InProcess(m.API.Handler()))
	gw, err := mcp.New(ctx, mcp.Options{Upstreams: mcpUpstreams(m.Policy.MCP, m.Env), Prefix: m.Policy.MCP.Prefix, API: api, Authorize: m.API.KnowsKey,
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
