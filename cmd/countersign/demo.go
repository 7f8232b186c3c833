package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/cmd/countersign/demosor"
	"github.com/countersign/countersign/store"
)

//go:embed demo_policy.yaml
var demoPolicy []byte

// Demo ids shared by the demo policy (demo_policy.yaml) and the workspace.
const (
	demoAuditUser  = "ops"
	demoLeadsGroup = "S0LEADS01"
	demoOutsider   = "U0DAVE001"
	demoAPIKeyName = "demo-agent"
)

// Demo is `countersign demo`: the whole product on one machine. It starts
// an embedded Redis (or uses REDIS_URL), the local Slack workspace with its
// web page, the demo system of record, the scripted offline model (unless
// OPENAI_API_KEY or OPENAI_BASE_URL is set), and the production wiring of
// `serve` (Main) over Socket Mode or HTTP delivery.
type Demo struct {
	// Addr is where the workspace page is served, default 127.0.0.1:3000.
	Addr string
	// HTTPDelivery delivers events over signed HTTP instead of Socket Mode.
	HTTPDelivery bool
	// Redis, when set, is used (and not closed); else RedisURL when set;
	// else an embedded Redis.
	Redis    store.Client
	RedisURL string
	// Prefix is the Redis key prefix, default "countersign-demo"; the audit
	// stream is Prefix + ":{audit}", as for serve and the audit CLI.
	Prefix string
	// PolicyFile, when set, replaces the demo's policy (its tools can call
	// the demo's order system at {{env "SOR_URL"}}).
	PolicyFile string
	// Notes are what the demo adapted of the settings, for the person
	// starting it.
	Notes []string
	// OpenAI settings; when both APIKey and BaseURL are empty the scripted
	// model is used.
	OpenAIAPIKey, OpenAIBaseURL, OpenAIModel string
	// Now is the clock for the workspace and the process, default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// APIKey is the HTTP API key of the demo's agent "demo-agent" (any
	// tool), new each run unless set.
	APIKey string
	// MCPTicker drives the MCP gateway's progress notifications (tests).
	MCPTicker func(d time.Duration) (<-chan time.Time, func())

	// RedisURL is where the demo's Redis answers (the embedded one's too),
	// for the audit CLI.
	redisURL string

	Workspace *slacksim.Workspace
	Cast      slacksim.DemoCast
	SoR       *demosor.Service
	Model     *scripted.Model // nil when a real endpoint is used
	Main      *Main

	closers []func() error // run in reverse by Close
}

