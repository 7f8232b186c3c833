package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/cmd/countersign/gctune"
	"github.com/countersign/countersign/store"
)

// Demo is `countersign demo`: the demo world (package demo) with the
// process of `serve` (Main) running in it.
type Demo struct {
	demo.World
	// MCPTicker drives the MCP gateway's progress notifications (tests).
	MCPTicker func(d time.Duration) (<-chan time.Time, func())
	// MCPAfter times the gateway's retries of an upstream that failed to
	// start (tests).
	MCPAfter func(d time.Duration) (<-chan time.Time, func())
	// AgentTicker drives the agent's lease heartbeats and run adoption
	// (tests).
	AgentTicker func(d time.Duration) (<-chan time.Time, func())
	// SlackAPI, when set, turns the workspace's Slack API URL into the one
	// the process calls (benchmarks: a proxy that answers as slowly as
	// Slack does).
	SlackAPI func(url string) string
	// WithdrawGrace, when set, is the API's grace period for a hook that
	// went away (COUNTERSIGN_API_WITHDRAW_GRACE; tests shorten it).
	WithdrawGrace time.Duration
	// Configure, when set, changes the settings before Main starts
	// (tests: an identity provider's).
	Configure func(*Config)
	// Main is the process, set by Start.
	Main *Main
}

// Start starts the world, then Main on the world's settings; it returns
// once both serve.
func (d *Demo) Start(ctx context.Context) error {
	if err := d.World.Start(); err != nil {
		return err
	}
	s := d.Settings
	if d.SlackAPI != nil {
		s.SlackAPIURL = d.SlackAPI(s.SlackAPIURL)
	}
	cfg := Config{
		SlackBotToken: s.SlackBotToken, SlackAppToken: s.SlackAppToken, SlackSigningSecret: s.SlackSigningSecret,
		SlackAPIURL: s.SlackAPIURL, Addr: s.Addr, RedisPrefix: d.Prefix, AuditStream: d.Prefix + ":{audit}",
		OpenAIAPIKey: s.ModelKey, OpenAIBaseURL: s.ModelURL, OpenAIModel: s.ModelName, LogLevel: "warn",
		AuditView: true, AuditViewUser: s.AuditViewUser, AuditViewPassword: s.AuditViewPassword, SlackWorkspaceURL: s.WorkspaceURL,
		AuditSigningKey: s.AuditSigningKey, AuditWitnessFile: s.AuditWitnessFile,
		AuditCheckpointEvery: store.DefaultCheckpointEvery, AuditCheckpointInterval: store.DefaultCheckpointInterval,
		APIWithdrawGrace: d.WithdrawGrace,
		ExtAuthzAddr:     demo.FreePortBeside(s.Addr),
	}
	if s.AuditSigningKey != "" {
		// The key is new each run: a checkpoint an earlier run left in
		// this Redis (REDIS_URL) is signed by a key that is gone. Start a
		// new chain instead of refusing it.
		if err := store.ForgetCheckpoints(ctx, store.NewAudit(d.Redis, store.AuditOptions{Stream: cfg.AuditStream})); err != nil {
			return err
		}
	}
	ln := d.TakeListener()
	cfg.PublicURL = demo.PublicURL(ln, s.Addr)
	if d.Configure != nil {
		d.Configure(&cfg)
	}
	d.Main = &Main{Config: cfg, Policy: d.Policy, Redis: d.Redis, Env: d.Env, Now: d.Now, Logger: d.Logger,
		ExpiryEvery: 500 * time.Millisecond, MCPTicker: d.MCPTicker, MCPAfter: d.MCPAfter,
		AgentTicker: d.AgentTicker, Listener: ln}
	if err := d.Main.Start(ctx); err != nil {
		_ = d.Main.Close()
		return err
	}
	d.OnClose(d.Main.Close)
	d.World.ExtAuthzAddr = d.Main.ExtAuthzAddr()
	return nil
}

// StepUpURL is the demo's step-up page.
func (d *Demo) StepUpURL() string { return d.Main.Config.PublicURL + "/stepup/" }

// AuditURL is the audit view (always on in the demo), with its user and
// password (the demo's are printed; a real deployment's never are).
func (d *Demo) AuditURL() (url, user, password string) {
	return "http://" + d.Main.Addr() + "/audit/", d.Main.Config.AuditViewUser, d.Main.Config.AuditViewPassword
}

const demoUsage = `usage: countersign demo [--addr host:port] [--http] [--config policy.yaml]

Runs the whole product on this machine: an embedded Redis (or REDIS_URL),
a local Slack workspace in the browser, a demo order system, and a scripted
offline model (or your OPENAI_API_KEY / OPENAI_BASE_URL / OPENAI_MODEL).
The policy is the demo's own (cmd/countersign/demo/policy.yaml) unless
--config names yours; its tools can call the demo's order system at
{{env "SOR_URL"}}. Keys are prefixed countersign-demo (or
COUNTERSIGN_REDIS_PREFIX). Ctrl-C stops it.

flags:
`

// runDemo is `countersign demo`.
func runDemo(ctx context.Context, args []string, std Stdio) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), demoUsage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:3000", "address of the workspace page")
	httpMode := fs.Bool("http", false, "deliver events over signed HTTP instead of Socket Mode")
	policyPath := fs.String("config", "", "a policy/tools file to use instead of the demo's")
	if len(args) > 0 && config.IsHelp(args[0]) {
		fs.SetOutput(std.Stdout)
		fs.Usage()
		return 0
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign demo: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		return 2
	}
	d := &Demo{World: demo.World{
		Addr: *addr, HTTPDelivery: *httpMode, RedisURL: cfg.RedisURL, PolicyFile: *policyPath, Command: demo.Self(),
		OpenAIAPIKey: cfg.OpenAIAPIKey, OpenAIBaseURL: cfg.OpenAIBaseURL, OpenAIModel: os.Getenv("OPENAI_MODEL"),
		Checkpoints: true, // every user sees the signed audit trail
	}}
	if _, set := os.LookupEnv("COUNTERSIGN_REDIS_PREFIX"); set {
		d.Prefix = cfg.RedisPrefix
	}
	// Run from a checkout, the local workspace grants exactly what the
	// app's manifest.yml grants, as a real workspace would.
	if m, err := slacksim.ReadManifest("manifest.yml"); err == nil {
		d.Manifest = m
	} else if !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(std.Stderr, "countersign demo: manifest.yml:", err)
		return 2
	}
	gctune.Apply(os.Getenv)
	if err := d.Start(ctx); err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		_ = d.Close()
		return 1
	}
	d.Welcome(std.Stdout, d.Main.Addr())
	<-ctx.Done()
	fmt.Fprintln(std.Stdout, "stopping…")
	if err := d.Close(); err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		return 1
	}
	return 0
}
