package main_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// hookPolicy declares Claude Code's Bash (git status/diff/log run without
// a person, every other command is reviewed) and reviews every other
// tool through the external rule, Respond included.
const hookPolicy = `version: 1
slack:
  approvals_channel: G0APPROV1
  task_channels: [C0TASKS01]
defaults:
  risk: medium
  review: auto
  decisions: [approve, reject]
  timeout: 24h
  approvers: {usergroups: [S0APPROV1]}
external:
  risk: medium
  review: always
  decisions: [approve, edit, reject, respond]
  timeout: 4h
tools:
  - name: Bash
    description: Claude Code's shell.
    review:
      mode: auto
      when: '!args.command.matches("^git (status|diff|log)( [-A-Za-z0-9_./=:@]+)*$")'
      reason: a command other than git status, diff or log
    decisions: [approve, edit, reject, respond]
    schema:
      type: object
      properties:
        command: {type: string}
        description: {type: string}
      required: [command]
`

// startHookDemo is the demo on hookPolicy, with the environment the hook
// reads (so the tests using it are serial); edit, when given, adjusts the
// demo before it starts.
func startHookDemo(t *testing.T, edit ...func(*main.Demo)) *main.Demo {
	t.Helper()
	d := startHookServer(t, edit...)
	t.Setenv("COUNTERSIGN_API_KEY", d.APIKey)
	t.Setenv("COUNTERSIGN_URL", "")
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	return d
}

// startHookServer is startHookDemo without the environment: for a test
// that starts the hook as a process of its own, with the environment it
// gives that process, and so may run in parallel.
func startHookServer(t *testing.T, edit ...func(*main.Demo)) *main.Demo {
	t.Helper()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(hookPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	dm := &main.Demo{World: demo.World{PolicyFile: file}}
	for _, e := range edit {
		e(dm)
	}
	return MustStartDemo(t, dm)
}

// hookRun is one run of `countersign hook claude-code` as Claude Code
// starts it: the hook input on stdin, the answer on stdout.
type hookRun struct {
	stdout, stderr string
	code           int
}

// runHookAsync runs the hook in the background: it is waiting while the
// test clicks.
func runHookAsync(d *main.Demo, stdin string, args ...string) <-chan hookRun {
	out := make(chan hookRun, 1)
	go func() { // exits when the hook answers (bounded by its --timeout)
		var so, se strings.Builder
		argv := append([]string{"hook", "claude-code", "--url", "http://" + d.Main.Addr(), "--timeout", "60s"}, args...)
		code := main.Run(context.Background(), argv, main.Stdio{Stdin: strings.NewReader(stdin), Stdout: &so, Stderr: &se})
		out <- hookRun{so.String(), se.String(), code}
	}()
	return out
}

func runHook(t *testing.T, d *main.Demo, stdin string, args ...string) hookRun {
	t.Helper()
	return hookAnswer(t, runHookAsync(d, stdin, args...))
}

func hookAnswer(t *testing.T, ch <-chan hookRun) hookRun {
	t.Helper()
	select {
	case r := <-ch:
		if r.code != 0 {
			t.Fatalf("hook exited %d; stderr %q", r.code, r.stderr)
		}
		return r
	case <-time.After(90 * time.Second):
		t.Fatal("the hook did not answer")
	}
	return hookRun{}
}

// hookOutput is what Claude Code reads of the answer.
type hookOutput struct {
	HookSpecificOutput struct {
		HookEventName            string          `json:"hookEventName"`
		PermissionDecision       string          `json:"permissionDecision"`
		PermissionDecisionReason string          `json:"permissionDecisionReason"`
		UpdatedInput             json.RawMessage `json:"updatedInput"`
	} `json:"hookSpecificOutput"`
}

// decoded parses the answer strictly: nothing but hookSpecificOutput.
func decoded(t *testing.T, r hookRun) hookOutput {
	t.Helper()
	var o hookOutput
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		t.Fatalf("hook stdout %q is not the PreToolUse answer: %v", r.stdout, err)
	}
	if o.HookSpecificOutput.HookEventName != "PreToolUse" {
		t.Errorf("hookEventName = %q, want PreToolUse", o.HookSpecificOutput.HookEventName)
	}
	return o
}

// preToolUse is the hook input Claude Code 2.1 writes for a tool call
// (recorded, with its fields the hook ignores).
func preToolUse(tool, toolUseID, input string) string {
	return `{"session_id":"9f1c2e4a-5b6d-4e7f-8a9b-0c1d2e3f4a5b","transcript_path":"/home/dev/.claude/projects/-home-dev-shop/9f1c2e4a.jsonl",` +
		`"cwd":"/home/dev/shop","prompt_id":"p-1","permission_mode":"default","effort":{"level":"medium"},"hook_event_name":"PreToolUse",` +
		`"tool_name":"` + tool + `","tool_input":` + input + `,"tool_use_id":"` + toolUseID + `"}`
}

