package main_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// TestServeConfigErrors: missing or contradictory settings stop start-up
// with one clear line each, naming the variable.
func TestServeConfigErrors(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		wantLines []string
	}{
		{
			name: "nothing set",
			env:  map[string]string{},
			wantLines: []string{
				"SLACK_BOT_TOKEN: required",
				"SLACK_APP_TOKEN or SLACK_SIGNING_SECRET: set one",
				"REDIS_URL: required",
				"OPENAI_API_KEY: required",
				"COUNTERSIGN_CONFIG: required",
			},
		},
		{
			name: "wrong token kinds and bad values",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xapp-1", "SLACK_APP_TOKEN": "xoxb-1", "SLACK_API_URL": "http://localhost:9/api",
				"REDIS_URL": "redis://x", "OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "LOG_LEVEL": "loud",
			},
			wantLines: []string{
				"SLACK_BOT_TOKEN: must be a bot token starting with xoxb-",
				"SLACK_APP_TOKEN: must be an app-level token starting with xapp-",
				"SLACK_API_URL: must end with a slash",
				`LOG_LEVEL: must be debug, info, warn or error, got "loud"`,
			},
		},
		{
			name: "audit view on without credentials",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "REDIS_URL": "redis://x", "OPENAI_API_KEY": "k",
				"COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_AUDIT_VIEW": "true", "COUNTERSIGN_SLACK_WORKSPACE_URL": "acme.slack.com",
			},
			wantLines: []string{
				"COUNTERSIGN_AUDIT_VIEW: set COUNTERSIGN_AUDIT_VIEW_TOKEN, or COUNTERSIGN_AUDIT_VIEW_USER and COUNTERSIGN_AUDIT_VIEW_PASSWORD",
				"COUNTERSIGN_SLACK_WORKSPACE_URL: not a URL",
			},
		},
		{
			name: "listen address, model endpoint, Socket Mode and HTTP secrets",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_BASE_URL": "localhost:11434", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_ADDR": "8080",
			},
			wantLines: []string{
				`OPENAI_BASE_URL: not an http(s) URL: "localhost:11434"`,
				"SLACK_SIGNING_SECRET: set together with SLACK_APP_TOKEN",
				`COUNTERSIGN_ADDR: not host:port: "8080"`,
			},
		},
		{
			name: "a port out of range",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_ADDR": "127.0.0.1:99999",
			},
			wantLines: []string{`COUNTERSIGN_ADDR: port "99999" is not a number from 0 to 65535`},
		},
		{
			name: "a metrics address that is no address",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_METRICS_ADDR": "9090",
			},
			wantLines: []string{`COUNTERSIGN_METRICS_ADDR: not host:port: "9090"`},
		},
		{
			name: "a metrics address that is the main one",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_ADDR": ":8080", "COUNTERSIGN_METRICS_ADDR": ":8080",
			},
			wantLines: []string{`COUNTERSIGN_METRICS_ADDR: ":8080" is COUNTERSIGN_ADDR too`},
		},
		{
			name: "an ext_authz address that is no host:port",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_EXTAUTHZ_ADDR": "9001",
			},
			wantLines: []string{`COUNTERSIGN_EXTAUTHZ_ADDR: not host:port: "9001"`},
		},
		{
			name: "an ext_authz address that is the main one",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_ADDR": ":8080", "COUNTERSIGN_EXTAUTHZ_ADDR": ":8080",
			},
			wantLines: []string{`COUNTERSIGN_EXTAUTHZ_ADDR: ":8080" is taken by COUNTERSIGN_ADDR or COUNTERSIGN_METRICS_ADDR`},
		},
		{
			name: "a negative replica count",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://x",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_REDIS_WAIT_REPLICAS": "-1",
			},
			wantLines: []string{"COUNTERSIGN_REDIS_WAIT_REPLICAS: must not be negative, got -1"},
		},
		{
			name: "a Redis URL Dial refuses",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s3cret", "REDIS_URL": "redis://h1:6379,h2:6379/3",
				"OPENAI_API_KEY": "k", "COUNTERSIGN_CONFIG": "p.yaml",
			},
			wantLines: []string{"REDIS_URL: redis Cluster has only database 0, got /3"},
		},
		{
			name: "audit view user without password",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "REDIS_URL": "redis://x", "OPENAI_API_KEY": "k",
				"COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_AUDIT_VIEW": "true", "COUNTERSIGN_AUDIT_VIEW_USER": "ops",
			},
			wantLines: []string{"COUNTERSIGN_AUDIT_VIEW_PASSWORD: required with COUNTERSIGN_AUDIT_VIEW_USER"},
		},
		{
			name: "audit view trusting a proxy that is no address",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "REDIS_URL": "redis://x", "OPENAI_API_KEY": "k",
				"COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_AUDIT_VIEW": "true", "COUNTERSIGN_AUDIT_VIEW_TOKEN": "t",
				"COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES": "10.0.0.0/8, proxy.internal",
			},
			wantLines: []string{`COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: "proxy.internal" is not an IP address or a CIDR prefix`},
		},
		{
			name: "ops channel given by its name",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "REDIS_URL": "redis://x", "OPENAI_API_KEY": "k",
				"COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_OPS_CHANNEL": "#ops",
			},
			wantLines: []string{`COUNTERSIGN_OPS_CHANNEL: a channel id (C…, as the channel's details show it), not a name or anything else: "#ops"`},
		},
	}
	vars := []string{"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_API_URL", "REDIS_URL",
		"OPENAI_API_KEY", "OPENAI_BASE_URL", "COUNTERSIGN_CONFIG", "LOG_LEVEL",
		"COUNTERSIGN_AUDIT_VIEW", "COUNTERSIGN_AUDIT_VIEW_TOKEN", "COUNTERSIGN_AUDIT_VIEW_USER", "COUNTERSIGN_AUDIT_VIEW_PASSWORD", "COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES",
		"COUNTERSIGN_SLACK_WORKSPACE_URL", "COUNTERSIGN_ADDR", "COUNTERSIGN_REDIS_WAIT_REPLICAS", "COUNTERSIGN_METRICS_ADDR", "COUNTERSIGN_EXTAUTHZ_ADDR",
		"COUNTERSIGN_OPS_CHANNEL"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tt.env[v]) // restored after the test
				if tt.env[v] == "" {
					os.Unsetenv(v)
				}
			}
			var out, errOut bytes.Buffer
			code := main.Run(t.Context(), []string{"serve"}, main.Stdio{Stdout: &out, Stderr: &errOut})
			if code != 2 {
				t.Fatalf("serve exit = %d, want 2; stderr:\n%s", code, errOut.String())
			}
			lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
			if len(lines) != len(tt.wantLines) {
				t.Errorf("serve printed %d lines, want %d:\n%s", len(lines), len(tt.wantLines), errOut.String())
			}
			for _, w := range tt.wantLines {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("serve stderr does not contain %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

// TestSubcommandHelp: every subcommand answers -h and --help with its
// usage on stdout and exit 0, without reading (or validating) the
// environment or taking the flag for a file; serve's help lists the
// environment it reads.
func TestSubcommandHelp(t *testing.T) {
	t.Setenv("REDIS_URL", "") // serve would refuse to start; help must not care
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"serve", "--help"}, []string{"usage: countersign serve", "SLACK_BOT_TOKEN", "COUNTERSIGN_ADDR", "(default :8080)"}},
		{[]string{"serve", "-h"}, []string{"usage: countersign serve", "REDIS_URL"}},
		{[]string{"check", "--help"}, []string{"usage: countersign check [--slack] [file]"}},
		{[]string{"check", "-h"}, []string{"usage: countersign check [--slack] [file]"}},
		{[]string{"demo", "--help"}, []string{"usage: countersign demo", "-config", "-http"}},
		{[]string{"demo", "-h"}, []string{"usage: countersign demo"}},
		{[]string{"audit", "--help"}, []string{"usage: countersign audit"}},
		{[]string{"policy", "--help"}, []string{"usage: countersign policy", "replay", "suggest"}},
		{[]string{"policy", "replay", "-h"}, []string{"usage: countersign policy", "--current"}},
		{[]string{"hook", "--help"}, []string{"usage: countersign hook claude-code", "COUNTERSIGN_API_KEY"}},
		{[]string{"hook", "claude-code", "-h"}, []string{"usage: countersign hook claude-code", "--timeout"}},
		{[]string{"--help"}, []string{"usage: countersign <command>"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t.Context(), tt.args...)
			if code != 0 {
				t.Fatalf("main.Run(%q) = %d, want 0; stderr:\n%s", tt.args, code, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("main.Run(%q) stdout lacks %q:\n%s", tt.args, w, out)
				}
			}
		})
	}
	for _, args := range [][]string{{"serve", "now"}, {"check", "a.yaml", "b.yaml"}, {"demo", "extra"}, {"hook"}, {"hook", "codex"}, {"hook", "claude-code", "extra"}, {"policy"}, {"policy", "rewrite"}, {"policy", "suggest", "extra"}, {"policy", "replay", "--nope", "c.yaml"}} {
		if code, _, _ := runCLI(t.Context(), args...); code != 2 {
			t.Errorf("main.Run(%q) = %d, want 2 (unexpected arguments)", args, code)
		}
	}
}

// TestStartNamesAuthTestOnce: a bot token Slack refuses stops start-up
// with one error that names auth.test once and says why.
func TestStartNamesAuthTestOnce(t *testing.T) {
	t.Parallel()
	ws := slacksimtest.New(t, slacksim.Options{})
	policy, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	err = runMain(t, &main.Main{Config: main.Config{SlackBotToken: "xoxb-revoked", SlackAppToken: "xapp-sim", SlackAPIURL: ws.APIURL(),
		OpenAIAPIKey: "k", OpenAIBaseURL: "http://127.0.0.1:1/v1", OpenAIModel: "m", LogLevel: "warn"}, Policy: policy})
	if err == nil || strings.Count(err.Error(), "auth.test") != 1 || !strings.Contains(err.Error(), "invalid_auth") {
		t.Errorf("Start with a refused token = %v, want one error naming auth.test once, with invalid_auth", err)
	}
}
