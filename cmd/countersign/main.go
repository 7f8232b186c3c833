// Command countersign runs Countersign: a Slack bot that puts a human
// between an LLM agent and the tools it wants to call.
//
//	countersign serve            run against a real Slack workspace
//	countersign demo             run everything locally, with a Slack-like page in the browser
//	countersign check [--slack] [file]  validate a policy/tools file
//	countersign mcp              the MCP gateway over stdio (docs/mcp.md)
//	countersign hook claude-code a Claude Code hook, and its doctor (docs/claude-code.md)
//	countersign audit ...        read and verify the audit stream
//	countersign policy ...       replay a candidate policy against the audit, suggest rules
//	countersign healthcheck      ask a running serve whether it is ready (container health checks)
//	countersign version
//
// This package is wiring only: Main builds every client and connects the
// packages for serve and demo, the demo world is package
// cmd/countersign/demo, the environment is read by cmd/countersign/config,
// and every other subcommand's body is the package named for it below
// cmd/countersign (audit, policy, check, healthcheck, mcpstdio for mcp,
// claudecode for hook claude-code), Run here only picks one. Its end-to-end tests
// (package main_test) run the exported Main, Demo and Run.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/countersign/countersign/cmd/countersign/audit"
	"github.com/countersign/countersign/cmd/countersign/check"
	"github.com/countersign/countersign/cmd/countersign/claudecode"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/cmd/countersign/healthcheck"
	"github.com/countersign/countersign/cmd/countersign/mcpstdio"
	"github.com/countersign/countersign/cmd/countersign/policy"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Stdio is where a subcommand writes its output; tests pass their own.
type Stdio = config.Stdio

// Config is the process configuration, read once from the environment
// (config.Config).
type Config = config.Config

func main() {
	os.Exit(RunProcess(os.Args[1:]))
}

// RunProcess runs args (without the program name) as this process: SIGINT
// and SIGTERM cancel the command's context, and it writes to the process's
// stdout and stderr. It returns the exit code. The process tests run their
// test binary as the command through it.
func RunProcess(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, Stdio{Stdout: os.Stdout, Stderr: os.Stderr})
}

const usage = `usage: countersign <command> [arguments]

commands:
  serve              run the bot against Slack (configured from the environment)
  demo               run the whole product locally: embedded Redis, a local Slack
                     workspace in the browser, a demo system of record
  check [file]       validate a policy/tools file (default $COUNTERSIGN_CONFIG);
                     --slack also looks its Slack ids and names up
  mcp                the MCP gateway over stdio, gating tool calls through a server
  hook claude-code   a Claude Code PreToolUse hook asking a server before each tool call
                     (hook claude-code doctor: check the set-up)
  audit <sub>        tail | show <request-id> | verify | export | stats
  policy <sub>       replay CANDIDATE.yaml | suggest: tune the policy from the audit
  healthcheck [path] exit 0 when this machine's serve answers /readyz (or path) with 200
  version            print the version
`

const serveUsage = `usage: countersign serve

Runs the bot against Slack: Socket Mode when SLACK_APP_TOKEN is set, else
signed HTTP on COUNTERSIGN_ADDR (/slack/events, /slack/interactive,
/slack/commands). Also serves /healthz, /readyz and /metrics. Configured
from the environment; each missing or contradictory setting is reported on
one line naming its variable. SIGTERM stops it; waits stay durable.

`

// Run runs the command line args (without the program name) and returns
// the process exit code; main passes the process's, tests their own.
func Run(ctx context.Context, args []string, std Stdio) int {
	if len(args) == 0 {
		fmt.Fprint(std.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return runServe(ctx, args[1:], std)
	case "demo":
		return runDemo(ctx, args[1:], std)
	case "check":
		return check.Run(ctx, args[1:], std)
	case "mcp":
		return mcpstdio.Run(ctx, args[1:], std, version)
	case "hook":
		return claudecode.Run(ctx, args[1:], std)
	case "audit":
		return audit.Run(ctx, args[1:], std)
	case "policy":
		return policy.Run(ctx, args[1:], std)
	case "healthcheck":
		return healthcheck.Run(ctx, args[1:], std)
	case "version", "--version", "-v":
		fmt.Fprintln(std.Stdout, "countersign", version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(std.Stdout, usage)
		return 0
	default:
		fmt.Fprintf(std.Stderr, "countersign: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