// Start brings every part up and returns once the page is being served.
func (d *Demo) Start(ctx context.Context) error {
	if d.Addr == "" {
		d.Addr = "127.0.0.1:3000"
	}
	if d.Prefix == "" {
		d.Prefix = "countersign-demo"
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}

	// Redis: embedded unless REDIS_URL is set.
	rdb := d.Redis
	switch {
	case rdb != nil:
	case d.RedisURL != "":
		d.redisURL = d.RedisURL
		c, err := store.Dial(d.RedisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		rdb = c
		d.closers = append(d.closers, rdb.Close)
	default:
		mr, err := store.StartEmbedded()
		if err != nil {
			return err
		}
		d.closers = append(d.closers, mr.Close)
		rdb = mr.Client()
		d.redisURL = mr.URL()
		d.closers = append(d.closers, rdb.Close)
	}

	// The system of record and (unless configured otherwise) the model.
	d.SoR = demosor.New()
	sorURL, err := d.serve(d.SoR.Handler())
	if err != nil {
		return fmt.Errorf("demo system of record: %w", err)
	}
	modelURL, apiKey, modelName := d.OpenAIBaseURL, d.OpenAIAPIKey, d.OpenAIModel
	if modelURL == "" && apiKey == "" {
		d.Model = scripted.New()
		u, err := d.serve(d.Model)
		if err != nil {
			return fmt.Errorf("scripted model: %w", err)
		}
		modelURL, apiKey, modelName = u+"/v1", "offline", "scripted"
	}
	if modelName == "" {
		modelName = "gpt-4o-mini"
	}

	policy, err := d.policy()
	if err != nil {
		return err
	}
	if d.APIKey == "" {
		d.APIKey = "csk_" + rand.Text()
	}
	policy.API.Keys = append(policy.API.Keys, policyfile.APIKey{Name: demoAPIKeyName, SHA256: api.HashKey(d.APIKey),
		Tools: []string{"*"}, RatePerMinute: 600})

	// The workspace. In HTTP mode it needs the bot's address before the bot
	// starts, so reserve the listener address first.
	wsOpts := slacksim.Options{Now: d.Now, Logger: d.Logger}
	var botAddr string
	const secret = "demo-signing-secret"
	if d.HTTPDelivery {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		botAddr = ln.Addr().String()
		_ = ln.Close()
		base := "http://" + botAddr
		wsOpts.Delivery = slacksim.HTTP
		wsOpts.SigningSecret = secret
		wsOpts.EventsURL, wsOpts.InteractiveURL, wsOpts.CommandsURL = base+"/slack/events", base+"/slack/interactive", base+"/slack/commands"
	}
	d.Workspace = slacksim.New(wsOpts)
	d.closers = append(d.closers, func() error { d.Workspace.Close(); return nil })
	d.Cast = d.Workspace.SeedDemo()
	d.Workspace.AddUser(slacksim.User{ID: demoOutsider, Name: "dave", RealName: "Dave Doe (not an approver)"})
	for _, ch := range []string{d.Cast.Tasks.ID, d.Cast.Approvals.ID} {
		if err := d.Workspace.JoinChannel(ch, demoOutsider); err != nil {
			return err
		}
	}
	d.Workspace.AddUsergroup(slacksim.Usergroup{ID: demoLeadsGroup, Handle: "leads", Name: "Support leads", Users: []string{d.Cast.SecondApprover.ID}})
	if ch := policy.Slack.ApprovalsChannel; ch != d.Cast.Approvals.ID {
		if d.PolicyFile == "" {
			return fmt.Errorf("demo policy approvals channel %s is not the workspace's %s", ch, d.Cast.Approvals.ID)
		}
		// A real deployment's file names its own channel: the demo's stands in.
		policy.Slack.ApprovalsChannel = d.Cast.Approvals.ID
		d.Notes = append(d.Notes, fmt.Sprintf("%s: slack.approvals_channel %s is the demo's #approvals here", d.PolicyFile, ch))
	}
	if _, err := d.Workspace.Start(d.Addr); err != nil {
		return fmt.Errorf("workspace on %s: %w", d.Addr, err)
	}

	cfg := Config{
		SlackBotToken: "xoxb-sim",
		SlackAPIURL:   d.Workspace.APIURL(),
		RedisPrefix:   d.Prefix,
		AuditStream:   d.Prefix + ":{audit}",
		OpenAIAPIKey:  apiKey,
		OpenAIBaseURL: modelURL,
		OpenAIModel:   modelName,
		Addr:          "127.0.0.1:0",
		LogLevel:      "warn",
		// The audit view is on in the demo, with a fresh password each run.
		AuditView:         true,
		AuditViewUser:     demoAuditUser,
		AuditViewPassword: rand.Text(),
		SlackWorkspaceURL: d.Workspace.BaseURL(),
	}
	if d.HTTPDelivery {
		cfg.SlackSigningSecret, cfg.Addr = secret, botAddr
	} else {
		cfg.SlackAppToken = "xapp-sim"
	}
	env := func(name string) string {
		if name == "SOR_URL" {
			return sorURL
		}
		return os.Getenv(name)
	}
	d.Main = &Main{Config: cfg, Policy: policy, Redis: rdb, Env: env, Now: d.Now, Logger: d.Logger, ExpiryEvery: 500 * time.Millisecond, MCPTicker: d.MCPTicker}
	if err := d.Main.Start(ctx); err != nil {
		_ = d.Main.Close()
		return err
	}
	d.closers = append(d.closers, d.Main.Close)
	return nil
}

// policy is the demo's policy, or the file PolicyFile names.
func (d *Demo) policy() (*policyfile.File, error) {
	if d.PolicyFile == "" {
		f, err := policyfile.Parse(demoPolicy)
		if err != nil {
			return nil, fmt.Errorf("demo policy: %w", err)
		}
		return f, nil
	}
	f, err := policyfile.Load(d.PolicyFile)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return f, nil
}

// AuditCommand is the command that reads the demo's audit stream while
// it runs.
func (d *Demo) AuditCommand() string {
	return fmt.Sprintf("REDIS_URL=%s COUNTERSIGN_REDIS_PREFIX=%s go run ./cmd/countersign audit tail", store.RedactURL(d.redisURL), d.Prefix)
}

// AuditURL is the audit view, with its user and password (the demo's
// are printed; a real deployment's never are).
func (d *Demo) AuditURL() (url, user, password string) {
	return d.Main.AuditViewURL(), d.Main.Config.AuditViewUser, d.Main.Config.AuditViewPassword
}

// APIURL is the base of the HTTP API, http://host:port/v1.
func (d *Demo) APIURL() string { return "http://" + d.Main.Addr() + "/v1" }

// URL is the workspace page.
func (d *Demo) URL() string { return d.Workspace.BaseURL() }

// Close stops everything, newest first.
func (d *Demo) Close() error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i]())
	}
	d.closers = nil
	return errors.Join(errs...)
}

