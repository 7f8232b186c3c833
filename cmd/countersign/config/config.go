// Package config is what every countersign subcommand is given by its
// process: the environment variables (Config, read once with envconfig,
// its one home) with an error naming each one that is wrong, the standard
// streams (Stdio), and what more than one subcommand builds straight from
// the variables (the audit stream, the signed checkpoints and their
// witnesses). Package main and the subcommand packages beside it read the
// environment through it alone.
package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
	"github.com/countersign/countersign/cmd/countersign/server/stepup"
	"github.com/countersign/countersign/store"
)

// Config is the process configuration, read once from the environment.
// Policy and tools live in the YAML file named by COUNTERSIGN_CONFIG.
type Config struct {
	SlackBotToken      string `envconfig:"SLACK_BOT_TOKEN" desc:"bot token (xoxb-...); required"`
	SlackAppToken      string `envconfig:"SLACK_APP_TOKEN" desc:"app-level token (xapp-...): Socket Mode when set"`
	SlackSigningSecret string `envconfig:"SLACK_SIGNING_SECRET" desc:"HTTP mode: verifies /slack/* requests (when SLACK_APP_TOKEN is not set)"`
	SlackAPIURL        string `envconfig:"SLACK_API_URL" default:"https://slack.com/api/" desc:"Slack Web API base URL, with a trailing slash"`

	RedisURL string `envconfig:"REDIS_URL" desc:"redis://, rediss://, redis+sentinel:// or a Cluster's nodes (docs/deploy.md); required"`
	// RedisStartTimeout is how long Start retries a Redis that does not
	// answer yet (Kubernetes starts it beside us) before giving up; 0
	// tries once.
	RedisStartTimeout time.Duration `envconfig:"COUNTERSIGN_REDIS_START_TIMEOUT" default:"30s" desc:"how long start-up retries a Redis that does not answer yet (0: once)"`
	RedisPrefix       string        `envconfig:"COUNTERSIGN_REDIS_PREFIX" default:"countersign" desc:"prefix of every Redis key"`
	// RedisWaitReplicas makes each decision's wake-up WAIT for that many
	// replicas (store.Options.WaitReplicas), so a failover cannot drop a
	// decision the clicker was told stands.
	RedisWaitReplicas int `envconfig:"COUNTERSIGN_REDIS_WAIT_REPLICAS" default:"0" desc:"Sentinel: replicas that must have each decision before the clicker is told it stands (0: off; docs/deploy.md)"`
	// AuditStream is the audit stream key; keep a {hash tag} for Cluster.
	// Empty means RedisPrefix + ":{audit}", so a process and the audit CLI
	// given the same prefix read the same stream.
	AuditStream string `envconfig:"COUNTERSIGN_AUDIT_STREAM" desc:"audit stream key (default: the prefix + :{audit})"`

	// Signed audit checkpoints (docs/operations.md "Threat model",
	// docs/deploy.md "Audit signing key"): off without a key.
	AuditSigningKey         string        `envconfig:"COUNTERSIGN_AUDIT_SIGNING_KEY" desc:"base64 Ed25519 key that signs audit checkpoints (countersign audit keygen); checkpoints are off without one"`
	AuditSigningKeyFile     string        `envconfig:"COUNTERSIGN_AUDIT_SIGNING_KEY_FILE" desc:"a file holding the audit signing key (instead of COUNTERSIGN_AUDIT_SIGNING_KEY)"`
	AuditCheckpointEvery    int64         `envconfig:"COUNTERSIGN_AUDIT_CHECKPOINT_EVERY" default:"1000" desc:"new audit entries that make a checkpoint"`
	AuditCheckpointInterval time.Duration `envconfig:"COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL" default:"1m" desc:"new audit entries are covered by a checkpoint within this"`
	AuditWitnessFile        string        `envconfig:"COUNTERSIGN_AUDIT_WITNESS_FILE" desc:"append-only file (JSON lines, fsynced) that keeps every checkpoint, outside Redis"`
	AuditWitnessURL         string        `envconfig:"COUNTERSIGN_AUDIT_WITNESS_URL" desc:"URL every checkpoint is POSTed to, signed with COUNTERSIGN_AUDIT_WITNESS_SECRET"`
	AuditWitnessSecret      string        `envconfig:"COUNTERSIGN_AUDIT_WITNESS_SECRET" desc:"HMAC secret of the checkpoint webhook"`
	AuditWitnessChannel     string        `envconfig:"COUNTERSIGN_AUDIT_WITNESS_CHANNEL" desc:"Slack channel id every checkpoint, and every checkpoint alarm, is posted to (an ops channel the bot is in)"`
	// AuditPreviousPublicKey is the key the signing key replaced: after a
	// rotation, the new key continues only a chain whose hand-over it can
	// check (docs/deploy.md "Rotate").
	AuditPreviousPublicKey string `envconfig:"COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY" desc:"after a key rotation: the previous signing key's public key (base64, or a file holding it), so the new key continues the chain the old one handed over"`

	// OpsChannel gets the weekly approval load (approval/weekly): off
	// without it.
	OpsChannel string `envconfig:"COUNTERSIGN_OPS_CHANNEL" desc:"Slack channel id the weekly approval load is posted to, once a week across all processes (requests per tool, time to decide, suggested rules); off when unset"`

	OpenAIAPIKey  string `envconfig:"OPENAI_API_KEY" desc:"key of the OpenAI-compatible endpoint"`
	OpenAIBaseURL string `envconfig:"OPENAI_BASE_URL" desc:"OpenAI-compatible endpoint (default: OpenAI's, https://api.openai.com/v1)"`
	OpenAIModel   string `envconfig:"OPENAI_MODEL" default:"gpt-4o-mini" desc:"model name"`

	// AuditView serves the read-only audit view under /audit/ (off by
	// default); it needs AuditViewToken, or AuditViewUser and
	// AuditViewPassword. See docs/operations.md "Audit view".
	AuditView         bool   `envconfig:"COUNTERSIGN_AUDIT_VIEW" default:"false" desc:"true serves the read-only audit view under /audit/"`
	AuditViewToken    string `envconfig:"COUNTERSIGN_AUDIT_VIEW_TOKEN" desc:"the audit view's bearer token"`
	AuditViewUser     string `envconfig:"COUNTERSIGN_AUDIT_VIEW_USER" desc:"the audit view's basic-auth user"`
	AuditViewPassword string `envconfig:"COUNTERSIGN_AUDIT_VIEW_PASSWORD" desc:"the audit view's basic-auth password"`
	SlackWorkspaceURL string `envconfig:"COUNTERSIGN_SLACK_WORKSPACE_URL" desc:"e.g. https://acme.slack.com: the audit view links to cards"`
	// AuditViewTrustedProxies are the reverse proxies whose
	// X-Forwarded-For the audit view's login throttle reads
	// (docs/operations.md "Audit view").
	AuditViewTrustedProxies string `envconfig:"COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES" desc:"addresses or CIDR prefixes of the reverse proxies in front of the audit view, comma-separated: its login throttle reads X-Forwarded-For from them only"`

	// PublicURL is the origin people reach this process at; the step-up
	// page (/stepup/) is served there, and its host is the passkeys'
	// relying party. Required when the policy asks step-up confirmations
	// (step_up); see docs/guide.md "Step-up votes".
	PublicURL string `envconfig:"COUNTERSIGN_PUBLIC_URL" desc:"the origin people reach this process at, e.g. https://countersign.example.com: the step-up page (passkey confirmations of votes) is served there"`
	// OIDCIssuer, OIDCClientID and OIDCClientSecret, all or none, offer a
	// login at the organisation's identity provider on the step-up page:
	// it confirms votes whose tool accepts oidc and unlocks a passkey
	// enrollment without a colleague (docs/guide.md "Step-up votes").
	OIDCIssuer       string `envconfig:"COUNTERSIGN_OIDC_ISSUER" desc:"the identity provider's issuer URL, e.g. https://accounts.google.com: its login confirms step-up votes (method oidc) and passkey enrollments; needs COUNTERSIGN_PUBLIC_URL"`
	OIDCClientID     string `envconfig:"COUNTERSIGN_OIDC_CLIENT_ID" desc:"the client id the identity provider gave Countersign (redirect URI: COUNTERSIGN_PUBLIC_URL/stepup/oidc/callback)"`
	OIDCClientSecret string `envconfig:"COUNTERSIGN_OIDC_CLIENT_SECRET" desc:"the client secret the identity provider gave Countersign"`

	// APIWithdrawGrace is how long a hook whose long poll ended without
	// the decision has to poll again before its request is withdrawn
	// (docs/claude-code.md "When the hook goes").
	APIWithdrawGrace time.Duration `envconfig:"COUNTERSIGN_API_WITHDRAW_GRACE" default:"5s" desc:"a hook that stopped waiting and did not poll again within this has its request withdrawn"`

	ConfigFile string `envconfig:"COUNTERSIGN_CONFIG" desc:"the policy/tools YAML file; required"`
	Addr       string `envconfig:"COUNTERSIGN_ADDR" default:":8080" desc:"HTTP listen address, host:port"`
	// MetricsAddr, when set, serves /metrics there only (never on Addr):
	// a port the network can keep from whoever reaches /slack and /v1.
	MetricsAddr string `envconfig:"COUNTERSIGN_METRICS_ADDR" desc:"serve /metrics on this host:port only (not on COUNTERSIGN_ADDR); probes stay on COUNTERSIGN_ADDR"`
	// ExtAuthzAddr, when set, serves Envoy's gRPC ext_authz and
	// agentgateway's ExtMcp there (docs/gateways.md); ext_authz's HTTP
	// variant is always at /ext_authz/.
	ExtAuthzAddr string `envconfig:"COUNTERSIGN_EXTAUTHZ_ADDR" desc:"serve Envoy's gRPC ext_authz (envoy.service.auth.v3.Authorization) and agentgateway's ExtMcp (agentgateway.dev.ext_mcp.ExtMcp) on this host:port (docs/gateways.md)"`
	LogLevel     string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
}

