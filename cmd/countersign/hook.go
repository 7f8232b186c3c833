package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/hook"
)

const hookUsage = `usage: countersign hook claude-code [--url URL] [--timeout 9m] [--state-dir DIR]

A command hook for Claude Code (docs/claude-code.md). On PreToolUse it reads
the hook's JSON on stdin, asks the running "countersign serve" at --url
for the tool call (a card in Slack unless the policy lets it run), waits,
and prints Claude Code's answer: allow once approved and claimed (with the
edited input after an edit), deny with the reason otherwise, and deny with
what to fix when Countersign cannot be asked. On PostToolUse it reports
what ran. It never lets a call through on its own failure.

  --url URL            the server (default $COUNTERSIGN_URL)
  --timeout D          how long to wait for a decision (default 9m); keep it
                       below the hook's "timeout" in settings.json
  --state-dir DIR      where claims wait for PostToolUse (default
                       $XDG_STATE_HOME/countersign/claude-code)
  COUNTERSIGN_API_KEY  the API key the calls are made with (docs/api.md)
`

// runHook is `countersign hook claude-code`. Its own failures are
// answers (deny, exit 0); only an answer it cannot write exits 2.
func runHook(ctx context.Context, args []string, std Stdio) int {
	if len(args) > 0 && isHelp(args[0]) || len(args) > 1 && args[0] == "claude-code" && isHelp(args[1]) {
		fmt.Fprint(std.Stdout, hookUsage)
		return 0
	}
	if len(args) == 0 || args[0] != "claude-code" {
		fmt.Fprintf(std.Stderr, "countersign hook: want \"claude-code\"\n\n%s", hookUsage)
		return 2
	}
	fs := flag.NewFlagSet("hook claude-code", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, hookUsage) }
	url := fs.String("url", os.Getenv("COUNTERSIGN_URL"), "the Countersign server")
	timeout := fs.Duration("timeout", 9*time.Minute, "how long to wait for a decision")
	stateDir := fs.String("state-dir", hook.StateDir(os.Getenv), "where claims are kept for PostToolUse")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign hook: unexpected arguments %q\n\n%s", fs.Args(), hookUsage)
		return 2
	}
	key := os.Getenv("COUNTERSIGN_API_KEY")
	o := hook.Options{Server: *url, Timeout: *timeout}
	if errs := client.CheckServer(*url, key); len(errs) > 0 {
		var msgs []string
		for _, err := range errs {
			msgs = append(msgs, err.Error())
		}
		o.Problem = strings.Join(msgs, "; ")
	} else {
		c := client.New(*url, key)
		// One long poll lasts at most 30 s; the hook's timeout bounds
		// the whole wait.
		c.HTTP = &http.Client{Timeout: 45 * time.Second}
		o.API = c
	}
	if *stateDir != "" {
		o.Claims = hook.Dir(*stateDir)
	}
	in := std.Stdin
	if in == nil {
		in = os.Stdin
	}
	return hook.Run(ctx, in, std.Stdout, std.Stderr, o)
}
