// Package claudecode is `countersign hook claude-code`: the command hook
// of Claude Code (flags and settings read into agent/hook's Options, then
// hook.Run) and its doctor (the claude CLI's version, its settings files
// and the policy's deadlines, judged by hook.Doctor).
package claudecode

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/hook"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/cmd/countersign/config"
)

const hookUsage = `usage: countersign hook claude-code [--url URL] [--timeout 9m] [--state-dir DIR] [--defer [--defer-after D]]
       countersign hook claude-code doctor [--claude PATH] [--settings FILE]... [--policy FILE] [--url URL]

A command hook for Claude Code (docs/claude-code.md; Claude Code ` + hook.MinVersion + ` or
later). On PreToolUse it reads the hook's JSON on stdin, asks the running
"countersign serve" at --url for the tool call (a card in Slack unless the
policy lets it run), waits, and prints Claude Code's answer: allow once
approved and claimed (with the edited input after an edit), deny with the
reason otherwise, and deny with what to fix when Countersign cannot be
asked. When it gives up (its --timeout, or Claude Code stops it) it
withdraws the request: the card says the caller gave up. On PostToolUse it
reports what ran. It never lets a call through on its own failure.

  --url URL            the server (default $COUNTERSIGN_URL)
  --timeout D          how long to wait for a decision (default 9m); keep it
                       below the hook's "timeout" in settings.json
  --state-dir DIR      where claims wait for PostToolUse (default
                       $XDG_STATE_HOME/countersign/claude-code)
  --defer              claude -p only: answer "defer" while no one has
                       decided (the session ends; claude -p --resume asks again)
  --defer-after D      with --defer, wait this long for a decision first (default 0)
  COUNTERSIGN_API_KEY  the API key the calls are made with (docs/api.md)

doctor checks the installation: the claude CLI's version (` + hook.MinVersion + ` or later),
the hooks in its settings files (onFailure "block"; Claude Code's timeout above
the hook's wait, which is above the policy's deadlines) and the API key, and
says exactly what to change. Exit 0 when all is well, 1 otherwise.

  --claude PATH        the claude CLI (default claude on PATH)
  --settings FILE      a settings file to check besides the user's, the
                       project's and the managed one (e.g. a claude -p run's)
  --policy FILE        the server's policy file (default $COUNTERSIGN_CONFIG)
`

// Run is `countersign hook claude-code` (args without "hook"). Its own
// failures are answers (deny, exit 0); only an answer it cannot write
// exits 2.
func Run(ctx context.Context, args []string, std config.Stdio) int {
	if len(args) > 0 && config.IsHelp(args[0]) || len(args) > 1 && args[0] == "claude-code" && config.IsHelp(args[1]) {
		fmt.Fprint(std.Stdout, hookUsage)
		return 0
	}
	if len(args) == 0 || args[0] != "claude-code" {
		fmt.Fprintf(std.Stderr, "countersign hook: want \"claude-code\"\n\n%s", hookUsage)
		return 2
	}
	if len(args) > 1 && args[1] == "doctor" {
		return runHookDoctor(ctx, args[2:], std)
	}
	fs := flag.NewFlagSet("hook claude-code", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, hookUsage) }
	url := fs.String("url", os.Getenv("COUNTERSIGN_URL"), "the Countersign server")
	timeout := fs.Duration("timeout", hook.DefaultTimeout, "how long to wait for a decision")
	stateDir := fs.String("state-dir", hook.StateDir(os.Getenv), "where claims are kept for PostToolUse")
	deferred := fs.Bool("defer", false, "answer defer while no one has decided (claude -p)")
	deferAfter := fs.Duration("defer-after", 0, "with --defer, how long to wait before deferring")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign hook: unexpected arguments %q\n\n%s", fs.Args(), hookUsage)
		return 2
	}
	key := os.Getenv("COUNTERSIGN_API_KEY")
	o := hook.Options{Server: *url, Timeout: *timeout, Defer: *deferred, DeferAfter: *deferAfter}
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
		// A hook killed while waiting (SIGKILL: it cannot withdraw its
		// request itself) is withdrawn by the server once its poll drops
		// and no other follows. A deferring hook leaves on purpose.
		c.WithdrawIfGone = !*deferred
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

