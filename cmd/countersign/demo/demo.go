// Package demo is the world `countersign demo` runs in: an embedded Redis
// (or REDIS_URL), the local Slack workspace with its web page, the demo
// system of record (demosor), the scripted offline model (unless a real
// endpoint is configured) and the demo's policy. Start brings it up and
// hands back what the process of `serve` needs to run in it (a policy, a
// Redis client, an environment for tool templates, and Settings: URLs,
// tokens and credentials); package main runs its Main on them. The
// end-to-end tests start the same world.
package demo

import (
	"cmp"
	"crypto/ed25519"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/cmd/countersign/demosor"
	"github.com/countersign/countersign/store"
)

// Policy is the demo's policy and tools file (policy.yaml): its tools call
// the demo system of record at {{env "SOR_URL"}}.
//
//go:embed policy.yaml
var Policy []byte

// Ids shared by the demo policy (policy.yaml) and the workspace.
const (
	// AuditUser is the audit view's user in the demo.
	AuditUser = "ops"
	// LeadsGroup is the @leads usergroup (carol's second approver role).
	LeadsGroup = "S0LEADS01"
	// Outsider is dave, who sits in #approvals but is not an approver.
	Outsider = "U0DAVE001"
	// APIKeyName names the demo's HTTP API key.
	APIKeyName = "demo-agent"
)

// signingSecret signs the workspace's HTTP deliveries to the bot.
const signingSecret = "demo-signing-secret"

// World is the demo's world. Set the options, then call Start; Close stops
// everything Start started.
type World struct {
	// Addr is where the workspace page is served, default 127.0.0.1:3000.
	Addr string
	// HTTPDelivery delivers events over signed HTTP instead of Socket Mode.
	HTTPDelivery bool
	// Manifest, when set, is the Slack app's manifest: the local workspace
	// grants only its scopes and events, and refuses the rest as Slack
	// does (missing_scope). Nil grants every scope.
	Manifest *slacksim.Manifest
	// Redis, when set, is used (and not closed); else RedisURL when set;
	// else an embedded Redis. After Start it is the client in use.
	Redis    store.Client
	RedisURL string
	// Listener is the process's listener on Settings.Addr, opened by
	// Start in HTTP delivery mode (the workspace must know the address
	// first); the process takes it over (TakeListener).
	Listener net.Listener
	// Command is how the person who started the demo runs this program
	// ("go run ./cmd/countersign" when empty; SelfCommand): the banner's
	// commands are written with it.
	Command string
	// Prefix is the Redis key prefix, default "countersign-demo"; the audit
	// stream is Prefix + ":{audit}", as for serve and the audit CLI.
	Prefix string
	// PolicyFile, when set, replaces the demo's policy (its tools can call
	// the demo's order system at {{env "SOR_URL"}}).
	PolicyFile string
	// OpenAI settings; when both APIKey and BaseURL are empty the scripted
	// model is used.
	OpenAIAPIKey, OpenAIBaseURL, OpenAIModel string
	// Now is the clock for the workspace and the process, default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// APIKey is the HTTP API key of the demo's agent "demo-agent" (any
	// tool), new each run unless set.
	APIKey string
	// Checkpoints signs the audit stream (docs/operations.md "Threat
	// model") with a key new each run, to a witness file, both in a
	// temporary directory removed at Close: what `countersign demo` does.
	Checkpoints bool

	// Set by Start.

	// ExtAuthzAddr is where Envoy's gRPC ext_authz (and agentgateway's
	// ExtMcp) is served, set once
	// Main runs; the banner names it.
	ExtAuthzAddr string
	// Notes are what the demo adapted of the settings, for the person
	// starting it.
	Notes     []string
	Workspace *slacksim.Workspace
	Cast      slacksim.DemoCast
	SoR       *demosor.Service
	Model     *scripted.Model // nil when a real endpoint is used
	// Policy is the policy the process runs: the demo's or PolicyFile,
	// with the demo's API key and approvals channel.
	Policy *policyfile.File
	// Env answers the tools' {{env}} templates: SOR_URL is the system of
	// record, everything else the process environment.
	Env func(string) string
	// Settings are the process's settings in this world.
	Settings Settings

	redisURL string         // where Redis answers (the embedded one's too), for the audit CLI
	closers  []func() error // run in reverse by Close
}

