package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
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
			name: "audit view user without password",
			env: map[string]string{
				"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "REDIS_URL": "redis://x", "OPENAI_API_KEY": "k",
				"COUNTERSIGN_CONFIG": "p.yaml", "COUNTERSIGN_AUDIT_VIEW": "true", "COUNTERSIGN_AUDIT_VIEW_USER": "ops",
			},
			wantLines: []string{"COUNTERSIGN_AUDIT_VIEW_PASSWORD: required with COUNTERSIGN_AUDIT_VIEW_USER"},
		},
	}
	vars := []string{"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_API_URL", "REDIS_URL",
		"OPENAI_API_KEY", "OPENAI_BASE_URL", "COUNTERSIGN_CONFIG", "LOG_LEVEL",
		"COUNTERSIGN_AUDIT_VIEW", "COUNTERSIGN_AUDIT_VIEW_TOKEN", "COUNTERSIGN_AUDIT_VIEW_USER", "COUNTERSIGN_AUDIT_VIEW_PASSWORD",
		"COUNTERSIGN_SLACK_WORKSPACE_URL"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tt.env[v]) // restored after the test
				if tt.env[v] == "" {
					os.Unsetenv(v)
				}
			}
			var out, errOut bytes.Buffer
			code := run(t.Context(), []string{"serve"}, stdio{Stdout: &out, Stderr: &errOut})
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