// EnvHelp writes the table of environment variables Config reads.
func EnvHelp(w io.Writer) {
	_ = envconfig.Usagef("", &Config{}, w, envHelpFormat)
}

// envHelpFormat is envHelp's table: one variable per line.
const envHelpFormat = `environment:
{{range .}}  {{usage_key . | printf "%-34s"}} {{usage_description .}}{{if usage_default .}} (default {{usage_default .}}){{end}}
{{end}}`

// Load reads the environment with envconfig.
func Load() (Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		return c, fmt.Errorf("environment: %w", err)
	}
	if c.AuditStream == "" {
		c.AuditStream = c.RedisPrefix + ":{audit}"
	}
	return c, nil
}

// ValidateServe checks what `serve` needs; each error names its variable.
// Each setting is checked by the package that uses it.
func (c Config) ValidateServe() error {
	errs := bot.CheckSettings(c.SlackBotToken, c.SlackAppToken, c.SlackSigningSecret, c.SlackAPIURL)
	errs = append(errs, agent.CheckOpenAI(c.OpenAIBaseURL, c.OpenAIAPIKey)...)
	errs = append(errs, store.CheckSettings(c.RedisURL, c.RedisStartTimeout, c.RedisWaitReplicas)...)
	errs = append(errs, server.CheckAddr(c.Addr))
	if c.MetricsAddr != "" {
		if err := server.CheckListenAddr("COUNTERSIGN_METRICS_ADDR", c.MetricsAddr); err != nil {
			errs = append(errs, err)
		} else if c.MetricsAddr == c.Addr && !strings.HasSuffix(c.Addr, ":0") {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_METRICS_ADDR: %q is COUNTERSIGN_ADDR too; leave it unset to serve /metrics there", c.MetricsAddr))
		}
	}
	if c.ExtAuthzAddr != "" {
		if err := server.CheckListenAddr("COUNTERSIGN_EXTAUTHZ_ADDR", c.ExtAuthzAddr); err != nil {
			errs = append(errs, err)
		} else if (c.ExtAuthzAddr == c.Addr || c.ExtAuthzAddr == c.MetricsAddr) && !strings.HasSuffix(c.ExtAuthzAddr, ":0") {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_EXTAUTHZ_ADDR: %q is taken by COUNTERSIGN_ADDR or COUNTERSIGN_METRICS_ADDR; gRPC needs a port of its own", c.ExtAuthzAddr))
		}
	}
	errs = append(errs, auditweb.CheckSettings(c.AuditView, c.AuditViewToken, c.AuditViewUser, c.AuditViewPassword, c.SlackWorkspaceURL, c.AuditViewTrustedProxies)...)
	errs = append(errs, c.CheckpointErrors()...)
	errs = append(errs, stepup.CheckOIDC(c.OIDCIssuer, c.OIDCClientID, c.OIDCClientSecret, c.PublicURL)...)
	if c.OpsChannel != "" {
		if err := bot.CheckChannelID("COUNTERSIGN_OPS_CHANNEL", c.OpsChannel); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ConfigFile == "" {
		errs = append(errs, errors.New("COUNTERSIGN_CONFIG: required (path to the policy/tools YAML file)"))
	}
	if c.APIWithdrawGrace < time.Second || c.APIWithdrawGrace > 5*time.Minute {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_API_WITHDRAW_GRACE: %s is not from 1s to 5m (a hook polls again at once; a few seconds covers a dropped connection)", c.APIWithdrawGrace))
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("LOG_LEVEL: %w", err))
	}
	return errors.Join(errs...)
}

// SocketMode reports whether to use Socket Mode (an app token is set).
func (c Config) SocketMode() bool { return c.SlackAppToken != "" }

// ParseLevel reads LOG_LEVEL: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// Stdio is where a subcommand writes its output; tests pass their own.
type Stdio struct {
	Stdout, Stderr io.Writer
	// Stdin is read by `hook` (the hook's input); nil is os.Stdin.
	Stdin io.Reader
}

// IsHelp reports whether arg asks for help.
func IsHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "help" }
