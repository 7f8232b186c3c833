package main_test

import (
	"encoding/json"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/hook"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// TestHookClaudeCodeDocs: docs/claude-code.md's policy is a valid policy
// file, and its settings.json blocks on a hook failure and keeps the three
// timeouts in order — each card's deadline before the hook's --timeout,
// which is before Claude Code kills the hook.
func TestHookClaudeCodeDocs(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/claude-code.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	yamlBlock := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(doc)
	jsonBlock := regexp.MustCompile("(?s)```json\n(\\{\n  \"env\".*?)```").FindStringSubmatch(doc)
	if yamlBlock == nil || jsonBlock == nil {
		t.Fatal("docs/claude-code.md lacks the policy (```yaml) or the settings.json (```json) block")
	}
	policy := regexp.MustCompile(`sha256: <[^>]*>`).ReplaceAllString(yamlBlock[1], "sha256: "+strings.Repeat("0", 64))
	f, err := policyfile.Parse([]byte("version: 1\nslack: {approvals_channel: G0APPROV1}\n" + policy))
	if err != nil {
		t.Fatalf("the documented policy: %v", err)
	}
	var settings struct {
		Hooks map[string][]struct {
			Matcher string `json:"matcher"`
			Hooks   []struct {
				Command   string `json:"command"`
				Timeout   int    `json:"timeout"`
				OnFailure string `json:"onFailure"`
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal([]byte(jsonBlock[1]), &settings); err != nil {
		t.Fatalf("the documented settings.json: %v", err)
	}
	pre := settings.Hooks["PreToolUse"]
	if len(pre) != 1 || len(pre[0].Hooks) != 1 || pre[0].Hooks[0].OnFailure != "block" {
		t.Fatalf("PreToolUse = %+v, want one hook with onFailure block", pre)
	}
	h := pre[0].Hooks[0]
	m := regexp.MustCompile(`--timeout (\S+)`).FindStringSubmatch(h.Command)
	if !strings.HasPrefix(h.Command, "countersign hook claude-code") || m == nil {
		t.Fatalf("hook command %q, want countersign hook claude-code --timeout D", h.Command)
	}
	wait, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if kill := time.Duration(h.Timeout) * time.Second; kill <= wait {
		t.Errorf("settings timeout %v is not above the hook's --timeout %v", kill, wait)
	}
	for name, p := range f.Policy.Tools {
		if p.Review != approval.ReviewNever && p.Timeout >= wait {
			t.Errorf("tool %s: timeout %v is not below the hook's --timeout %v", name, p.Timeout, wait)
		}
	}
	if f.Policy.External == nil || f.Policy.External.Timeout >= wait {
		t.Errorf("external = %+v, want a rule whose timeout is below the hook's --timeout %v", f.Policy.External, wait)
	}
	for _, ev := range []string{"PostToolUse", "PostToolUseFailure"} {
		if hs := settings.Hooks[ev]; len(hs) != 1 || !strings.HasPrefix(hs[0].Hooks[0].Command, "countersign hook claude-code") {
			t.Errorf("%s = %+v, want the hook (it reports what ran)", ev, hs)
		}
	}
}

// TestHookClaudeCodeDocsFirstLines: docs/claude-code.md states the minimum
// Claude Code version first (the doctor's, hook.MinVersion), and its http
// hook blocks on a failure and keeps its wait (?timeout=) below Claude
// Code's timeout.
func TestHookClaudeCodeDocsFirstLines(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/claude-code.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, rest, _ := strings.Cut(doc, "\n\n")
	first, _, _ := strings.Cut(rest, "\n\n")
	if !strings.HasPrefix(first, "**Claude Code "+hook.MinVersion+" or later.**") {
		t.Errorf("the first paragraph is %q; want it to start with the minimum version, %s", first, hook.MinVersion)
	}
	block := regexp.MustCompile("(?s)```json\n(\\{\n  \"hooks\".*?\"type\": \"http\".*?)```").FindStringSubmatch(doc)
	if block == nil {
		t.Fatal("docs/claude-code.md has no http hook settings block")
	}
	var settings struct {
		Hooks map[string][]struct {
			Hooks []struct {
				Type, URL, OnFailure string
				Timeout              int
				Headers              map[string]string
				AllowedEnvVars       []string
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal([]byte(block[1]), &settings); err != nil {
		t.Fatalf("the http hook settings: %v", err)
	}
	pre := settings.Hooks["PreToolUse"]
	if len(pre) != 1 || len(pre[0].Hooks) != 1 {
		t.Fatalf("PreToolUse = %+v, want one hook", pre)
	}
	h := pre[0].Hooks[0]
	u, err := url.Parse(h.URL)
	if err != nil {
		t.Fatal(err)
	}
	wait, err := time.ParseDuration(u.Query().Get("timeout"))
	if h.Type != "http" || h.OnFailure != "block" || u.Path != hook.PathHTTP || err != nil || time.Duration(h.Timeout)*time.Second <= wait {
		t.Errorf("http hook %+v: want type http, onFailure block, path %s, a ?timeout= below its timeout", h, hook.PathHTTP)
	}
	if h.Headers["Authorization"] != "Bearer $COUNTERSIGN_API_KEY" || len(h.AllowedEnvVars) != 1 || h.AllowedEnvVars[0] != "COUNTERSIGN_API_KEY" {
		t.Errorf("http hook headers %v, allowedEnvVars %v: want the key interpolated from COUNTERSIGN_API_KEY", h.Headers, h.AllowedEnvVars)
	}
}