// Settings are the settings of `serve` that a process needs to run in the
// world: where its Slack and model are, how events reach it, and the audit
// view's credentials.
type Settings struct {
	SlackAPIURL, SlackBotToken string
	// SlackAppToken is set for Socket Mode; SlackSigningSecret for HTTP
	// delivery, when Addr is the address the workspace delivers to.
	SlackAppToken, SlackSigningSecret string
	Addr                              string
	ModelURL, ModelKey, ModelName     string
	// The audit view is on in the demo, with a fresh password each run.
	AuditViewUser, AuditViewPassword string
	// WorkspaceURL lets the audit view link to cards.
	WorkspaceURL string
	// With Checkpoints: the signing key (base64 seed), the witness file,
	// and the file holding the public key that verifies.
	AuditSigningKey, AuditWitnessFile, AuditPublicKeyFile string
}

// Start brings every part of the world up and returns once the page is
// being served.
func (w *World) Start() error {
	w.Addr = cmp.Or(w.Addr, "127.0.0.1:3000")
	w.Prefix = cmp.Or(w.Prefix, "countersign-demo")
	w.Now = option.FuncOr(w.Now, time.Now)
	w.Logger = cmp.Or(w.Logger, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := w.startRedis(); err != nil {
		return err
	}

	// The system of record and (unless configured otherwise) the model.
	w.SoR = demosor.New()
	sorURL, err := w.serve(w.SoR.Handler())
	if err != nil {
		return fmt.Errorf("demo system of record: %w", err)
	}
	w.Env = func(name string) string {
		if name == "SOR_URL" {
			return sorURL
		}
		return os.Getenv(name)
	}
	s := &w.Settings
	s.ModelURL, s.ModelKey, s.ModelName = w.OpenAIBaseURL, w.OpenAIAPIKey, w.OpenAIModel
	if s.ModelURL == "" && s.ModelKey == "" {
		w.Model = scripted.New()
		u, err := w.serve(w.Model)
		if err != nil {
			return fmt.Errorf("scripted model: %w", err)
		}
		s.ModelURL, s.ModelKey, s.ModelName = u+"/v1", "offline", "scripted"
	}
	s.ModelName = cmp.Or(s.ModelName, "gpt-4o-mini")

	if w.Policy, err = w.policy(); err != nil {
		return err
	}
	if w.APIKey == "" {
		w.APIKey = "csk_" + rand.Text()
	}
	w.Policy.API.Keys = append(w.Policy.API.Keys, policyfile.APIKey{Name: APIKeyName, SHA256: api.HashKey(w.APIKey),
		Tools: []string{"*"}, RatePerMinute: 600})

	if err := w.startWorkspace(); err != nil {
		return err
	}
	s.SlackAPIURL, s.SlackBotToken, s.WorkspaceURL = w.Workspace.APIURL(), "xoxb-sim", w.Workspace.BaseURL()
	s.AuditViewUser, s.AuditViewPassword = AuditUser, rand.Text()
	if w.Checkpoints {
		if err := w.checkpointKey(); err != nil {
			return fmt.Errorf("demo audit checkpoints: %w", err)
		}
	}
	return nil
}

// checkpointKey makes the run's audit signing key and the directory that
// holds its public key and the witness file.
func (w *World) checkpointKey() error {
	dir, err := os.MkdirTemp("", "countersign-demo-")
	if err != nil {
		return err
	}
	w.closers = append(w.closers, func() error { return os.RemoveAll(dir) })
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	s := &w.Settings
	s.AuditPublicKeyFile, s.AuditWitnessFile = filepath.Join(dir, "audit.pub"), filepath.Join(dir, "checkpoints.jsonl")
	s.AuditSigningKey = base64.StdEncoding.EncodeToString(key.Seed())
	return os.WriteFile(s.AuditPublicKeyFile, []byte(approval.EncodePublicKey(pub)+"\n"), 0o600)
}

// startRedis connects to Redis: the one given, REDIS_URL, or an embedded
// one.
func (w *World) startRedis() error {
	switch {
	case w.Redis != nil:
	case w.RedisURL != "":
		w.redisURL = w.RedisURL
		c, err := store.Dial(w.RedisURL)
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		w.Redis = c
		w.closers = append(w.closers, c.Close)
	default:
		mr, err := store.StartEmbedded()
		if err != nil {
			return err
		}
		w.closers = append(w.closers, mr.Close)
		w.Redis = mr.Client()
		w.redisURL = mr.URL()
		w.closers = append(w.closers, w.Redis.Close)
	}
	return nil
}

// startWorkspace seeds the local Slack workspace and serves its page. In
// HTTP mode the workspace needs the process's address before the process
// starts, so that address is reserved first.
func (w *World) startWorkspace() error {
	s := &w.Settings
	wsOpts := slacksim.Options{Now: w.Now, Logger: w.Logger, Manifest: w.Manifest}
	if w.HTTPDelivery {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		// Kept open and handed to the process (Listener): closed and
		// opened again, the port could be taken in between.
		s.Addr, w.Listener = ln.Addr().String(), ln
		w.closers = append(w.closers, func() error {
			if w.Listener != nil {
				_ = w.Listener.Close() // never handed over
			}
			return nil
		})
		base := "http://" + s.Addr
		wsOpts.Delivery = slacksim.HTTP
		wsOpts.SigningSecret, s.SlackSigningSecret = signingSecret, signingSecret
		wsOpts.EventsURL, wsOpts.InteractiveURL, wsOpts.CommandsURL = base+"/slack/events", base+"/slack/interactive", base+"/slack/commands"
	} else {
		// Reserved as well: the step-up page's origin names the process's
		// port (http://localhost:N) before the process starts.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.Addr, s.SlackAppToken, w.Listener = ln.Addr().String(), "xapp-sim", ln
		w.closers = append(w.closers, func() error {
			if w.Listener != nil {
				_ = w.Listener.Close() // never handed over
			}
			return nil
		})
	}
	w.Workspace = slacksim.New(wsOpts)
	w.closers = append(w.closers, func() error { w.Workspace.Close(); return nil })
	w.Cast = w.Workspace.SeedDemo()
	w.Workspace.AddUser(slacksim.User{ID: Outsider, Name: "dave", RealName: "Dave Doe (not an approver)"})
	for _, ch := range []string{w.Cast.Tasks.ID, w.Cast.Approvals.ID} {
		if err := w.Workspace.JoinChannel(ch, Outsider); err != nil {
			return err
		}
	}
	w.Workspace.AddUsergroup(slacksim.Usergroup{ID: LeadsGroup, Handle: "leads", Name: "Support leads", Users: []string{w.Cast.SecondApprover.ID}})
	if ch := w.Policy.Slack.ApprovalsChannel; ch != w.Cast.Approvals.ID {
		if w.PolicyFile == "" {
			return fmt.Errorf("demo policy approvals channel %s is not the workspace's %s", ch, w.Cast.Approvals.ID)
		}
		// A real deployment's file names its own channel: the demo's stands in.
		w.Policy.Slack.ApprovalsChannel = w.Cast.Approvals.ID
		w.Notes = append(w.Notes, fmt.Sprintf("%s: slack.approvals_channel %s is the demo's #approvals here", w.PolicyFile, ch))
	}
	if _, err := w.Workspace.Start(w.Addr); err != nil {
		return fmt.Errorf("workspace on %s: %w", w.Addr, err)
	}
	return nil
}

// policy is the demo's policy, or the file PolicyFile names.
func (w *World) policy() (*policyfile.File, error) {
	if w.PolicyFile == "" {
		f, err := policyfile.Parse(Policy)
		if err != nil {
			return nil, fmt.Errorf("demo policy: %w", err)
		}
		return f, nil
	}
	f, err := policyfile.Load(w.PolicyFile)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return f, nil
}

// AuditCommand is the command that reads the demo's audit stream while
// it runs, for the program as it was started (Command), naming people and
// channels as the audit view does: through the local workspace, with its
// bot token.
func (w *World) AuditCommand() string {
	return fmt.Sprintf("REDIS_URL=%s COUNTERSIGN_REDIS_PREFIX=%s SLACK_BOT_TOKEN=%s SLACK_API_URL=%s %s audit tail",
		store.RedactURL(w.redisURL), w.Prefix, w.Settings.SlackBotToken, w.Workspace.APIURL(), w.program())
}

// program is how the banner's commands start this program: Command as
// the person started it (shell-quoted), else the running executable.
func (w *World) program() string {
	switch w.Command {
	case GoRun:
		return GoRun
	case "":
		exe, err := os.Executable()
		if err != nil {
			return GoRun
		}
		return shellWord(exe)
	}
	return shellWord(w.Command)
}

// GoRun is how a clone runs the program without installing it.
const GoRun = "go run ./cmd/countersign"

// SelfCommand is how a person runs the program at exe (os.Executable)
// again: GoRun when it is a go run build (go run links it as
// …/go-build…/exe/<name> in a temporary directory), its name alone when
// that name on the PATH (lookPath, exec.LookPath) is exe, else its path.
func SelfCommand(exe string, lookPath func(string) (string, error)) string {
	if slash := filepath.ToSlash(exe); exe == "" || (strings.Contains(slash, "/go-build") && strings.Contains(slash, "/exe/")) {
		return GoRun
	}
	name := filepath.Base(exe)
	if p, err := lookPath(name); err == nil && filepath.Clean(p) == filepath.Clean(exe) {
		return name
	}
	return exe
}

// Self is SelfCommand for this process: how the person who started it
// runs it again, for the banner's commands.
func Self() string {
	exe, err := os.Executable()
	if err != nil {
		return GoRun
	}
	return SelfCommand(exe, exec.LookPath)
}

// FreePortBeside is a free port (":0") on the host of addr, the address
// the demo serves HTTP on: where its gRPC ext_authz listens.
func FreePortBeside(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "127.0.0.1:0"
	}
	return net.JoinHostPort(host, "0")
}

