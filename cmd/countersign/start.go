package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/authzen"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/agent/extauthz/extmcp"
	"github.com/countersign/countersign/agent/hook"
	"github.com/countersign/countersign/agent/tracing"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/approval/weekly"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/metrics"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/store"
)

// The steps of Main.Start, in the order it takes them.

// setDefaults fills what the caller left zero: a JSON logger (whose lines
// logged with a run's context carry its trace id), real time, the
// process environment, the shutdown bound and the expiry sweep.
func (m *Main) setDefaults() {
	m.Logger = cmp.Or(m.Logger, slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	m.Now = option.FuncOr(m.Now, time.Now)
	m.Env = option.FuncOr(m.Env, os.Getenv)
	m.ShutdownTimeout = cmp.Or(m.ShutdownTimeout, 8*time.Second)
	m.ExpiryEvery = cmp.Or(m.ExpiryEvery, time.Second)
	// Lines logged with a run's context carry its trace id.
	m.Logger = slog.New(tracing.LogHandler(m.Logger.Handler()))
}

// startTracing starts trace export when the OTEL_* variables ask for it
// (agent/tracing) and returns the agent's tracer: nil, the agent's no-op
// tracer, when export is off.
func (m *Main) startTracing(ctx context.Context) (agent.Tracer, error) {
	var err error
	if m.traces, err = tracing.Start(ctx, os.Getenv, version); err != nil {
		return nil, err
	}
	if m.traces == nil {
		return nil, nil
	}
	tracing.LogErrors(m.Logger.With("component", "tracing"))
	m.Logger.Info("trace export on (OTLP/HTTP)", "endpoint", tracing.Endpoint(os.Getenv))
	return m.traces.Tracer(), nil
}

// loadPolicy loads COUNTERSIGN_CONFIG unless the caller gave a policy, and
// compiles its gate.
func (m *Main) loadPolicy() (*approval.Gate, error) {
	if m.Policy == nil {
		var err error
		if m.Policy, err = policyfile.Load(m.Config.ConfigFile); err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_CONFIG %s: %w", m.Config.ConfigFile, err)
		}
	}
	gate, err := approval.NewGate(m.Policy.Policy)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return gate, nil
}

// listen opens the front server (on the caller's listener when given)
// and, with COUNTERSIGN_METRICS_ADDR, the metrics server: both answer 503
// until they are told what to serve.
func (m *Main) listen() error {
	cfg, log := m.Config, m.Logger
	var err error
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
	return nil
}

