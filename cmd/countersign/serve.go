package main

import (
	"cmp"
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
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/agent/hook"
	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/agent/tracing"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/gctune"
	"github.com/countersign/countersign/cmd/countersign/metrics"
	"github.com/countersign/countersign/cmd/countersign/server"
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

	auditor *metrics.Auditor
	// checkpoints signs the audit stream's head for witnesses outside
	// Redis; nil when no signing key is set.
	checkpoints *store.Checkpointer
	front       *server.Server       // the HTTP server: 503 while starting, then the mux
	metrics     *server.Server       // /metrics alone, when COUNTERSIGN_METRICS_ADDR is set; else nil
	mcp         *mcp.Gateway         // nil when the policy lists no MCP upstreams
	extAuthz    *extauthz.Service    // Envoy's ext_authz, gRPC and HTTP
	extGRPC     *extauthz.GRPCServer // gRPC ext_authz, when COUNTERSIGN_EXTAUTHZ_ADDR is set; else nil
	traces      *tracing.Provider    // nil when trace export is off
	ownRedis    bool

	cancel context.CancelFunc // stops the background loops and the bot's work
	wg     sync.WaitGroup     // the background loops; each exits when ctx ends
}

// The metrics hear of the Slack and model calls through the interfaces the
// bot's and the agent's transports declare.
var (
	_ bot.SlackCalls   = (*metrics.Metrics)(nil)
	_ agent.ModelCalls = (*metrics.Metrics)(nil)
)

// resumeEvery is how often a process looks for runs to adopt: a dead
// process's runs are adopted within agent.DefaultLeaseTTL plus resumeEvery
// (8 s; docs/deploy.md).
const resumeEvery = 2 * time.Second

