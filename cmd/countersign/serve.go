package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/authzen"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/agent/tracing"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/cmd/countersign/gctune"
	"github.com/countersign/countersign/cmd/countersign/metrics"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/cmd/countersign/server/stepup"
	"github.com/countersign/countersign/store"
)

// Main is one Countersign process: it builds every client (Redis, Slack,
// OpenAI, tools) and wires store, agent and bot together. `serve`, `demo`
// and the end-to-end tests all run this same wiring.
type Main struct {
	Config Config

	// Optional overrides, for the demo and tests. Zero values mean: load
	// Config.ConfigFile, connect to Config.RedisURL, use the process
	// environment for tool templates, real time and a JSON logger.
	Policy *policyfile.File
	Redis  store.Client
	Env    func(string) string
	Now    func() time.Time
	Logger *slog.Logger
	// ShutdownTimeout bounds Close, default 8 s (SIGTERM must exit in 10 s).
	ShutdownTimeout time.Duration
	// ExpiryEvery is how often deadlines are swept, default 1 s.
	ExpiryEvery time.Duration
	// MCPTicker drives the MCP gateway's progress notifications (default
	// a ticker); tests tick it by hand.
	MCPTicker func(d time.Duration) (<-chan time.Time, func())
	// MCPAfter times the MCP gateway's retries of an upstream that failed
	// to start (default a timer); tests fire it by hand.
	MCPAfter func(d time.Duration) (<-chan time.Time, func())
	// AgentTicker drives the agent's run-lease heartbeats and its run
	// adoption (default a ticker); tests tick it by hand.
	AgentTicker func(d time.Duration) (<-chan time.Time, func())
	// Listener, when set, is the listener of Config.Addr, opened already
	// (the demo's, reserved before its workspace started); Main serves on
	// it and closes it.
	Listener net.Listener

	// The parts Start builds and connects, for the end-to-end tests.
	Store *store.Store
	Audit *store.Audit
	API   *api.Server
	Agent *agent.Agent
	Bot   *bot.Bot
	// StepUp is the step-up page (nil without COUNTERSIGN_PUBLIC_URL).
	StepUp *stepup.Page

	// checkpoints signs the audit stream's head for witnesses outside
	// Redis; nil when no signing key is set.
	checkpoints *store.Checkpointer
	front       *server.Server       // the HTTP server: 503 while starting, then the mux
	metrics     *server.Server       // /metrics alone, when COUNTERSIGN_METRICS_ADDR is set; else nil
	mcp         *mcp.Gateway         // nil when the policy lists no MCP upstreams
	extAuthz    *extauthz.Service    // Envoy's ext_authz, gRPC and HTTP
	extGRPC     *extauthz.GRPCServer // gRPC ext_authz and agentgateway's ExtMcp, when COUNTERSIGN_EXTAUTHZ_ADDR is set; else nil
	authZEN     *authzen.Service     // OpenID AuthZEN evaluations and access requests
	// deploymentSecret is the store's (Store.Secret), read once by newAPI.
	deploymentSecret []byte
	traces           *tracing.Provider // nil when trace export is off
	ownRedis         bool

	cancel context.CancelFunc // stops the background loops and the bot's work
	wg     sync.WaitGroup     // the background loops; each exits when ctx ends
}

// resumeEvery is how often a process looks for runs to adopt: a dead
// process's runs are adopted within agent.DefaultLeaseTTL plus resumeEvery
// (8 s; docs/deploy.md).
const resumeEvery = 2 * time.Second