// hookCard waits for the approvals card whose blocks contain marker.
func hookCard(t *testing.T, d *main.Demo, marker string) slacksim.Message {
	t.Helper()
	var card slacksim.Message
	waitWS(t, d, "the card showing "+marker, func() bool {
		for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
			if m.ThreadTS == "" && m.BotID != "" && strings.Contains(string(m.Blocks), marker) {
				card = m
				return true
			}
		}
		return false
	})
	return card
}

var requestIDRe = regexp.MustCompile(`req_[A-Za-z0-9_-]+`)

// TestHookClaudeCode: `countersign hook claude-code` answers Claude Code's
// PreToolUse inputs for Bash, Write, Edit and an MCP tool from decisions
// clicked in the workspace: allow only once approved and claimed (edited
// input as updatedInput), deny with the approver's reason or answer; a
// second run for the same tool_use_id never allows again; PostToolUse
// reports the result with the kept claim token; a command the policy's
// when rule lets through runs without a card.
func TestHookClaudeCode(t *testing.T) {
	d := startHookDemo(t)
	bob, carol := d.Cast.Approver.ID, d.Cast.SecondApprover.ID
	c := apiClient(d)

	t.Run("git status runs without a person", func(t *testing.T) {
		o := decoded(t, runHook(t, d, preToolUse("Bash", "toolu_01GIT", `{"command":"git status","description":"Show working tree status"}`)))
		if o.HookSpecificOutput.PermissionDecision != "allow" || !strings.Contains(o.HookSpecificOutput.PermissionDecisionReason, "policy") {
			t.Errorf("answer = %+v, want allow by the policy", o.HookSpecificOutput)
		}
		// A second command after it (;, &&, |, $(…)) is not read-only:
		// the rule's character set leaves them out, so a person looks.
		chained := decoded(t, runHook(t, d, preToolUse("Bash", "toolu_01GIT2", `{"command":"git status && rm -rf ~","description":"x"}`), "--timeout", "1s"))
		if chained.HookSpecificOutput.PermissionDecision != "deny" || !strings.Contains(chained.HookSpecificOutput.PermissionDecisionReason, "--timeout") {
			t.Errorf("git status && rm -rf ~: answer = %+v, want deny after waiting for a person", chained.HookSpecificOutput)
		}
	})

	in := preToolUse("Bash", "toolu_01BASH", `{"command":"rm -rf build","description":"Remove the build directory"}`)
	var id string
	t.Run("Bash approved, claimed once, result reported", func(t *testing.T) {
		ch := runHookAsync(d, in)
		card := hookCard(t, d, "rm -rf build")
		text := string(card.Blocks)
		for _, want := range []string{"Bash", "Working directory", "/home/dev/shop", "9f1c2e4a-5b6d-4e7f-8a9b-0c1d2e3f4a5b", "Permission mode"} {
			if !strings.Contains(text, want) {
				t.Errorf("card does not show %q: %s", want, text)
			}
		}
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		r := hookAnswer(t, ch)
		o := decoded(t, r)
		if o.HookSpecificOutput.PermissionDecision != "allow" || o.HookSpecificOutput.UpdatedInput != nil {
			t.Fatalf("answer = %s, want allow without updatedInput", r.stdout)
		}
		id = requestIDRe.FindString(o.HookSpecificOutput.PermissionDecisionReason)
		want := `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow",` +
			`"permissionDecisionReason":"Approved by ` + d.Cast.Approver.RealName + ` in Countersign (request ` + id + `)."}}` + "\n"
		if r.stdout != want {
			t.Errorf("stdout = %q, want %q", r.stdout, want)
		}
		got, err := c.Get(context.Background(), id, 0)
		if err != nil || got.Status != client.Executing {
			t.Fatalf("request %s after the allow = %+v, %v; want executing (claimed)", id, got, err)
		}

		again := decoded(t, runHook(t, d, in))
		if again.HookSpecificOutput.PermissionDecision != "deny" || !strings.Contains(again.HookSpecificOutput.PermissionDecisionReason, "already claimed") {
			t.Errorf("second run for toolu_01BASH = %+v, want deny: already claimed", again.HookSpecificOutput)
		}

		post := strings.Replace(in, `"hook_event_name":"PreToolUse"`, `"hook_event_name":"PostToolUse"`, 1)
		post = strings.TrimSuffix(post, "}") + `,"tool_response":{"stdout":"","stderr":"","interrupted":false}}`
		if r := runHook(t, d, post); r.stdout != "" || r.stderr != "" {
			t.Errorf("PostToolUse run = %+v, want no output", r)
		}
		got, err = c.Get(context.Background(), id, 0)
		if err != nil || got.Status != client.Executed || got.Result == nil || !strings.Contains(got.Result.Output, "interrupted") {
			t.Errorf("request %s after PostToolUse = %+v, %v; want executed with the tool's response", id, got, err)
		}
	})

	t.Run("Bash edited: updatedInput", func(t *testing.T) {
		ch := runHookAsync(d, preToolUse("Bash", "toolu_01EDIT", `{"command":"rm -rf node_modules","description":"Clean"}`))
		card := hookCard(t, d, "rm -rf node_modules")
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, bob)
		if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"f0": {"v": "rm -rf node_modules/.cache"}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		r := hookAnswer(t, ch)
		o := decoded(t, r)
		var upd map[string]any
		if err := json.Unmarshal(o.HookSpecificOutput.UpdatedInput, &upd); err != nil || o.HookSpecificOutput.PermissionDecision != "allow" ||
			upd["command"] != "rm -rf node_modules/.cache" || upd["description"] != "Clean" {
			t.Errorf("answer = %s, want allow with updatedInput {command: rm -rf node_modules/.cache, description: Clean}", r.stdout)
		}
	})

	t.Run("Write rejected: the reason", func(t *testing.T) {
		ch := runHookAsync(d, preToolUse("Write", "toolu_01WRITE", `{"file_path":"/home/dev/shop/.env","content":"STRIPE_KEY=sk_live_x\n"}`))
		card := hookCard(t, d, "/home/dev/shop/.env")
		if !strings.Contains(string(card.Blocks), "STRIPE_KEY") {
			t.Errorf("card does not show the content: %s", card.Blocks)
		}
		if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, carol)
		const reason = "never write live keys; use the vault"
		if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		r := hookAnswer(t, ch)
		want := `{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny",` +
			`"permissionDecisionReason":"Rejected by ` + d.Cast.SecondApprover.RealName + ` in Countersign: ` + reason + `"}}` + "\n"
		if r.stdout != want {
			t.Errorf("stdout = %q, want %q", r.stdout, want)
		}
	})

	t.Run("Edit answered: the answer", func(t *testing.T) {
		ch := runHookAsync(d, preToolUse("Edit", "toolu_01EDITF",
			`{"file_path":"/home/dev/shop/config.go","old_string":"const retries = 3","new_string":"const retries = 30","replace_all":false}`))
		card := hookCard(t, d, "/home/dev/shop/config.go")
		for _, want := range []string{"- const retries = 3", "+ const retries = 30"} {
			if !strings.Contains(string(card.Blocks), want) {
				t.Errorf("card does not show the diff line %q: %s", want, card.Blocks)
			}
		}
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_respond"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, bob)
		const answer = "retries are set in the deploy config, not in code"
		if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"response": {"text": answer}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		o := decoded(t, hookAnswer(t, ch))
		if o.HookSpecificOutput.PermissionDecision != "deny" || !strings.HasSuffix(o.HookSpecificOutput.PermissionDecisionReason, answer) {
			t.Errorf("answer = %+v, want deny with the answer %q", o.HookSpecificOutput, answer)
		}
	})

	t.Run("MCP tool approved", func(t *testing.T) {
		in := preToolUse("mcp__orders__issue_refund", "toolu_01MCP", `{"order_id":"1234","amount":64}`)
		in = strings.TrimSuffix(in, "}") + `,"mcp_server":"orders"}`
		ch := runHookAsync(d, in)
		card := hookCard(t, d, "mcp__orders__issue_refund")
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		if o := decoded(t, hookAnswer(t, ch)); o.HookSpecificOutput.PermissionDecision != "allow" {
			t.Errorf("answer = %+v, want allow", o.HookSpecificOutput)
		}
	})
}

