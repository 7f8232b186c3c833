package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
)

// claudeRun is one run of the real Claude Code CLI in print mode against
// a local fake of Anthropic's Messages API whose model asks for one Bash
// call writing a marker file, in a home and project of its own.
type claudeRun struct {
	claude, home, work, marker string
	fake                       *fakeAnthropic
	api                        *httptest.Server
	env                        []string
}

func newClaudeRun(t *testing.T, claude string, d *main.Demo, bin command, name string) *claudeRun {
	t.Helper()
	home := t.TempDir()
	work := filepath.Join(home, "project")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &claudeRun{claude: claude, home: home, work: work, marker: filepath.Join(work, "ran-"+name)}
	c.fake = &fakeAnthropic{command: "echo ran > " + c.marker}
	c.api = httptest.NewServer(c.fake)
	t.Cleanup(c.api.Close)
	c.env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "CLAUDE_CONFIG_DIR=" + filepath.Join(home, ".claude"),
		"TMPDIR=" + home, "IS_SANDBOX=1", "ANTHROPIC_BASE_URL=" + c.api.URL, "ANTHROPIC_API_KEY=sk-ant-fake",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1",
		"COUNTERSIGN_API_KEY=" + d.APIKey, "XDG_STATE_HOME=" + filepath.Join(home, "state")}, bin.env...)
	return c
}