// runHookDoctor is `countersign hook claude-code doctor`.
func runHookDoctor(ctx context.Context, args []string, std config.Stdio) int {
	fs := flag.NewFlagSet("hook claude-code doctor", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, hookUsage) }
	claude := fs.String("claude", "claude", "the claude CLI")
	var extra []string
	fs.Func("settings", "a settings file to check (repeatable)", func(v string) error {
		extra = append(extra, v)
		return nil
	})
	policy := fs.String("policy", os.Getenv("COUNTERSIGN_CONFIG"), "the server's policy file")
	url := fs.String("url", os.Getenv("COUNTERSIGN_URL"), "the Countersign server")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign hook claude-code doctor: unexpected arguments %q\n\n%s", fs.Args(), hookUsage)
		return 2
	}
	o := hook.DoctorOptions{Version: func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, *claude, "--version").Output()
		if err != nil {
			return "", fmt.Errorf("%s: %w", *claude, err)
		}
		return string(out), nil
	}}
	var problems []string
	for _, p := range claudeSettings(os.Getenv) {
		o.Settings, problems = readSettings(o.Settings, problems, p, true)
	}
	for _, p := range extra {
		o.Settings, problems = readSettings(o.Settings, problems, p, false)
	}
	var keyTools []string // the key's tools narrow the policy's deadlines that matter
	if key := os.Getenv("COUNTERSIGN_API_KEY"); *url != "" && key != "" {
		c := client.New(*url, key)
		c.HTTP = &http.Client{Timeout: 10 * time.Second}
		k, err := c.Self(ctx)
		if err != nil {
			err = fmt.Errorf("GET %s/v1/keys/self: %w", *url, err)
		} else {
			keyTools = k.Tools
		}
		o.Self = func(context.Context) (string, []string, error) {
			if err != nil {
				return "", nil, err
			}
			return k.Name, k.Tools, nil
		}
	}
	if *policy != "" {
		f, err := policyfile.Load(*policy)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--policy %s: %v", *policy, err))
		} else {
			o.Waits = policyWaits(f.Policy, keyTools)
		}
	}
	for _, p := range problems {
		fmt.Fprintln(std.Stdout, "FIX", p)
	}
	if !hook.WriteFindings(std.Stdout, hook.Doctor(ctx, o)) || len(problems) > 0 {
		return 1
	}
	return 0
}

// policyWaits are the deadlines of the tools a person reviews that the
// key may ask for (every one when tools is nil or holds "*"), and the
// external rule's for any other tool.
func policyWaits(p approval.Policy, tools []string) []hook.PolicyWait {
	all := tools == nil || slices.Contains(tools, "*")
	waits := []hook.PolicyWait{}
	deadline := func(t time.Duration) time.Duration {
		if t > 0 {
			return t
		}
		return api.DefaultTimeout
	}
	for name, t := range p.Tools {
		if t.Review == approval.ReviewNever || !all && !slices.Contains(tools, name) {
			continue
		}
		waits = append(waits, hook.PolicyWait{Tool: name, Timeout: deadline(t.Timeout)})
	}
	if p.External != nil && all && p.External.Review != approval.ReviewNever {
		waits = append(waits, hook.PolicyWait{Tool: "external (any other tool)", Timeout: deadline(p.External.Timeout)})
	}
	return waits
}

// claudeSettings are the settings files Claude Code reads besides a
// --settings file: the user's ($CLAUDE_CONFIG_DIR or ~/.claude), the
// project's and the local ones of the working directory, and the
// managed one.
func claudeSettings(getenv func(string) string) []string {
	dir := getenv("CLAUDE_CONFIG_DIR")
	if dir == "" {
		dir = filepath.Join(getenv("HOME"), ".claude")
	}
	out := []string{filepath.Join(dir, "settings.json"), filepath.Join(".claude", "settings.json"), filepath.Join(".claude", "settings.local.json")}
	switch runtime.GOOS {
	case "darwin":
		out = append(out, "/Library/Application Support/ClaudeCode/managed-settings.json")
	case "windows":
		out = append(out, `C:\Program Files\ClaudeCode\managed-settings.json`)
	default:
		out = append(out, "/etc/claude-code/managed-settings.json")
	}
	return out
}

// readSettings adds the settings file at path, when it exists.
func readSettings(files []hook.SettingsFile, problems []string, path string, interactive bool) ([]hook.SettingsFile, []string) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && interactive:
		return files, problems
	case err != nil:
		return files, append(problems, fmt.Sprintf("%s: %v", path, err))
	}
	return append(files, hook.SettingsFile{Path: path, Data: b, Interactive: interactive}), problems
}