// TestHookClaudeCodeFailsClosed: whenever Countersign cannot be asked
// (unreachable, a bad or missing key, no decision before the hook's
// --timeout) the hook still answers — deny, saying what to fix — with
// exit code 0, so Claude Code never runs the call.
func TestHookClaudeCodeFailsClosed(t *testing.T) {
	d := startHookDemo(t)
	in := func(id string) string {
		return preToolUse("Bash", id, `{"command":"make deploy","description":"Deploy"}`)
	}
	for _, tc := range []struct {
		name, key string
		args      []string
		want      []string
	}{
		{"unreachable", d.APIKey, []string{"--url", "http://127.0.0.1:1"}, []string{"cannot be reached", "COUNTERSIGN_URL"}},
		{"bad key", "csk_not_a_key", nil, []string{"refused the API key", "COUNTERSIGN_API_KEY"}},
		{"no key", "", nil, []string{"COUNTERSIGN_API_KEY: required"}},
		{"no url", d.APIKey, []string{"--url", ""}, []string{"COUNTERSIGN_URL (--url)"}},
		{"timeout", d.APIKey, []string{"--timeout", "1s"}, []string{"no decision within the hook's --timeout (1s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("COUNTERSIGN_API_KEY", tc.key)
			r := runHook(t, d, in("toolu_01FAIL_"+strings.ReplaceAll(tc.name, " ", "_")), tc.args...)
			o := decoded(t, r)
			if o.HookSpecificOutput.PermissionDecision != "deny" {
				t.Errorf("answer = %s, want deny", r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(o.HookSpecificOutput.PermissionDecisionReason, w) {
					t.Errorf("reason %q does not say %q", o.HookSpecificOutput.PermissionDecisionReason, w)
				}
			}
		})
	}
}