// serve starts h on a free loopback port and returns its base URL.
func (d *Demo) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // exits when Close shuts the server down
	// Closed after Main (closers run newest first), so nothing of ours is
	// mid-request; Close also drops connections a client dialled but never
	// used, which Shutdown would wait 5 s for.
	d.closers = append(d.closers, func() error {
		if err := srv.Close(); err != nil {
			return fmt.Errorf("demo server %s: %w", ln.Addr(), err)
		}
		return nil
	})
	return "http://" + ln.Addr().String(), nil
}

const demoUsage = `usage: countersign demo [--addr host:port] [--http] [--config policy.yaml]

Runs the whole product on this machine: an embedded Redis (or REDIS_URL),
a local Slack workspace in the browser, a demo order system, and a scripted
offline model (or your OPENAI_API_KEY / OPENAI_BASE_URL / OPENAI_MODEL).
The policy is the demo's own (cmd/countersign/demo_policy.yaml) unless
--config names yours; its tools can call the demo's order system at
{{env "SOR_URL"}}. Keys are prefixed countersign-demo (or
COUNTERSIGN_REDIS_PREFIX). Ctrl-C stops it.

flags:
`

// runDemo is `countersign demo`.
func runDemo(ctx context.Context, args []string, std stdio) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), demoUsage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:3000", "address of the workspace page")
	httpMode := fs.Bool("http", false, "deliver events over signed HTTP instead of Socket Mode")
	policyPath := fs.String("config", "", "a policy/tools file to use instead of the demo's")
	if len(args) > 0 && isHelp(args[0]) {
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
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		return 2
	}
	d := &Demo{
		Addr: *addr, HTTPDelivery: *httpMode, RedisURL: cfg.RedisURL, PolicyFile: *policyPath,
		OpenAIAPIKey: cfg.OpenAIAPIKey, OpenAIBaseURL: cfg.OpenAIBaseURL, OpenAIModel: os.Getenv("OPENAI_MODEL"),
	}
	if _, set := os.LookupEnv("COUNTERSIGN_REDIS_PREFIX"); set {
		d.Prefix = cfg.RedisPrefix
	}
	if err := d.Start(ctx); err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		_ = d.Close()
		return 1
	}
	auditURL, auditUser, auditPass := d.AuditURL()
	model := "the scripted offline model"
	if d.Model == nil {
		endpoint := d.Main.Config.OpenAIBaseURL
		if endpoint == "" {
			endpoint = "OpenAI's API (https://api.openai.com/v1)"
		}
		model = "the model " + d.Main.Config.OpenAIModel + " at " + endpoint
	}
	policy := "the demo's policy (cmd/countersign/demo_policy.yaml)"
	if d.PolicyFile != "" {
		policy = d.PolicyFile
	}
	fmt.Fprintf(std.Stdout, `Countersign demo is running: %s

  Act as alice (requester) in #tasks and send:
    @countersign order 1234 arrived damaged — look it up, email an apology, refund the shipping
  then switch to bob or carol (approvers) in #approvals. dave sits in #approvals too but is
  not an approver: try clicking as him.
  Also try "@countersign refund $60 on order 1234" and "Approve + allow up to $100.00":
  a second refund in that thread then runs without a card while the budget lasts.
  "$2500" is refused by policy.
  Using %s and %s. Ctrl-C stops.

  Audit view (read-only): %s
    user %s, password %s (new each run)
  Audit from the command line, while the demo runs:
    %s

  HTTP API for your own agent (docs/api.md): %s
    key %s (name %s, any tool; new each run). Try:
    curl -s -H 'Authorization: Bearer %s' -d '{"tool":"deploy_service","call_id":"c1","arguments":{"service":"web"}}' %s
  HumanLayer SDKs (docs/api.md "Moving from HumanLayer"): HUMANLAYER_API_BASE=%s HUMANLAYER_API_KEY=%s
`, d.URL(), model, policy, auditURL, auditUser, auditPass, d.AuditCommand(), d.APIURL(), d.APIKey, demoAPIKeyName, d.APIKey, d.APIURL()+"/requests",
		"http://"+d.Main.Addr()+"/humanlayer/v1", d.APIKey)
	if ups := d.Main.Policy.MCP.Upstreams; len(ups) > 0 {
		fmt.Fprintf(std.Stdout, "\n  MCP gateway (docs/mcp.md): %s/mcp with the same key (Authorization: Bearer), %d upstream(s)\n", "http://"+d.Main.Addr(), len(ups))
	} else {
		fmt.Fprintf(std.Stdout, "\n  MCP gateway (docs/mcp.md): add mcp.upstreams to a policy (--config) and it is served at %s/mcp\n", "http://"+d.Main.Addr())
	}
	for _, n := range d.Notes {
		fmt.Fprintln(std.Stdout, "  Note:", n)
	}
	<-ctx.Done()
	fmt.Fprintln(std.Stdout, "stopping…")
	if err := d.Close(); err != nil {
		fmt.Fprintln(std.Stderr, "countersign demo:", err)
		return 1
	}
	return 0
}