// connectRedis dials REDIS_URL unless the caller gave a client, and waits
// up to COUNTERSIGN_REDIS_START_TIMEOUT for it to answer.
func (m *Main) connectRedis(ctx context.Context) error {
	if m.Redis == nil {
		rdb, err := store.Dial(m.Config.RedisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		m.Redis, m.ownRedis = rdb, true
	}
	if err := store.AwaitReady(ctx, m.Redis, m.Config.RedisStartTimeout, m.Logger); err != nil {
		return fmt.Errorf("REDIS_URL: redis not reachable: %w", err)
	}
	return nil
}

// openStore builds the store, the runs, the audit stream and its
// metrics, and registers the gauges read from them; it returns the runs.
func (m *Main) openStore(registry *metrics.Registry, met *metrics.Metrics) *store.Runs {
	cfg, log := m.Config, m.Logger
	m.Store = store.New(m.Redis, store.Options{Prefix: cfg.RedisPrefix, Now: m.Now, Logger: log, WaitReplicas: cfg.RedisWaitReplicas})
	runs := store.NewRuns(m.Redis, store.RunsOptions{Prefix: cfg.RedisPrefix, Now: m.Now})
	// The metrics observe what the audit wrote, after the fact: nothing on
	// the way to Redis passes through them.
	m.Audit = store.NewAudit(m.Redis, store.AuditOptions{Stream: cfg.AuditStream, Now: m.Now, Logger: log, Wakes: m.Store,
		Observer: metrics.NewAuditor(met)})
	// From the indexes: a scrape costs the same with 10,000 pending as with
	// none (reading every pending record per scrape did not).
	metrics.RegisterPendingGauge(registry, m.Store.PendingCount, 2*time.Second)
	metrics.RegisterPendingAges(registry, m.Store.PendingAges, m.Now, 2*time.Second)
	metrics.RegisterAuditStream(registry, m.Audit.Size, 2*time.Second)
	return runs
}

// newBot builds the bot (m.Bot). The bot hands tasks to the agent and the
// agent posts through the bot: the runner reaches m.Agent, built next,
// which breaks the construction cycle.
func (m *Main) newBot(lc *approval.Lifecycle, slackClient bot.Slack, slackHTTP *http.Client) error {
	b, err := bot.New(bot.Options{
		Slack:         slackClient,
		Requests:      m.Store,
		Lifecycle:     lc,
		HTTPClient:    slackHTTP,
		Runner:        runnerFunc(func(ctx context.Context, t approval.Task) error { return m.Agent.Handle(ctx, t) }),
		Policy:        m.Policy,
		Now:           m.Now,
		Logger:        m.Logger.With("component", "bot"),
		SigningSecret: m.Config.SlackSigningSecret,
		CardSettle:    bot.DefaultCardSettle,
		StepUp:        stepUpOffers(m.StepUp),
	})
	if err != nil {
		return fmt.Errorf("bot: %w", err)
	}
	m.Bot = b
	if m.StepUp != nil {
		m.StepUp.SetNames(b)
	}
	return nil
}

// newAgent builds the agent (m.Agent): the model, the gate and the
// lifecycle it asks through, its runs, and the tools it calls.
func (m *Main) newAgent(gate *approval.Gate, lc *approval.Lifecycle, runs *store.Runs, tools []agent.Tool, modelHTTP *http.Client, tracer agent.Tracer) error {
	cfg := m.Config
	ag, err := agent.New(agent.Options{
		Model:           agent.NewOpenAI(cfg.OpenAIBaseURL, cfg.OpenAIAPIKey, modelHTTP),
		ModelName:       cfg.OpenAIModel,
		Gate:            gate,
		Lifecycle:       lc,
		Requests:        m.Store,
		Runs:            runs,
		Notifier:        m.Bot,
		Auditor:         m.Audit,
		Tools:           tools,
		SystemPrompt:    m.Policy.Agent.SystemPrompt,
		MaxSteps:        m.Policy.Agent.MaxSteps,
		StopOnRejection: m.Policy.Agent.StopOnRejection,
		Templates:       m.Policy.Agent.Templates,
		Now:             m.Now,
		Ticker:          m.AgentTicker,
		Logger:          m.Logger.With("component", "agent"),
		Tracer:          tracer,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	m.Agent = ag
	return nil
}

// startGateways builds the gateways that ask the API in this process: the
// MCP gateway (its handler; nil without upstreams), Envoy's ext_authz,
// whose gRPC server listens on COUNTERSIGN_EXTAUTHZ_ADDR when it is set,
// and AuthZEN.
func (m *Main) startGateways(bg context.Context) (mcpHandler http.Handler, err error) {
	if mcpHandler, err = m.newMCP(bg); err != nil {
		return nil, fmt.Errorf("mcp gateway: %w", err)
	}
	// Envoy's ext_authz asks the API in this process, as the MCP gateway
	// does: the caller's key, rate limit and audit are the API's.
	if m.extAuthz, err = extauthz.New(extauthz.Options{API: client.PerKey[extauthz.API](m.API.Handler()), PrefixTools: m.Policy.MCP.Prefix, Waiter: m.Store, Logger: m.Logger.With("component", "ext_authz")}); err != nil {
		return nil, err
	}
	if addr := m.Config.ExtAuthzAddr; addr != "" {
		ln, err := server.ListenGRPC(addr)
		if err != nil {
			return nil, fmt.Errorf("COUNTERSIGN_EXTAUTHZ_ADDR %s: %w", addr, err)
		}
		// agentgateway's ExtMcp processor on the same listener, gating
		// through the same core.
		m.extGRPC = m.extAuthz.ServeGRPC(ln, extmcp.New(m.extAuthz, m.Logger.With("component", "ext_mcp")).Register)
	}
	// AuthZEN asks the API in this process too; its binding tokens are
	// keyed by the deployment's secret, so every replica checks them.
	if m.authZEN, err = authzen.New(authzen.Options{API: client.PerKey[authzen.API](m.API.Handler()), Secret: m.deploymentSecret,
		Now: m.Now, Logger: m.Logger.With("component", "authzen")}); err != nil {
		return nil, err
	}
	return mcpHandler, nil
}

// mount fills server.Routes with every handler and tells the front server
// (and the metrics server, when /metrics has its own port) to serve them.
// slackReady is /readyz's check of Slack (bot.Ready).
func (m *Main) mount(registry *metrics.Registry, mcpHandler http.Handler, slackReady func(context.Context) error) error {
	routes := server.Routes{
		Live: server.ReadyHandler(), // no checks: liveness
		// A dead MCP upstream is a detail, not a failure: the replica serves
		// everything else, and leaving service would not revive it. So is a
		// checkpoint alarm (checkpointAlarm).
		Ready: server.ReadyWithDetails([]server.Check{server.Named("redis", store.Ready(m.Redis)),
			server.Named("slack", server.Cached(slackReady, 30*time.Second, m.Now))}, m.mcpUnavailable, m.checkpointAlarm),
		API:        m.API.Handler(),
		HumanLayer: m.API.HumanLayerHandler(),
		MCP:        mcpHandler,
		// Claude Code's http hook: it calls the API above in process.
		Hooks:    hook.HTTP(hook.HTTPOptions{API: m.API.Handler(), Logger: m.Logger.With("component", "hooks")}),
		ExtAuthz: m.extAuthz.HTTP(),
		AuthZEN:  m.authZEN.Handler(),
	}
	// /metrics is on the main port unless it has one of its own; the
	// probes stay on the main port: they must show that the port serving
	// Slack and the API answers.
	if m.metrics != nil {
		m.metrics.Ready(server.MetricsOnly(metrics.Handler(registry)))
	} else {
		routes.Metrics = metrics.Handler(registry)
	}
	if m.Config.AuditView {
		var err error
		if routes.Audit, err = m.newAuditView(); err != nil {
			return err
		}
	}
	if !m.Config.SocketMode() {
		routes.Slack = m.Bot.HTTPHandler()
	}
	if m.StepUp != nil {
		routes.StepUp = m.StepUp
	}
	m.front.Ready(server.Mux(routes))
	return nil
}

// runLoops starts the background loops, each until bg ends (Close waits
// for them).
func (m *Main) runLoops(bg context.Context, lc *approval.Lifecycle, hooks *api.Webhooks, gate *approval.Gate, slack bot.Messages) error {
	// Reminders and escalations: any replica may send one; the store lets
	// exactly one claim each.
	rem, err := approval.NewReminders(approval.RemindersOptions{Lifecycle: lc, Pending: m.Store, Posts: m.Bot, Policy: gate,
		Logger: m.Logger.With("component", "reminders")})
	if err != nil {
		return err
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
	m.goBackground(func() { rem.Run(bg) })
	// Adopt runs whose owner died: at once, then every resumeEvery.
	m.goBackground(func() { _ = m.Agent.ResumeEvery(bg, resumeEvery) })
	// The checkpointer follows the audit stream and signs it (built above).
	if m.checkpoints != nil {
		m.goBackground(func() { m.checkpoints.Run(bg) })
	}
	// Last week's approval load to the ops channel: every replica looks,
	// the store lets one claim each week.
	if ops := m.Config.OpsChannel; ops != "" {
		sum := &weekly.Summary{Entries: m.Audit, Policy: replay.Policy{Policy: m.Policy.Policy, Schemas: m.Policy},
			Claims: m.Store, Post: bot.OpsPoster{Messages: slack, Channel: ops}, Now: m.Now, Log: m.Logger.With("component", "weekly")}
		m.goBackground(func() { sum.Run(bg) })
	}
	return nil
}
