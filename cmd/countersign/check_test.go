package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const checkBase = `version: 1
slack: {approvals_channel: C0APPROVALS}
tools:
  - name: lookup_order
    risk: low
    review: never
    schema: {type: object, properties: {order_id: {type: string}}}
    http: {method: GET, url: "https://sor.example/orders/{{urlquery .Args.order_id}}"}
`

// TestCheck runs `countersign check` on good and bad tools files: every
// error names the key path; exit 0 valid, 1 invalid.
func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		file     string
		wantCode int
		wantOut  []string
	}{
		{name: "valid", file: checkBase, wantCode: 0, wantOut: []string{"ok (version 1, 1 tools"}},
		{name: "demo policy", file: string(demo.Policy), wantCode: 0, wantOut: []string{"ok (version 1, 5 tools",
			"TOOL ", "issue_refund        auto when double(args.amount) > 50.0", "set_order_priority  after a 2m cancel window", "1, 2 when double(args.amount) > 500.0",
			"remember 1h; preauthorize 1h; deny when double(args.amount) > 2000.0", "groups S0LEADS01", "sensitive delete"}},
		{
			name: "review modes",
			file: checkBase + "  - name: restart\n    risk: low\n    review: after\n    cancel_window: 5m\n" +
				"  - name: tag\n    risk: low\n    review: never\n    sample: 0.05\n",
			wantCode: 0, wantOut: []string{"restart       after a 5m cancel window", "cancel,run_now", "sample 5% of unreviewed calls afterwards"},
		},
		{
			name:     "review after without a window",
			file:     checkBase + "  - name: restart\n    risk: low\n    review: after\n",
			wantCode: 1, wantOut: []string{"tools[1].cancel_window: required"},
		},
		{
			name:     "bad URL template",
			file:     strings.Replace(checkBase, "{{urlquery .Args.order_id}}", "{{urlquery .Args.order_id}", 1),
			wantCode: 1, wantOut: []string{"tools[0].http.url"},
		},
		{
			name:     "bad schema",
			file:     strings.Replace(checkBase, "{type: object, properties: {order_id: {type: string}}}", "{type: object, properties: {order_id: {type: strang}}}", 1),
			wantCode: 1, wantOut: []string{"tools[0].schema"},
		},
		{
			name:     "bad CEL",
			file:     checkBase + "  - name: refund\n    risk: medium\n    review: {mode: auto, when: \"arg.amount > 5\"}\n",
			wantCode: 1, wantOut: []string{"tools[1].review.when", "arg"},
		},
		{
			name:     "never on high risk",
			file:     strings.Replace(checkBase, "risk: low", "risk: high", 1),
			wantCode: 1, wantOut: []string{"tools[0].review"},
		},
		// The first hour of a new team: three policies that passed check
		// and could not work.
		{
			name:     "a usergroup handle, not its id",
			file:     strings.Replace(checkBase, "tools:\n", "defaults:\n  approvers: {usergroups: [\"@sre\"]}\ntools:\n", 1),
			wantCode: 1, wantOut: []string{`defaults.approvers.usergroups[0]: must be a Slack usergroup id, got "@sre"`, "a usergroup id starts with S", "usergroups.list", "countersign check --slack"},
		},
		{
			name:     "a task channel's name, not its id",
			file:     strings.Replace(checkBase, "slack: {approvals_channel: C0APPROVALS}", "slack: {approvals_channel: C0APPROVALS, task_channels: [\"#ops\"]}", 1),
			wantCode: 1, wantOut: []string{`slack.task_channels[0]: "#ops" is not a channel id`, "Channel ID", "countersign check --slack"},
		},
		{
			name: "a quorum rule reading a property the schema lacks, as a block on a review always tool",
			file: checkBase + `  - name: deploy
    review: always
    quorum_when:
      - when: args.env == "prod"
        quorum: 2
        reason: production
    schema:
      type: object
      properties:
        service: {type: string}
        environment: {type: string}
`,
			wantCode: 1, wantOut: []string{"tools[1].quorum_when[0].when: args.env is not a property of the tool's schema (it has: environment, service); did you mean args.environment?"},
		},
		{
			name:     "invalid YAML",
			file:     "version: 1\ntools: [\n",
			wantCode: 1, wantOut: []string{"policy.yaml:2: invalid YAML"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "policy.yaml", tt.file)
			var out, errOut bytes.Buffer
			code := main.Run(t.Context(), []string{"check", path}, main.Stdio{Stdout: &out, Stderr: &errOut})
			all := out.String() + errOut.String()
			if code != tt.wantCode {
				t.Fatalf("check exit = %d, want %d; output:\n%s", code, tt.wantCode, all)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(all, w) {
					t.Errorf("check output does not contain %q:\n%s", w, all)
				}
			}
		})
	}
}

