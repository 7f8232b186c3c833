package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Config is the process configuration, read once from the environment.
// Policy and tools live in the YAML file named by COUNTERSIGN_CONFIG.
type Config struct {
	SlackBotToken      string `envconfig:"SLACK_BOT_TOKEN"`
	SlackAppToken      string `envconfig:"SLACK_APP_TOKEN"`
	SlackSigningSecret string `envconfig:"SLACK_SIGNING_SECRET"`
	SlackAPIURL        string `envconfig:"SLACK_API_URL" default:"https://slack.com/api/"`

	RedisURL string `envconfig:"REDIS_URL"`
	// RedisStartTimeout is how long Start retries a Redis that does not
	// answer yet (Kubernetes starts it beside us) before giving up; 0
	// tries once.
	RedisStartTimeout time.Duration `envconfig:"COUNTERSIGN_REDIS_START_TIMEOUT" default:"30s"`
	// RedisPrefix prefixes every key Countersign writes.
	RedisPrefix string `envconfig:"COUNTERSIGN_REDIS_PREFIX" default:"countersign"`
	// AuditStream is the audit stream key; keep a {hash tag} for Cluster.
	AuditStream string `envconfig:"COUNTERSIGN_AUDIT_STREAM" default:"countersign:{audit}"`

	OpenAIAPIKey  string `envconfig:"OPENAI_API_KEY"`
	OpenAIBaseURL string `envconfig:"OPENAI_BASE_URL"`
	OpenAIModel   string `envconfig:"OPENAI_MODEL" default:"gpt-4o-mini"`

	// AuditView serves the read-only audit view under /audit/ (off by
	// default); it needs AuditViewToken, or AuditViewUser and
	// AuditViewPassword. See docs/operations.md "Audit view".
	AuditView         bool   `envconfig:"COUNTERSIGN_AUDIT_VIEW" default:"false"`
	AuditViewToken    string `envconfig:"COUNTERSIGN_AUDIT_VIEW_TOKEN"`
	AuditViewUser     string `envconfig:"COUNTERSIGN_AUDIT_VIEW_USER"`
	AuditViewPassword string `envconfig:"COUNTERSIGN_AUDIT_VIEW_PASSWORD"`
	// SlackWorkspaceURL (https://acme.slack.com) lets the audit view link
	// to approval cards.
	SlackWorkspaceURL string `envconfig:"COUNTERSIGN_SLACK_WORKSPACE_URL"`

	ConfigFile string `envconfig:"COUNTERSIGN_CONFIG"`
	Addr       string `envconfig:"COUNTERSIGN_ADDR" default:":8080"`
	LogLevel   string `envconfig:"LOG_LEVEL" default:"info"`
}

// loadConfig reads the environment with envconfig.
func loadConfig() (Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		return c, fmt.Errorf("environment: %w", err)
	}
	return c, nil
}

// validateServe checks what `serve` needs; each error names its variable.
func (c Config) validateServe() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.SlackBotToken == "" {
		add("SLACK_BOT_TOKEN: required (the bot token, xoxb-...)")
	} else if !strings.HasPrefix(c.SlackBotToken, "xoxb-") {
		add("SLACK_BOT_TOKEN: must be a bot token starting with xoxb-")
	}
	switch {
	case c.SlackAppToken == "" && c.SlackSigningSecret == "":
		add("SLACK_APP_TOKEN or SLACK_SIGNING_SECRET: set one (Socket Mode needs SLACK_APP_TOKEN, HTTP mode needs SLACK_SIGNING_SECRET)")
	case c.SlackAppToken != "" && !strings.HasPrefix(c.SlackAppToken, "xapp-"):
		add("SLACK_APP_TOKEN: must be an app-level token starting with xapp-")
	}
	if u, err := url.Parse(c.SlackAPIURL); err != nil || u.Scheme == "" || u.Host == "" {
		add("SLACK_API_URL: not a URL: %q", c.SlackAPIURL)
	} else if !strings.HasSuffix(c.SlackAPIURL, "/") {
		add("SLACK_API_URL: must end with a slash, e.g. https://slack.com/api/")
	}
	if c.RedisURL == "" {
		add("REDIS_URL: required, e.g. redis://localhost:6379/0")
	}
	if c.RedisStartTimeout < 0 {
		add("COUNTERSIGN_REDIS_START_TIMEOUT: must not be negative, got %s", c.RedisStartTimeout)
	}
	if c.OpenAIAPIKey == "" && c.OpenAIBaseURL == "" {
		add("OPENAI_API_KEY: required unless OPENAI_BASE_URL points at a local OpenAI-compatible endpoint")
	}
	if c.ConfigFile == "" {
		add("COUNTERSIGN_CONFIG: required (path to the policy/tools YAML file)")
	}
	if err := c.validateAuditView(); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		add("LOG_LEVEL: %v", err)
	}
	return errors.Join(errs...)
}

// validateAuditView checks the audit view's settings: when it is on, it
// needs credentials (it is never served without authentication).
func (c Config) validateAuditView() error {
	var errs []error
	if c.AuditView {
		switch {
		case c.AuditViewUser != "" && c.AuditViewPassword == "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW_PASSWORD: required with COUNTERSIGN_AUDIT_VIEW_USER"))
		case c.AuditViewUser == "" && c.AuditViewPassword != "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW_USER: required with COUNTERSIGN_AUDIT_VIEW_PASSWORD"))
		case c.AuditViewToken == "" && c.AuditViewUser == "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW: set COUNTERSIGN_AUDIT_VIEW_TOKEN, or COUNTERSIGN_AUDIT_VIEW_USER and COUNTERSIGN_AUDIT_VIEW_PASSWORD (the view is never served without authentication)"))
		}
	}
	if c.SlackWorkspaceURL != "" {
		if u, err := url.Parse(c.SlackWorkspaceURL); err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_SLACK_WORKSPACE_URL: not a URL: %q (want e.g. https://acme.slack.com)", c.SlackWorkspaceURL))
		}
	}
	return errors.Join(errs...)
}

// socketMode reports whether to use Socket Mode (an app token is set).
func (c Config) socketMode() bool { return c.SlackAppToken != "" }

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}