// Start builds everything, checks Slack with auth.test, and starts serving:
// HTTP (health, readiness, metrics and, in HTTP mode, /slack/*), Socket
// Mode when an app token is set, the expiry sweeper, and run adoption. It
// returns once the process is ready; Close stops it.
func (m *Main) Start(ctx context.Context) error {
	m.setDefaults()
	log, cfg := m.Logger, m.Config
	tracer, err := m.startTracing(ctx)
	if err != nil {
		return err
	}
	gate, err := m.loadPolicy()
	if err != nil {
		return err
	}
	// Listen first: while Redis is still coming up, /healthz answers 503
	// (and everything else too) instead of the port being closed.
	if err := m.listen(); err != nil {
		return err
	}
	if err := m.connectRedis(ctx); err != nil {
		return err
	}

	registry := metrics.NewRegistry()
	met := metrics.New(registry)
	runs := m.openStore(registry, met)

	slackHTTP := &http.Client{Transport: bot.Transport(http.DefaultTransport, met), Timeout: 30 * time.Second}
	modelHTTP := &http.Client{Transport: agent.ModelTransport(http.DefaultTransport, met, m.Now), Timeout: 120 * time.Second}
	toolHTTP := &http.Client{Transport: http.DefaultTransport}

	slackClient := bot.NewClient(bot.ClientOptions{APIURL: cfg.SlackAPIURL, BotToken: cfg.SlackBotToken,
		AppToken: cfg.SlackAppToken, HTTPClient: slackHTTP})

	tools, err := agent.HTTPTools(m.Policy, m.Env, toolHTTP)
	if err != nil {
		return fmt.Errorf("tools: %w", err)
	}

	// Webhooks of the HTTP API: told by the lifecycle of every request
	// that became final.
	hooks, err := m.webhooks()
	if err != nil {
		return err
	}

	// Every request transition, whoever asks, goes through the lifecycle
	// owner: record → audit → wake-up → card (drawn by the bot).
	lc, err := approval.NewLifecycle(approval.LifecycleOptions{
		Records: store.NewLedger(m.Store, m.Audit), Gate: gate, Schemas: m.Policy, Scopes: m.Policy, Now: m.Now, Logger: log.With("component", "lifecycle"),
		OnFinal: hooks.Notify,
		// How long an approved request of an outside caller waits to be
		// claimed before it ends abandoned (the caller had gone).
		ClaimWindow: m.Policy.API.ClaimWindow,
	})
	if err != nil {
		return fmt.Errorf("lifecycle: %w", err)
	}

	// Step-up votes: the page that verifies passkeys, and the links and
	// fresh confirmations the lifecycle keeps in the store.
	if m.StepUp, err = m.newStepUp(lc); err != nil {
		return err
	}
	if err := m.newBot(lc, slackClient, slackHTTP); err != nil {
		return err
	}
	lc.SetCards(m.Bot)
	lc.SetDirectory(m.Bot)
	if err := m.newAgent(gate, lc, runs, tools, modelHTTP, tracer); err != nil {
		return err
	}
	if m.API, err = m.newAPI(ctx, lc, tools); err != nil {
		return err
	}

	// Background work outlives ctx (the signal context in serve): Close
	// stops intake first and lets queued Slack work finish before it
	// cancels bg.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel

	if err := m.Bot.Start(bg); err != nil {
		return err // names auth.test itself
	}
	mcpHandler, err := m.startGateways(bg)
	if err != nil {
		return err
	}
	metrics.RegisterMCPUpstreams(registry, func() int { return len(m.mcpUnavailable()) })
	// Signed checkpoints of the audit stream, kept by witnesses outside
	// Redis (run below; one more at shutdown); their alarm is in the
	// metrics and /readyz.
	if m.checkpoints, err = cfg.Checkpointer(m.Audit, slackClient, m.Now, log); err != nil {
		return err
	}
	if m.checkpoints != nil {
		metrics.RegisterCheckpoints(registry, m.checkpoints)
	}
	if err := m.mount(registry, mcpHandler, bot.Ready(slackClient)); err != nil {
		return err
	}

	mode := "http"
	if cfg.SocketMode() {
		mode = "socket"
		m.Bot.StartSocketMode(bg, bot.NewSocketMode(slackClient))
	}
	if err := m.runLoops(bg, lc, hooks, gate, slackClient); err != nil {
		return err
	}

	log.Info("countersign started", "addr", m.Addr(), "mode", mode, "tools", len(tools), "approvals_channel", m.Policy.Slack.ApprovalsChannel)
	return nil
}

// ExtAuthzAddr is the address the gRPC ext_authz listens on (after Start,
// with COUNTERSIGN_EXTAUTHZ_ADDR set); "" when it is not served.
func (m *Main) ExtAuthzAddr() string {
	if m.extGRPC == nil {
		return ""
	}
	return m.extGRPC.Addr()
}

// Addr is the address the HTTP server listens on (after Start).
func (m *Main) Addr() string { return m.front.Addr() }