// settings writes settings.json with PreToolUse (and, when post is set,
// PostToolUse and PostToolUseFailure) hooks and returns its path.
func (c *claudeRun) settings(t *testing.T, pre map[string]any, post map[string]any) string {
	t.Helper()
	hooks := map[string]any{"PreToolUse": []any{map[string]any{"matcher": "*", "hooks": []any{pre}}}}
	if post != nil {
		for _, ev := range []string{"PostToolUse", "PostToolUseFailure"} {
			hooks[ev] = []any{map[string]any{"matcher": "*", "hooks": []any{post}}}
		}
	}
	b, _ := json.Marshal(map[string]any{"hooks": hooks})
	p := filepath.Join(c.home, "settings.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start starts claude -p with args; the channel gets its end (it is
// killed after 150 s at the latest).
func (c *claudeRun) start(t *testing.T, stdout *bytes.Buffer, args ...string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	cmd := exec.CommandContext(ctx, c.claude, append([]string{"-p"}, args...)...)
	cmd.Dir, cmd.Env = c.work, c.env
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { // exits with the CLI (killed by ctx at the latest)
		defer cancel()
		err := cmd.Wait()
		if err != nil {
			t.Logf("claude stderr: %s", stderr.String())
		}
		done <- err
	}()
	return done
}

func (c *claudeRun) ran() bool {
	_, err := os.Stat(c.marker)
	return err == nil
}

// TestHookClaudeCodeCLIKilledHook is issue 47's case with the real CLI: the
// hook's timeout in settings.json (3 s) is shorter than its --timeout, so
// Claude Code stops the hook while it waits for a person, under
// bypassPermissions. With "onFailure": "block" (Claude Code 2.1.295 and
// later) the command never runs and the model reads why; the stopped hook
// withdraws its request (or, killed outright, the server's grace period
// does), so the card says the caller gave up instead of "Waiting for
// approval" for hours.
func TestHookClaudeCodeCLIKilledHook(t *testing.T) {
	claude := claudeBin(t)
	bin := buildBinary(t)
	d := startHookDemo(t, func(d *main.Demo) { d.WithdrawGrace = time.Second })
	c := newClaudeRun(t, claude, d, bin, "killed")
	hookCmd := strings.Join([]string{bin.path, "hook", "claude-code", "--url", "http://" + d.Main.Addr(), "--timeout", "100s"}, " ")
	settings := c.settings(t, map[string]any{"type": "command", "command": hookCmd, "timeout": 3, "onFailure": "block"}, nil)
	var out bytes.Buffer
	done := c.start(t, &out, "Clean the build directory.", "--output-format", "json", "--settings", settings,
		"--no-session-persistence", "--permission-mode", "bypassPermissions")
	card := hookCard(t, d, c.marker)
	id := requestOfCard(t, card)
	if err := <-done; err != nil {
		t.Fatalf("claude: %v\n%s", err, out.String())
	}
	if c.ran() {
		t.Fatalf("the command ran after Claude Code killed its hook: %s", out.String())
	}
	results := strings.Join(c.fake.toolResults(), "\n")
	if !strings.Contains(results, `onFailure is \"block\"`) {
		t.Errorf("the model was not told the hook timed out and blocked: %s", results)
	}
	cardSaying(t, d, c.marker, "Cancelled", "The caller gave up")
	got, err := apiClient(d).Get(context.Background(), id, 0)
	if err != nil || got.Status != client.Cancelled || !strings.Contains(got.Reason, "gave up") {
		t.Errorf("request %s = %+v, %v; want cancelled: the caller gave up", id, got, err)
	}
}

// TestHookClaudeCodeCLIHTTP runs the real CLI with Countersign's http hook
// (no binary on the developer's machine): Claude Code posts the PreToolUse
// input to /hooks/claude-code with the API key from its environment, and
// reads the answer. A rejected call never runs and the model reads the
// reason; an approved one runs once and PostToolUse reports it; a call
// Claude Code stops waiting for (its http timeout, 3 s) never runs and
// its card says the caller gave up.
func TestHookClaudeCodeCLIHTTP(t *testing.T) {
	claude := claudeBin(t)
	bin := buildBinary(t)
	d := startHookDemo(t, func(d *main.Demo) { d.WithdrawGrace = time.Second })
	url := "http://" + d.Main.Addr() + "/hooks/claude-code?timeout=100s"
	auth := map[string]any{"Authorization": "Bearer $COUNTERSIGN_API_KEY"}
	for _, tt := range []struct {
		name, action string
		timeout      int
		runs         bool
	}{
		{"rejected", "cs_reject", 110, false},
		{"approved", "cs_approve", 110, true},
		{"timed out", "", 3, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newClaudeRun(t, claude, d, bin, strings.ReplaceAll(tt.name, " ", "-"))
			settings := c.settings(t,
				map[string]any{"type": "http", "url": url, "timeout": tt.timeout, "onFailure": "block", "headers": auth, "allowedEnvVars": []string{"COUNTERSIGN_API_KEY"}},
				map[string]any{"type": "http", "url": url, "timeout": 30, "headers": auth, "allowedEnvVars": []string{"COUNTERSIGN_API_KEY"}})
			var out bytes.Buffer
			done := c.start(t, &out, "Clean the build directory.", "--output-format", "json", "--settings", settings,
				"--no-session-persistence", "--permission-mode", "bypassPermissions")
			card := hookCard(t, d, c.marker)
			id := requestOfCard(t, card)
			const reason = "not on a Friday"
			switch tt.action {
			case "cs_approve":
				if err := d.Workspace.Click(d.Cast.SecondApprover.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
					t.Fatalf("Click: %v", err)
				}
			case "cs_reject":
				carol := d.Cast.SecondApprover.ID
				if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
					t.Fatalf("Click: %v", err)
				}
				v := openModal(t, d, carol)
				if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
					t.Fatalf("SubmitView = %+v, %v", res, err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("claude: %v\n%s", err, out.String())
			}
			if c.ran() != tt.runs {
				t.Errorf("the Bash command ran: %v, want %v\nclaude: %s\nresults: %q", c.ran(), tt.runs, out.String(), c.fake.toolResults())
			}
			results := strings.Join(c.fake.toolResults(), "\n")
			switch tt.name {
			case "rejected":
				if !strings.Contains(results, reason) {
					t.Errorf("the model was not told the reason %q; tool results: %s", reason, results)
				}
			case "approved": // PostToolUse reported it with the claim kept on the server
				waitAuditN(t, d, 1, func(e approval.Entry) bool { return e.Event == approval.EventExecuted && e.RequestID == id })
			case "timed out":
				cardSaying(t, d, c.marker, "Cancelled", "The caller gave up")
				if got, err := apiClient(d).Get(context.Background(), id, 0); err != nil || got.Status != client.Cancelled {
					t.Errorf("request %s = %+v, %v; want cancelled", id, got, err)
				}
			}
		})
	}
}

// TestHookClaudeCodeCLIDefer: with --defer, claude -p ends while a person
// decides (stop_reason tool_deferred, the Bash call not run, the card up);
// once the card is decided, claude -p --resume runs the approved call (and
// PostToolUse reports it) or tells the model the rejection.
func TestHookClaudeCodeCLIDefer(t *testing.T) {
	claude := claudeBin(t)
	bin := buildBinary(t)
	d := startHookDemo(t)
	hookCmd := strings.Join([]string{bin.path, "hook", "claude-code", "--url", "http://" + d.Main.Addr(), "--defer", "--timeout", "100s"}, " ")
	postCmd := strings.Join([]string{bin.path, "hook", "claude-code", "--url", "http://" + d.Main.Addr()}, " ")
	for _, tt := range []struct {
		name, action string
		runs         bool
	}{
		{"approved", "cs_approve", true},
		{"rejected", "cs_reject", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newClaudeRun(t, claude, d, bin, "defer-"+tt.name)
			settings := c.settings(t, map[string]any{"type": "command", "command": hookCmd, "timeout": 110, "onFailure": "block"},
				map[string]any{"type": "command", "command": postCmd, "timeout": 30})
			var first bytes.Buffer
			if err := <-c.start(t, &first, "Clean the build directory.", "--output-format", "json", "--settings", settings,
				"--permission-mode", "bypassPermissions"); err != nil {
				t.Fatalf("claude -p: %v\n%s", err, first.String())
			}
			var res struct {
				SessionID       string `json:"session_id"`
				StopReason      string `json:"stop_reason"`
				DeferredToolUse struct {
					Name string `json:"name"`
				} `json:"deferred_tool_use"`
			}
			if err := json.Unmarshal(first.Bytes(), &res); err != nil || res.StopReason != "tool_deferred" || res.DeferredToolUse.Name != "Bash" || res.SessionID == "" {
				t.Fatalf("claude -p answered %s (%v); want stop_reason tool_deferred for Bash", first.String(), err)
			}
			if c.ran() {
				t.Fatal("the deferred command ran")
			}
			card := hookCard(t, d, c.marker)
			const reason = "not on a Friday"
			carol := d.Cast.SecondApprover.ID
			if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, tt.action); err != nil {
				t.Fatalf("Click: %v", err)
			}
			if tt.action == "cs_reject" {
				v := openModal(t, d, carol)
				if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
					t.Fatalf("SubmitView = %+v, %v", res, err)
				}
			}
			id := requestOfCard(t, card)
			waitAuditN(t, d, 1, func(e approval.Entry) bool {
				return e.RequestID == id && e.Event == approval.EventDecided
			})
			var second bytes.Buffer
			if err := <-c.start(t, &second, "--resume", res.SessionID, "--output-format", "json", "--settings", settings,
				"--permission-mode", "bypassPermissions"); err != nil {
				t.Fatalf("claude -p --resume: %v\n%s", err, second.String())
			}
			if c.ran() != tt.runs {
				t.Errorf("after --resume the command ran: %v, want %v\n%s", c.ran(), tt.runs, second.String())
			}
			if tt.runs {
				waitAuditN(t, d, 1, func(e approval.Entry) bool { return e.Event == approval.EventExecuted && e.RequestID == id })
			} else if results := strings.Join(c.fake.toolResults(), "\n"); !strings.Contains(results, reason) {
				t.Errorf("the model was not told the reason %q; tool results: %s", reason, results)
			}
		})
	}
}

