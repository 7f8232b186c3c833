// Package mcpstdio is `countersign mcp`: the MCP gateway (agent/mcp) over
// stdio for one MCP client, gating every tool call through a running
// serve's /v1 API. It needs no Redis or Slack of its own.
package mcpstdio

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/cmd/countersign/config"
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

// Run is `countersign mcp` (args without "mcp"): the gateway over stdio,
// introducing itself to the client as version. Logs go to stderr (stdout
// is the MCP connection).
func Run(ctx context.Context, args []string, std config.Stdio, version string) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, mcpUsage) }
	url := fs.String("url", os.Getenv("COUNTERSIGN_URL"), "the Countersign server")
	policyPath := fs.String("config", os.Getenv("COUNTERSIGN_CONFIG"), "the policy file")
	if len(args) > 0 && config.IsHelp(args[0]) {
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
	if errs := mcp.CheckStdio(*url, key, *policyPath); len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(std.Stderr, "countersign mcp:", err)
		}
		return 2
	}
	f, err := policyfile.Load(*policyPath)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign mcp: %v\n", err)
		return 1
	}
	gctune.Apply(os.Getenv)
	log := slog.New(slog.NewTextHandler(std.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	api := mcp.Clients(*url, &http.Client{Timeout: 2 * time.Minute})
	gw, err := mcp.New(ctx, mcp.Options{Upstreams: mcp.Upstreams(f.MCP, os.Getenv), Prefix: f.MCP.Prefix, API: api, Key: key,
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