// MetricsAddr is the address /metrics is served on alone (after Start,
// with COUNTERSIGN_METRICS_ADDR set); "" when it is served on Addr.
func (m *Main) MetricsAddr() string {
	if m.metrics == nil {
		return ""
	}
	return m.metrics.Addr()
}

// Close stops taking new work, finishes acks, and leaves waits durable:
// pending requests stay pending and decidable, and another process (or
// this one, restarted) resumes their runs. It returns within
// ShutdownTimeout.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), m.ShutdownTimeout)
	defer cancel()
	var errs []error
	// 1. Stop taking new work: no new HTTP requests (in-flight ones, acks
	// included, finish), then no new Socket Mode envelopes, and finish the
	// Slack work already queued (card updates after clicks).
	if m.extAuthz != nil { // held checks are denied: their requests stay pending
		m.extAuthz.Close()
	}
	if m.extGRPC != nil {
		m.extGRPC.Stop()
	}
	if m.mcp != nil { // MCP clients' sessions end: their waits stay pending
		errs = append(errs, m.mcp.Close())
	}
	if m.front != nil {
		errs = append(errs, m.front.Shutdown(ctx))
	}
	if m.API != nil { // parked long polls answer now: pending, ask again
		errs = append(errs, m.API.Release(ctx))
	}
	if m.metrics != nil {
		errs = append(errs, m.metrics.Shutdown(ctx))
	}
	if m.Bot != nil {
		errs = append(errs, m.Bot.Shutdown(ctx))
	}
	// 2. Runs stop where they are: waits are abandoned, never rejected (the
	// requests stay pending and decidable), leases are released so another
	// process adopts the runs at once.
	if m.Agent != nil {
		if err := m.Agent.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("agent: %w", err))
		}
	}
	// Spans of the runs that stopped are exported before the process ends.
	errs = append(errs, m.traces.Shutdown(ctx))
	// 3. The background loops (expiry, webhooks, reminders, run adoption)
	// and the bot's work still running.
	if m.cancel != nil {
		m.cancel()
	}
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }() // exits once every loop has returned
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("background loops still running after %s", m.ShutdownTimeout))
	}
	// 4. The last entries are covered by a checkpoint before Redis closes.
	errs = append(errs, finalCheckpoint(ctx, m.checkpoints))
	if m.Store != nil {
		errs = append(errs, m.Store.Close())
	}
	if m.ownRedis && m.Redis != nil {
		errs = append(errs, m.Redis.Close())
	}
	return errors.Join(errs...)
}

// goBackground runs fn as a background loop that Close waits for.
func (m *Main) goBackground(fn func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
}

// runnerFunc adapts a function to bot.Runner.
type runnerFunc func(ctx context.Context, t approval.Task) error

func (f runnerFunc) Handle(ctx context.Context, t approval.Task) error { return f(ctx, t) }

// runServe is `countersign serve`.
func runServe(ctx context.Context, args []string, std Stdio) int {
	if len(args) > 0 {
		if config.IsHelp(args[0]) {
			fmt.Fprint(std.Stdout, serveUsage)
			config.EnvHelp(std.Stdout)
			return 0
		}
		fmt.Fprintf(std.Stderr, "countersign serve: unexpected arguments %q (it is configured from the environment)\n\n%s", args, serveUsage)
		config.EnvHelp(std.Stderr)
		return 2
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(std.Stderr, "countersign serve:", err)
		return 2
	}
	if err := cfg.ValidateServe(); err != nil {
		fmt.Fprintln(std.Stderr, err)
		return 2
	}
	level, _ := config.ParseLevel(cfg.LogLevel)
	logger := slog.New(slog.NewJSONHandler(std.Stderr, &slog.HandlerOptions{Level: level}))
	// go-redis reports each failed dial itself, in plain text: its lines
	// go to the JSON log at debug level (a Redis outage is logged once, by
	// whoever waits for it).
	store.SetLogger(logger.With("component", "go-redis"))
	gctune.Apply(os.Getenv)
	m := &Main{Config: cfg, Logger: logger}
	if err := m.Start(ctx); err != nil {
		logger.Error("start-up failed", "err", err)
		_ = m.Close()
		return 1
	}
	<-ctx.Done()
	logger.Info("shutting down: waits stay durable")
	if err := m.Close(); err != nil {
		logger.Error("shutdown", "err", err)
		return 1
	}
	return 0
}