// Start builds everything, checks Slack with auth.test, and starts serving:
// HTTP (health, readiness, metrics and, in HTTP mode, /slack/*), Socket
// Mode when an app token is set, the expiry sweeper, and run adoption. It
// returns once the process is ready; Close stops it.
func (m *Main) Start(ctx context.Context) error {
	m.Logger = cmp.Or(m.Logger, slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	m.Now = option.FuncOr(m.Now, time.Now)
	m.Env = option.FuncOr(m.Env, os.Getenv)
	m.ShutdownTimeout = cmp.Or(m.ShutdownTimeout, 8*time.Second)
	m.ExpiryEvery = cmp.Or(m.ExpiryEvery, time.Second)
	// Lines logged with a run's context carry its trace id.
	m.Logger = slog.New(tracing.LogHandler(m.Logger.Handler()))
	log := m.Logger
	cfg := m.Config
	// Trace export when the OTEL_* variables ask for it (agent/tracing).
	var err error
	if m.traces, err = tracing.Start(ctx, os.Getenv, version); err != nil {
		return err
	}
	var tracer agent.Tracer // nil: the agent's no-op tracer
	if m.traces != nil {
		tracing.LogErrors(log.With("component", "tracing"))
		log.Info("trace export on (OTLP/HTTP)", "endpoint", tracing.Endpoint(os.Getenv))
		tracer = m.traces.Tracer()
	}

	if m.Policy == nil {
		if m.Policy, err = policyfile.Load(cfg.ConfigFile); err != nil {
			return fmt.Errorf("COUNTERSIGN_CONFIG %s: %w", cfg.ConfigFile, err)
		}
	}
	gate, err := approval.NewGate(m.Policy.Policy)
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}

	// Listen first: while Redis is still coming up, /healthz answers 503
	// (and everything else too) instead of the port being closed.
	if m.Listener != nil {
		m.front = server.Serve(m.Listener, log)
	} else if m.front, err = server.Listen(cfg.Addr, log); err != nil {
		return fmt.Errorf("COUNTERSIGN_ADDR %s: %w", cfg.Addr, err)
	}
	if cfg.MetricsAddr != "" {
		if m.metrics, err = server.Listen(cfg.MetricsAddr, log); err != nil {
			return fmt.Errorf("COUNTERSIGN_METRICS_ADDR %s: %w", cfg.MetricsAddr, err)
		}
	}

	if m.Redis == nil {
		rdb, err := store.Dial(cfg.RedisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		m.Redis, m.ownRedis = rdb, true
	}
	if err := store.AwaitReady(ctx, m.Redis, cfg.RedisStartTimeout, log); err != nil {
		return fmt.Errorf("REDIS_URL: redis not reachable: %w", err)
	}

	registry := metrics.NewRegistry()
	met := metrics.New(registry)

	m.Store = store.New(m.Redis, store.Options{Prefix: cfg.RedisPrefix, Now: m.Now, Logger: log, WaitReplicas: cfg.RedisWaitReplicas})
	runs := store.NewRuns(m.Redis, store.RunsOptions{Prefix: cfg.RedisPrefix, Now: m.Now})
	m.Audit = store.NewAudit(m.Redis, store.AuditOptions{Stream: cfg.AuditStream, Now: m.Now, Logger: log, Wakes: m.Store})
	m.auditor = metrics.NewAuditor(m.Audit, met)
	// From the indexes: a scrape costs the same with 10,000 pending as with
	// none (reading every pending record per scrape did not).
	metrics.RegisterPendingGauge(registry, m.Store.PendingCount, 2*time.Second)
	metrics.RegisterPendingAges(registry, m.Store.PendingAges, m.Now, 2*time.Second)
	metrics.RegisterAuditStream(registry, m.Audit.Size, 2*time.Second)

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
		Records: m.Store, Audit: m.auditor, Gate: gate, Schemas: m.Policy, Scopes: m.Policy, Now: m.Now, Logger: log.With("component", "lifecycle"),
		Secret:  func(tool string) []string { return m.Policy.Policy.Tools[tool].Secret },
		OnFinal: hooks.Notify,
		// How long an approved request of an outside caller waits to be
		// claimed before it ends abandoned (the caller had gone).
		ClaimWindow: m.Policy.API.ClaimWindow,
	})
	if err != nil {
		return fmt.Errorf("lifecycle: %w", err)
	}

	// The bot hands tasks to the agent and the agent posts through the bot;
	// the closure breaks the construction cycle.
	var ag *agent.Agent
	b, err := bot.New(bot.Options{
		Slack:         slackClient,
		Requests:      m.Store,
		Lifecycle:     lc,
		HTTPClient:    slackHTTP,
		Runner:        runnerFunc(func(ctx context.Context, t approval.Task) error { return ag.Handle(ctx, t) }),
		Policy:        m.Policy,
		Now:           m.Now,
		Logger:        log.With("component", "bot"),
		SigningSecret: cfg.SlackSigningSecret,
		CardSettle:    bot.DefaultCardSettle,
	})
	if err != nil {
		return fmt.Errorf("bot: %w", err)
	}
	m.Bot = b
	lc.SetCards(b)
	lc.SetDirectory(b)
	ag, err = agent.New(agent.Options{
		Model:           agent.NewOpenAI(cfg.OpenAIBaseURL, cfg.OpenAIAPIKey, modelHTTP),
		ModelName:       cfg.OpenAIModel,
		Gate:            gate,
		Lifecycle:       lc,
		Requests:        m.Store,
		Runs:            runs,
		Notifier:        b,
		Auditor:         m.auditor,
		Tools:           tools,
		SystemPrompt:    m.Policy.Agent.SystemPrompt,
		MaxSteps:        m.Policy.Agent.MaxSteps,
		StopOnRejection: m.Policy.Agent.StopOnRejection,
		Templates:       m.Policy.Agent.Templates,
		Now:             m.Now,
		Ticker:          m.AgentTicker,
		Logger:          log.With("component", "agent"),
		Tracer:          tracer,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	m.Agent = ag

	if m.API, err = m.newAPI(ctx, lc, tools); err != nil {
		return err
	}

	// Background work outlives ctx (the signal context in serve): Close
	// stops intake first and lets queued Slack work finish before it
	// cancels bg.
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel = cancel

	if err := b.Start(bg); err != nil {
		return err // names auth.test itself
	}

	mcpHandler, err := m.newMCP(bg)
	if err != nil {
		return fmt.Errorf("mcp gateway: %w", err)
	}
	// Envoy's ext_authz asks the API in this process, as the MCP gateway
	// does: the caller's key, rate limit and audit are the API's.
	if m.extAuthz, err = extauthz.New(extauthz.Options{API: extAuthzAPI(m.API.Handler()), PrefixTools: m.Policy.MCP.Prefix, Waiter: m.Store, Logger: log.With("component", "ext_authz")}); err != nil {
		return err
	}
	if cfg.ExtAuthzAddr != "" {
		ln, err := server.ListenGRPC(cfg.ExtAuthzAddr)
		if err != nil {
			return fmt.Errorf("COUNTERSIGN_EXTAUTHZ_ADDR %s: %w", cfg.ExtAuthzAddr, err)
		}
		m.extGRPC = m.extAuthz.ServeGRPC(ln)
	}
	metrics.RegisterMCPUpstreams(registry, func() int { return len(m.mcpUnavailable()) })
	// Signed checkpoints of the audit stream, kept by witnesses outside
	// Redis (run below; one more at shutdown); their alarm is in the
	// metrics and /readyz.
	if m.checkpoints, err = cfg.checkpointer(m.Audit, slackClient, m.Now, log); err != nil {
		return err
	}
	if m.checkpoints != nil {
		metrics.RegisterCheckpoints(registry, m.checkpoints)
	}
	routes := server.Routes{
		Live: server.ReadyHandler(), // no checks: liveness
		// A dead MCP upstream is a detail, not a failure: the replica serves
		// everything else, and leaving service would not revive it. So is a
		// checkpoint alarm (checkpointAlarm).
		Ready: server.ReadyWithDetails([]server.Check{server.Named("redis", store.Ready(m.Redis)),
			server.Named("slack", server.Cached(bot.Ready(slackClient), 30*time.Second, m.Now))}, m.mcpUnavailable, m.checkpointAlarm),
		API:        m.API.Handler(),
		HumanLayer: m.API.HumanLayerHandler(),
		MCP:        mcpHandler,
		// Claude Code's http hook: it calls the API above in process.
		Hooks:    hook.HTTP(hook.HTTPOptions{API: m.API.Handler(), Logger: log.With("component", "hooks")}),
		ExtAuthz: m.extAuthz.HTTP(),
	}
	// /metrics is on the main port unless it has one of its own; the
	// probes stay on the main port: they must show that the port serving
	// Slack and the API answers.
	if m.metrics != nil {
		m.metrics.Ready(server.MetricsOnly(metrics.Handler(registry)))
	} else {
		routes.Metrics = metrics.Handler(registry)
	}
	if cfg.AuditView {
		if routes.Audit, err = m.newAuditView(); err != nil {
			return err
		}
	}
	if !cfg.socketMode() {
		routes.Slack = b.HTTPHandler()
	}
	m.front.Ready(server.Mux(routes))

	mode := "http"
	if cfg.socketMode() {
		mode = "socket"
		b.StartSocketMode(bg, bot.NewSocketMode(slackClient))
	}

	// Deadlines pass even when no process waits on a request: any replica
	// sweeps, each expiry happens once, and the card and thread are told.
	m.goBackground(func() { _ = lc.RunExpiry(bg, m.ExpiryEvery) })
	m.goBackground(func() { hooks.Run(bg) })
	// Refusals without a valid key are audited once a minute per source.
	m.goBackground(func() { m.API.RunRefusals(bg) })
	// Requests of hooks that went away (their long poll dropped and did
	// not come back within the grace period) are withdrawn.
	m.goBackground(func() { m.API.RunWithdrawals(bg) })
	// Reminders and escalations: any replica may send one; the store lets
	// exactly one claim each.
	rem := &bot.Reminders{Store: m.Store, Lifecycle: lc, Cards: b, Policy: gate, Now: m.Now,
		Log: log.With("component", "reminders")}
	m.goBackground(func() { rem.Run(bg) })
	// Adopt runs whose owner died: at once, then every resumeEvery.
	m.goBackground(func() { _ = ag.ResumeEvery(bg, resumeEvery) })
	// The checkpointer follows the audit stream and signs it (built above).
	if m.checkpoints != nil {
		m.goBackground(func() { m.checkpoints.Run(bg) })
	}

	log.Info("countersign started", "addr", m.Addr(), "mode", mode, "tools", len(tools), "approvals_channel", m.Policy.Slack.ApprovalsChannel)
	return nil
}

// extAuthzAPI is extauthz.Options.API: a /v1 client per key, reaching the
// API handler h in this process (mcp.InProcess: no socket).
func extAuthzAPI(h http.Handler) func(key string) extauthz.API {
	hc := mcp.InProcess(h)
	return func(key string) extauthz.API {
		c := client.New("http://countersign.internal", key)
		c.HTTP = hc
		return c
	}
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
		if isHelp(args[0]) {
			fmt.Fprint(std.Stdout, serveUsage)
			envHelp(std.Stdout)
			return 0
		}
		fmt.Fprintf(std.Stderr, "countersign serve: unexpected arguments %q (it is configured from the environment)\n\n%s", args, serveUsage)
		envHelp(std.Stderr)
		return 2
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(std.Stderr, "countersign serve:", err)
		return 2
	}
	if err := cfg.validateServe(); err != nil {
		fmt.Fprintln(std.Stderr, err)
		return 2
	}
	level, _ := parseLevel(cfg.LogLevel)
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