// TestCheckSlackFlag: check --slack looks the file's Slack names and ids
// up with the bot token in the workspace SLACK_API_URL names (the local
// one here) and prints the id to write for each name.
func TestCheckSlackFlag(t *testing.T) {
	ws := slacksim.New(slacksim.Options{Manifest: slacksimtest.Manifest(t)})
	ws.SeedDemo() // #approvals G0APPROV1, #tasks C0TASKS01, @approvers S0APPROV1
	ws.AddUsergroup(slacksim.Usergroup{ID: "S0SRE0001", Handle: "sre", Name: "SRE on call"})
	ws.AddUsergroup(slacksim.Usergroup{ID: demo.LeadsGroup, Handle: "leads", Name: "Support leads"})
	ws.AddChannel(slacksim.Channel{ID: "C0OPS0001", Name: "ops", Members: []string{slacksim.BotUserID}})
	if _, err := ws.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ws.Close)
	team := writeFile(t, "policy.yaml", strings.Replace(checkBase, "slack: {approvals_channel: C0APPROVALS}",
		"slack: {approvals_channel: G0APPROV1, task_channels: [\"#ops\"]}\ndefaults:\n  approvers: {usergroups: [\"@sre\"]}", 1))
	demoPolicy := writeFile(t, "demo.yaml", string(demo.Policy))
	tests := []struct {
		name     string
		token    string
		args     []string
		wantCode int
		wantOut  []string
	}{
		{"names get their ids", "xoxb-sim", []string{"--slack", team}, 1, []string{
			"policy.yaml: invalid",
			`slack.approvals_channel: G0APPROV1 is #approvals: ok`,
			`slack.task_channels[0]: "#ops" is C0OPS0001 (#ops): write C0OPS0001`,
			`defaults.approvers.usergroups[0]: "@sre" is S0SRE0001 (@sre (SRE on call)): write S0SRE0001`,
		}},
		{"the flag after the file", "xoxb-sim", []string{team, "--slack"}, 1, []string{"write S0SRE0001"}},
		{"the demo's ids all exist", "xoxb-sim", []string{"--slack", demoPolicy}, 0, []string{"demo.yaml: ok", "slack.task_channels[0]: C0TASKS01 is #tasks: ok", "defaults.approvers.usergroups[0]: S0APPROV1 is @approvers (Approvers): ok"}},
		{"no token", "", []string{"--slack", team}, 2, []string{"SLACK_BOT_TOKEN is not set"}},
		{"a token Slack refuses", "xoxb-wrong", []string{"--slack", team}, 2, []string{"invalid_auth"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SLACK_BOT_TOKEN", tt.token)
			t.Setenv("SLACK_API_URL", ws.APIURL())
			var out, errOut bytes.Buffer
			code := main.Run(t.Context(), append([]string{"check"}, tt.args...), main.Stdio{Stdout: &out, Stderr: &errOut})
			all := out.String() + errOut.String()
			if code != tt.wantCode {
				t.Fatalf("check %v exit = %d, want %d; output:\n%s", tt.args, code, tt.wantCode, all)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(all, w) {
					t.Errorf("check %v output does not contain %q:\n%s", tt.args, w, all)
				}
			}
		})
	}
}
