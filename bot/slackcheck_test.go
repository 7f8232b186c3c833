package bot_test

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// slackCheckPolicy gives, where the policy file needs Slack ids, the ids
// and names a new team writes, right and wrong.
const slackCheckPolicy = `version: 1
slack:
  approvals_channel: G0APPROV1
  task_channels: ["#tasks", C0TASKS01, "#random", G0HIDDEN1, "#nope", C0NOPE001]
  allowed_teams: [T0ACME001]
defaults:
  approvers:
    usergroups: ["@approvers", S0APPROV1, "@sre", S0NONE001, "Support leads"]
    users: [alice, "Bob Baker", U0BOB0001, U0NOBODY1, sam, U0BOT0001, "@nobody", U0EVE0001]
tools:
  - name: deploy
`

// TestCheckSlack looks a policy file's Slack ids and names up in the local
// workspace through the real slack-go client, as countersign check --slack
// does: a name gets its id, an id Slack knows is ok, and what cannot work
// says why.
func TestCheckSlack(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{}) // the app's scopes from manifest.yml
	ws.SeedDemo()
	ws.AddChannel(slacksim.Channel{ID: "C0RANDOM1", Name: "random", Members: []string{"U0ALICE01"}})
	ws.AddChannel(slacksim.Channel{ID: "G0HIDDEN1", Name: "hidden", IsPrivate: true, Members: []string{"U0ALICE01"}})
	ws.AddUsergroup(slacksim.Usergroup{ID: "S0LEADS01", Handle: "leads", Name: "Support leads"})
	ws.AddUser(slacksim.User{ID: "U0SAM0001", Name: "sam", RealName: "Sam Stone"})
	ws.AddUser(slacksim.User{ID: "U0SAM0002", Name: "samuel", RealName: "Sam"})
	ws.AddUser(slacksim.User{ID: "U0BOT0001", Name: "deploybot", RealName: "Deploy Bot", IsBot: true})
	// A name anyone may set, with a terminal escape in it.
	ws.AddUser(slacksim.User{ID: "U0EVE0001", Name: "eve", RealName: "Eve\x1b[2J\x1b]0;pwned\x07"})
	refs, err := policyfile.SlackRefs([]byte(slackCheckPolicy))
	if err != nil {
		t.Fatal(err)
	}
	got, err := bot.CheckSlack(t.Context(), slacksimtest.Client(ws, "", ""), refs)
	if err != nil {
		t.Fatalf("CheckSlack: %v", err)
	}
	want := map[string]struct {
		id, problem string // problem "" is ok
	}{
		"slack.approvals_channel":          {"G0APPROV1", ""},
		"slack.task_channels[0]":           {"C0TASKS01", "write C0TASKS01"},
		"slack.task_channels[1]":           {"C0TASKS01", ""},
		"slack.task_channels[2]":           {"C0RANDOM1", "write C0RANDOM1; the bot is not in it"},
		"slack.task_channels[3]":           {"", "Slack shows the bot no such channel"},
		"slack.task_channels[4]":           {"", "no channel of this name that the bot can see"},
		"slack.task_channels[5]":           {"", "Slack shows the bot no such channel"},
		"slack.allowed_teams[0]":           {"T0ACME001", ""},
		"defaults.approvers.usergroups[0]": {"S0APPROV1", "write S0APPROV1"},
		"defaults.approvers.usergroups[1]": {"S0APPROV1", ""},
		"defaults.approvers.usergroups[2]": {"", "no user group has this handle or name"},
		"defaults.approvers.usergroups[3]": {"", "Slack knows no such user group"},
		"defaults.approvers.usergroups[4]": {"S0LEADS01", "write S0LEADS01"},
		"defaults.approvers.users[0]":      {"U0ALICE01", "write U0ALICE01"},
		"defaults.approvers.users[1]":      {"U0BOB0001", "write U0BOB0001"},
		"defaults.approvers.users[2]":      {"U0BOB0001", ""},
		"defaults.approvers.users[3]":      {"", "Slack knows no such user"},
		"defaults.approvers.users[4]":      {"", "2 people have this name: U0SAM0001 (Sam Stone), U0SAM0002 (Sam)"},
		"defaults.approvers.users[5]":      {"U0BOT0001", "a bot, not a person"},
		"defaults.approvers.users[6]":      {"", "no member of the workspace has this name"},
		"defaults.approvers.users[7]":      {"U0EVE0001", ""},
	}
	if len(got) != len(want) {
		t.Errorf("CheckSlack gave %d findings, want %d: %v", len(got), len(want), got)
	}
	for _, f := range got {
		w, ok := want[f.Ref.Path]
		switch {
		case !ok:
			t.Errorf("finding for %s, which the file does not give: %v", f.Ref.Path, f)
		case f.ID != w.id || (w.problem == "") != f.OK() || !strings.HasPrefix(f.Problem, w.problem):
			t.Errorf("%s = id %q, problem %q; want id %q, problem starting %q", f.Ref.Path, f.ID, f.Problem, w.id, w.problem)
		}
	}
	var out bytes.Buffer
	ok, err := bot.WriteSlackFindings(&out, got)
	if err != nil || ok {
		t.Errorf("WriteSlackFindings = %v, %v; want not ok", ok, err)
	}
	if strings.ContainsAny(out.String(), "\x1b\x07") {
		t.Errorf("WriteSlackFindings sent a control character to the terminal:\n%q", out.String())
	}
	for _, line := range []string{
		`slack.approvals_channel: G0APPROV1 is #approvals: ok`,
		`defaults.approvers.usergroups[0]: "@approvers" is S0APPROV1 (@approvers (Approvers)): write S0APPROV1`,
		`slack.task_channels[0]: "#tasks" is C0TASKS01 (#tasks): write C0TASKS01`,
		`defaults.approvers.users[0]: "alice" is U0ALICE01 (Alice Archer): write U0ALICE01`,
		`defaults.approvers.users[3]: "U0NOBODY1": Slack knows no such user in this workspace`,
		`defaults.approvers.users[7]: U0EVE0001 is Eve\u001b[2J\u001b]0;pwned\u0007: ok`,
	} {
		if !slices.Contains(strings.Split(out.String(), "\n"), line) {
			t.Errorf("WriteSlackFindings lacks the line %q:\n%s", line, out.String())
		}
	}
}

// TestCheckSlackRefused: when Slack refuses a lookup (the app lacks a
// scope, the token is wrong) CheckSlack fails, saying which scope or why,
// rather than calling every id unknown.
func TestCheckSlackRefused(t *testing.T) {
	refs, err := policyfile.SlackRefs([]byte(slackCheckPolicy))
	if err != nil {
		t.Fatal(err)
	}
	m := slacksimtest.Manifest(t)
	m.Scopes = slices.DeleteFunc(slices.Clone(m.Scopes), func(s string) bool { return s == "usergroups:read" })
	ws := slacksimtest.New(t, slacksim.Options{Manifest: m})
	ws.SeedDemo()
	tests := []struct {
		name, token, want string
	}{
		{"missing scope", "", "usergroups.list: Slack answered missing_scope: the app lacks the usergroups:read scope"},
		{"wrong token", "xoxb-wrong", "invalid_auth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bot.CheckSlack(t.Context(), slacksimtest.Client(ws, tt.token, ""), refs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckSlack = %v, %v; want an error containing %q", got, err, tt.want)
			}
		})
	}
}
