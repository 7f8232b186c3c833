package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// claudeBin is the real Claude Code CLI: $CLAUDE_BIN, else claude on
// PATH. Without it the test skips, visibly, except under CI=true (.ci/run
// installs it) where it fails.
func claudeBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CLAUDE_BIN"); p != "" {
		return p
	}
	p, err := exec.LookPath("claude")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("claude not found (set CLAUDE_BIN or put it on PATH); CI must run the Claude Code hook end to end")
		}
		t.Skip("claude not found (npm i -g @anthropic-ai/claude-code@2.1.332, or set CLAUDE_BIN): the Claude Code hook is not run end to end")
	}
	return p
}

// fakeAnthropic is a local fake of Anthropic's Messages API, streaming as
// the real one does: a request of the agent loop (one with tools) that
// carries no tool result is answered with a tool_use of Bash running
// command; one carrying the tool's result with a final text. Requests
// without tools (Claude Code's side queries) get a short text.
type fakeAnthropic struct {
	command string

	mu      sync.Mutex // guards results
	results []string   // the tool_result blocks Claude Code sent back, as JSON
	n       int
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"not here"}}`, http.StatusNotFound)
		return
	}
	var req struct {
		Tools    []json.RawMessage `json:"tools"`
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	var last []map[string]any
	if n := len(req.Messages); n > 0 {
		_ = json.Unmarshal(req.Messages[n-1].Content, &last)
	}
	var result map[string]any
	for _, b := range last {
		if b["type"] == "tool_result" {
			result = b
		}
	}
	f.mu.Lock()
	f.n++
	id := fmt.Sprintf("toolu_e2e_%d_%d", time.Now().UnixNano(), f.n)
	if result != nil {
		b, _ := json.Marshal(result)
		f.results = append(f.results, string(b))
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	var ev bytes.Buffer
	send := func(name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(&ev, "event: %s\ndata: %s\n\n", name, b)
	}
	send("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant",
		"model": "claude-sonnet-4-5", "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1}}})
	stop := "end_turn"
	if len(req.Tools) > 0 && result == nil {
		input, _ := json.Marshal(map[string]string{"command": f.command, "description": "Clean the build"})
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": id, "name": "Bash", "input": map[string]any{}}})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
		stop = "tool_use"
	} else {
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": "Done."}})
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 5}})
	send("message_stop", map[string]any{"type": "message_stop"})
	_, _ = w.Write(ev.Bytes())
}

func (f *fakeAnthropic) toolResults() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.results...)
}

// TestHookClaudeCodeCLI runs the real Claude Code CLI in print mode against
// a local fake of Anthropic's Messages API, with `countersign hook
// claude-code` as its PreToolUse hook (the settings docs/claude-code.md
// gives), under bypassPermissions: a Bash call rejected in Slack never
// runs and the model reads the approver's reason; an approved one runs.
func TestHookClaudeCodeCLI(t *testing.T) {
	claude := claudeBin(t)
	bin := buildBinary(t)
	d := startHookDemo(t)

	for _, tc := range []struct {
		name, action string
		runs         bool
	}{
		{"rejected", "cs_reject", false},
		{"approved", "cs_approve", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			work := filepath.Join(home, "project")
			if err := os.MkdirAll(work, 0o755); err != nil {
				t.Fatal(err)
			}
			marker := filepath.Join(work, "ran-"+tc.name)
			fake := &fakeAnthropic{command: "echo ran > " + marker}
			api := httptest.NewServer(fake)
			defer api.Close()

			hookCmd := strings.Join([]string{bin.path, "hook", "claude-code", "--timeout", "100s"}, " ")
			// The server's URL from the settings' env, as docs/claude-code.md
			// shows; the key from the environment Claude Code starts in.
			settings := map[string]any{"env": map[string]string{"COUNTERSIGN_URL": "http://" + d.Main.Addr()}, "hooks": map[string]any{
				"PreToolUse": []any{map[string]any{"matcher": "*",
					"hooks": []any{map[string]any{"type": "command", "command": hookCmd, "timeout": 110, "onFailure": "block"}}}},
				"PostToolUse": []any{map[string]any{"matcher": "*",
					"hooks": []any{map[string]any{"type": "command", "command": hookCmd, "timeout": 30}}}}}}
			sb, _ := json.Marshal(settings)
			settingsFile := filepath.Join(home, "settings.json")
			if err := os.WriteFile(settingsFile, sb, 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, claude, "-p", "Clean the build directory.", "--output-format", "json",
				"--settings", settingsFile, "--no-session-persistence", "--permission-mode", "bypassPermissions")
			cmd.Dir = work
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "CLAUDE_CONFIG_DIR=" + filepath.Join(home, ".claude"),
				"TMPDIR=" + home, "IS_SANDBOX=1", "ANTHROPIC_BASE_URL=" + api.URL, "ANTHROPIC_API_KEY=sk-ant-fake",
				"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1", "DISABLE_ERROR_REPORTING=1",
				"COUNTERSIGN_API_KEY=" + d.APIKey, "XDG_STATE_HOME=" + filepath.Join(home, "state")}, bin.env...)
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }() // exits with the CLI (killed by ctx at the latest)

			card := hookCard(t, d, marker)
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the command ran before a decision")
			}
			carol := d.Cast.SecondApprover.ID
			if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, tc.action); err != nil {
				t.Fatalf("Click: %v", err)
			}
			const reason = "not on a Friday"
			if tc.action == "cs_reject" {
				v := openModal(t, d, carol)
				if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
					t.Fatalf("SubmitView = %+v, %v", res, err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("claude: %v\nstdout %s\nstderr %s", err, out.String(), stderr.String())
			}
			_, err := os.Stat(marker)
			if ran := err == nil; ran != tc.runs {
				t.Errorf("the Bash command ran: %v, want %v\nclaude: %s\nresults: %q", ran, tc.runs, out.String(), fake.toolResults())
			}
			results := strings.Join(fake.toolResults(), "\n")
			if !tc.runs && !strings.Contains(results, reason) {
				t.Errorf("the model was not told the reason %q; tool results: %s", reason, results)
			}
			if tc.runs { // PostToolUse reported it with the claim's token
				waitAuditN(t, d, 1, func(e approval.Entry) bool { return e.Event == approval.EventExecuted && e.Tool == "Bash" })
			}
		})
	}
}
