package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestAuditCLIPrintsNames: with a bot token, `audit tail`, `show` and
// `stats` print people by the names Slack gives them (as the audit view
// does); `--ids` prints the ids as recorded; without a token the ids are
// printed, as is an id Slack does not know.
func TestAuditCLIPrintsNames(t *testing.T) {
	ws := slacksim.New(slacksim.Options{})
	ws.SeedDemo() // Alice Archer U0ALICE01, Bob Baker U0BOB0001
	if _, err := ws.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ws.Close)
	env := mustAuditEnv(t)
	now := time.Now().UTC().Truncate(time.Second)
	env.append(t, now.Add(-3*time.Minute), approval.Record{Event: approval.EventRequested, RequestID: "req_n", RunID: "run_n", Actor: "U0ALICE01", Tool: "issue_refund",
		Data: approval.RequestedEvent{CallID: "c1", Quorum: 1}})
	env.append(t, now.Add(-2*time.Minute), approval.Record{Event: approval.EventDecided, RequestID: "req_n", RunID: "run_n", Actor: "U0BOB0001", Tool: "issue_refund",
		Data: approval.DecidedEvent{Verdict: approval.VerdictApprove, Status: approval.StatusApproved, Created: now.Add(-3 * time.Minute), DecisionMS: 60000}})
	env.append(t, now.Add(-time.Minute), approval.Record{Event: approval.EventDecisionRefuse, RequestID: "req_n", Actor: "U0NOBODY1", Tool: "issue_refund"})

	ctx := context.Background()
	run := func(t *testing.T, token string, args ...string) string {
		t.Helper()
		t.Setenv("SLACK_BOT_TOKEN", token)
		t.Setenv("SLACK_API_URL", ws.APIURL())
		code, out, errOut := runCLI(ctx, append([]string{"audit"}, args...)...)
		if code != 0 {
			t.Fatalf("audit %v = exit %d, stderr %s", args, code, errOut)
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		token       string
		args        []string
		want, never []string
	}{
		{"tail", "xoxb-sim", []string{"tail"}, []string{"Alice Archer", "Bob Baker", "U0NOBODY1"}, []string{"U0ALICE01", "U0BOB0001"}},
		{"show", "xoxb-sim", []string{"show", "req_n"}, []string{"Bob Baker"}, []string{"U0BOB0001"}},
		{"stats", "xoxb-sim", []string{"stats"}, []string{"Bob Baker"}, []string{"U0BOB0001"}},
		{"tail --ids", "xoxb-sim", []string{"tail", "--ids"}, []string{"U0ALICE01", "U0BOB0001"}, []string{"Alice Archer", "Bob Baker"}},
		{"show --ids", "xoxb-sim", []string{"show", "--ids", "req_n"}, []string{"U0BOB0001"}, []string{"Bob Baker"}},
		{"stats --ids", "xoxb-sim", []string{"stats", "--ids"}, []string{"U0BOB0001"}, []string{"Bob Baker"}},
		{"no token", "", []string{"tail"}, []string{"U0ALICE01", "U0BOB0001"}, []string{"Alice Archer", "Bob Baker"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := run(t, tc.token, tc.args...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("audit %v lacks %q:\n%s", tc.args, w, out)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(out, n) {
					t.Errorf("audit %v shows %q:\n%s", tc.args, n, out)
				}
			}
		})
	}
}

// TestDemoAuditCommandPrintsNames: the audit command countersign demo
// prints (the first one a new team runs) names people and channels as the
// audit view does: it carries the local workspace's bot token and API URL.
func TestDemoAuditCommandPrintsNames(t *testing.T) {
	d := startDemoForCLI(t, clocktest.New(clocktest.Opts{Start: time.Now().UTC()}))
	ws, cast := d.Workspace, d.Cast
	if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 1234 arrived damaged — look it up, email an apology, refund the shipping", ""); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d, "", approval.EventCardPosted)
	t.Setenv("SLACK_BOT_TOKEN", "")
	t.Setenv("SLACK_API_URL", "https://slack.com/api/")
	cmd := d.AuditCommand()
	for _, f := range strings.Fields(cmd) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "SLACK_") {
			t.Setenv(k, v)
		}
	}
	code, out, errOut := runCLI(t.Context(), "audit", "tail", "-n", "100")
	if code != 0 {
		t.Fatalf("audit tail = exit %d, stderr %s", code, errOut)
	}
	for _, w := range []string{cast.Requester.RealName, "channel=#approvals"} {
		if !strings.Contains(out, w) {
			t.Errorf("%s: audit tail lacks %q:\n%s", cmd, w, out)
		}
	}
	for _, n := range []string{cast.Requester.ID, cast.Approvals.ID} {
		if strings.Contains(out, n) {
			t.Errorf("%s: audit tail shows the id %q:\n%s", cmd, n, out)
		}
	}
}