// VerifyCommand is the command that proves the demo's audit stream
// against its signed checkpoints while it runs, with this very binary (""
// without Checkpoints).
func (w *World) VerifyCommand() string {
	if w.Settings.AuditPublicKeyFile == "" {
		return ""
	}
	return fmt.Sprintf("REDIS_URL=%s COUNTERSIGN_REDIS_PREFIX=%s %s audit verify --pubkey %s --checkpoints %s",
		store.RedactURL(w.redisURL), w.Prefix, w.program(), shellWord(w.Settings.AuditPublicKeyFile), shellWord(w.Settings.AuditWitnessFile))
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// TakeListener hands the reserved listener (nil when none) to the
// process, which closes it from then on.
func (w *World) TakeListener() net.Listener {
	ln := w.Listener
	w.Listener = nil
	return ln
}

// URL is the workspace page.
func (w *World) URL() string { return w.Workspace.BaseURL() }

// OnClose runs fn first when the world closes: the process running in it
// stops before its Redis, workspace and services do.
func (w *World) OnClose(fn func() error) { w.closers = append(w.closers, fn) }

// Close stops everything, newest first.
func (w *World) Close() error {
	var errs []error
	for i := len(w.closers) - 1; i >= 0; i-- {
		errs = append(errs, w.closers[i]())
	}
	w.closers = nil
	return errors.Join(errs...)
}

// serve starts h on a free loopback port and returns its base URL.
func (w *World) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // exits when Close shuts the server down
	// Closed after the process (closers run newest first), so nothing of
	// ours is mid-request; Close also drops connections a client dialled
	// but never used, which Shutdown would wait 5 s for.
	w.closers = append(w.closers, func() error {
		if err := srv.Close(); err != nil {
			return fmt.Errorf("demo server %s: %w", ln.Addr(), err)
		}
		return nil
	})
	return "http://" + ln.Addr().String(), nil
}