// TestHookClaudeCodeDoctorCLI runs the doctor on the real CLI: with
// docs/claude-code.md's settings and a policy whose deadlines are below
// the hook's wait, every check is ok (exit 0) and the version is the
// CLI's; a settings file that lets a killed hook through is a FIX saying
// what to change (exit 1).
func TestHookClaudeCodeDoctorCLI(t *testing.T) {
	claude := claudeBin(t)
	dir := t.TempDir()
	t.Setenv("HOME", dir) // no user settings but the test's
	t.Setenv("CLAUDE_CONFIG_DIR", filepath.Join(dir, ".claude"))
	t.Setenv("COUNTERSIGN_URL", "")
	t.Setenv("COUNTERSIGN_CONFIG", "")
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(`version: 1
slack: {approvals_channel: G0APPROV1}
external: {review: always, timeout: 10m, remind_after: 5m}
tools:
  - name: Bash
    description: Claude Code's shell.
    review: always
    timeout: 10m
    remind_after: 5m
`), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(good, settings(`{"type":"command","command":"countersign hook claude-code --timeout 11m","timeout":720,"onFailure":"block"}`), 0o600)
	_ = os.WriteFile(bad, settings(`{"type":"command","command":"countersign hook claude-code --timeout 11m","timeout":600}`), 0o600)
	for _, tt := range []struct {
		file string
		code int
		want []string
	}{
		{good, 0, []string{"ok  Claude Code 2.1.", `has "onFailure": "block"`, "the policy's longest deadline"}},
		{bad, 1, []string{`FIX ` + bad, `set "onFailure": "block" on it`, `set "timeout": 720`}},
	} {
		var out, errOut strings.Builder
		code := main.Run(context.Background(), []string{"hook", "claude-code", "doctor", "--claude", claude, "--settings", tt.file, "--policy", policy},
			main.Stdio{Stdout: &out, Stderr: &errOut})
		if code != tt.code {
			t.Errorf("doctor --settings %s exited %d, want %d\n%s%s", filepath.Base(tt.file), code, tt.code, out.String(), errOut.String())
		}
		for _, w := range tt.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("doctor --settings %s does not say %q:\n%s", filepath.Base(tt.file), w, out.String())
			}
		}
	}
}

// settings is a settings.json with one PreToolUse hook entry.
func settings(entry string) []byte {
	return []byte(`{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[` + entry + `]}]}}`)
}