// checkpointsNote is Welcome's lines on the signed audit checkpoints
// ("" without them).
func (w *World) checkpointsNote() string {
	cmd := w.VerifyCommand()
	if cmd == "" {
		return ""
	}
	return fmt.Sprintf(`  Signed audit checkpoints are on (docs/operations.md "Threat model"): every minute, a
  checkpoint signed with a key made for this run, kept in %s.
  Prove the audit trail against them, while the demo runs:
    %s
`, filepath.Dir(w.Settings.AuditWitnessFile), cmd)
}

// Welcome tells the person who started the demo what to try: the page,
// the audit view and CLI, the HTTP API and the MCP gateway of the process
// listening on addr.
func (w *World) Welcome(out io.Writer, addr string) {
	model := "the scripted offline model"
	if w.Model == nil {
		endpoint := w.Settings.ModelURL
		if endpoint == "" {
			endpoint = "OpenAI's API (https://api.openai.com/v1)"
		}
		model = "the model " + w.Settings.ModelName + " at " + endpoint
	}
	policy := "the demo's policy (cmd/countersign/demo/policy.yaml)"
	if w.PolicyFile != "" {
		policy = w.PolicyFile
	}
	base := "http://" + addr
	apiURL := base + "/v1"
	fmt.Fprintf(out, `Countersign demo is running: %s

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
%s
  HTTP API for your own agent (docs/api.md): %s
    key %s (name %s, any tool; new each run). Try:
    curl -s -H 'Authorization: Bearer %s' -d '{"tool":"deploy_service","call_id":"c1","arguments":{"service":"web"}}' %s
  HumanLayer SDKs (docs/api.md "Moving from HumanLayer"): HUMANLAYER_API_BASE=%s HUMANLAYER_API_KEY=%s
`, w.URL(), model, policy, base+"/audit/", w.Settings.AuditViewUser, w.Settings.AuditViewPassword, w.AuditCommand(), w.checkpointsNote(), apiURL,
		w.APIKey, APIKeyName, w.APIKey, apiURL+"/requests", base+"/humanlayer/v1", w.APIKey)
	if ups := w.Policy.MCP.Upstreams; len(ups) > 0 {
		fmt.Fprintf(out, "\n  MCP gateway (docs/mcp.md): %s/mcp with the same key (Authorization: Bearer), %d upstream(s)\n", base, len(ups))
	} else {
		fmt.Fprintf(out, "\n  MCP gateway (docs/mcp.md): add mcp.upstreams to a policy (--config) and it is served at %s/mcp\n", base)
	}
	if w.ExtAuthzAddr != "" {
		fmt.Fprintf(out, "  Envoy ext_authz (docs/gateways.md): gRPC at %s, HTTP at %s/ext_authz/; agentgateway ExtMcp on the same gRPC port; same key (Authorization: Bearer)\n", w.ExtAuthzAddr, base)
	}
	fmt.Fprintf(out, "  OpenID AuthZEN (docs/gateways.md): discovery at %s/.well-known/authzen-configuration, same key (Authorization: Bearer)\n", base)
	for _, n := range w.Notes {
		fmt.Fprintln(out, "  Note:", n)
	}
}

// PublicURL is the origin of the demo's step-up page: localhost (a
// secure context for WebAuthn over plain HTTP, and the passkeys' relying
// party) on the port the process listens on.
func PublicURL(ln net.Listener, addr string) string {
	if ln != nil {
		addr = ln.Addr().String()
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" {
		return ""
	}
	return "http://localhost:" + port
}
