package main_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// historyPolicy is a policy file for the tools of recordHistory; refund's
// when rule is refundWhen.
func historyPolicy(refundWhen string) string {
	return `version: 1
slack:
  approvals_channel: C0APPROVALS
tools:
  - name: refund
    review: {mode: auto, when: "` + refundWhen + `"}
    decisions: [approve, edit, reject]
  - name: send_email
    review: always
    decisions: [approve, edit, reject]
  - name: deploy
    review: always
    decisions: [approve, edit, reject]
`
}

// TestPolicyReplayExit: a candidate that lets a call a person edited run
// unattended exits 1 and names it; one that keeps every such call asked
// exits 0; the numbers come out as JSON for CI.
func TestPolicyReplayExit(t *testing.T) {
	env := mustAuditEnv(t)
	recordHistory(t, env)
	current := writeFile(t, "current.yaml", historyPolicy("args.amount > 10"))
	tests := []struct {
		name      string
		candidate string
		code      int
		regressed []string
	}{
		// Only reqEdit (bob edited it) of the refunds it lets through was
		// not let through as proposed; the approved ones are no regression.
		{"looser: refunds up to 100 run unattended", historyPolicy("args.amount > 100"), 1, []string{reqEdit}},
		{"the same policy", historyPolicy("args.amount > 10"), 0, nil},
		{"stricter: every refund asks", historyPolicy("true"), 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cand := writeFile(t, "candidate.yaml", tc.candidate)
			code, out, errOut := runCLI(t.Context(), "policy", "replay", "--current", current, "--since", "30d", "--json", cand)
			if code != tc.code {
				t.Fatalf("policy replay = %d, want %d\nstdout %s\nstderr %s", code, tc.code, out, errOut)
			}
			var rep replay.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("policy replay --json: %v\n%s", err, out)
			}
			var got []string
			for _, g := range rep.Regressions {
				got = append(got, g.RequestID)
			}
			if !slices.Equal(got, tc.regressed) {
				t.Errorf("regressions = %v, want %v", got, tc.regressed)
			}
			code, text, _ := runCLI(t.Context(), "policy", "replay", "--current", current, cand)
			t.Logf("policy replay:\n%s", text)
			if code != tc.code || !strings.Contains(text, "TOOL") || (tc.code == 1) != strings.Contains(text, reqEdit) {
				t.Errorf("policy replay (text) = %d\n%s\nwant exit %d, a table, the regression named when there is one", code, text, tc.code)
			}
		})
	}
}

// TestPolicyReplayBadInput: each of these is a clear message and exit 2.
func TestPolicyReplayBadInput(t *testing.T) {
	good := historyPolicy("args.amount > 10")
	tests := []struct {
		name      string
		candidate string
		record    bool
		trim      bool
		want      string
	}{
		{name: "candidate is not YAML", candidate: "tools: [", record: true, want: "the candidate"},
		{name: "candidate rule does not compile", candidate: historyPolicy("args.amount >"), record: true, want: "the candidate"},
		{name: "empty audit", candidate: good, want: "is empty or missing"},
		{name: "trimmed stream", candidate: good, record: true, trim: true, want: "trimmed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := mustAuditEnv(t)
			if tc.record {
				recordHistory(t, env)
			}
			if tc.trim {
				if err := env.rdb.XTrimMaxLen(t.Context(), env.stream, 5).Err(); err != nil {
					t.Fatal(err)
				}
			}
			current := writeFile(t, "current.yaml", good)
			cand := writeFile(t, "candidate.yaml", tc.candidate)
			code, out, errOut := runCLI(t.Context(), "policy", "replay", "--current", current, "--since", "30d", cand)
			if code != 2 || !strings.Contains(errOut, tc.want) || out != "" {
				t.Errorf("policy replay = %d, stdout %q, stderr %q; want 2, nothing on stdout, a message with %q", code, out, errOut, tc.want)
			}
		})
	}
	t.Run("no candidate", func(t *testing.T) {
		mustAuditEnv(t)
		if code, _, errOut := runCLI(t.Context(), "policy", "replay"); code != 2 || !strings.Contains(errOut, "one candidate") {
			t.Errorf("policy replay = %d, %q; want 2 asking for one candidate", code, errOut)
		}
	})
}

// TestPolicySuggestCLI: suggest reads the same stream and prints a YAML
// patch (or says why there is none); it applies nothing and exits 0.
func TestPolicySuggestCLI(t *testing.T) {
	env := mustAuditEnv(t)
	recordHistory(t, env)
	current := writeFile(t, "current.yaml", historyPolicy("args.amount > 10"))
	before, err := os.ReadFile(current)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t.Context(), "policy", "suggest", "--current", current, "--min", "2")
	if code != 0 || !strings.HasPrefix(out, "#") {
		t.Fatalf("policy suggest = %d\nstdout %s\nstderr %s\nwant 0 and a commented patch", code, out, errOut)
	}
	t.Logf("policy suggest:\n%s", out)
	if after, _ := os.ReadFile(current); string(after) != string(before) {
		t.Errorf("policy suggest changed %s", current)
	}
	code, out, errOut = runCLI(t.Context(), "policy", "suggest", "--current", current, "--min", "2", "--json")
	var got replay.Suggestions
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
		t.Fatalf("policy suggest --json = %d, %v\n%s\n%s", code, err, out, errOut)
	}
	// refund's four approvals were all of one order and amount, but bob
	// edited a call with those very arguments: no rule may let it through.
	if len(got.Suggestions) != 0 || len(got.NotSuggested) != 1 || got.NotSuggested[0].Tool != "refund" || !strings.Contains(got.NotSuggested[0].Why, "declined") {
		t.Errorf("policy suggest --json = %+v, want refund not suggested (a declined call would pass)", got)
	}
	if code, _, errOut := runCLI(t.Context(), "policy", "suggest", "--current", current, "--min", "1"); code != 2 || !strings.Contains(errOut, "--min") {
		t.Errorf("policy suggest --min 1 = %d, %q; want 2", code, errOut)
	}
}

// TestPolicyReplayOnDemoHistory replays what the demo itself wrote during
// the seeds' scenario (the README's walk-through: two lookups run by
// themselves, an email is edited, a refund rejected, a delete approved, an
// email expires) against a looser and a stricter copy of the demo's policy.
func TestPolicyReplayOnDemoHistory(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: time.Now().UTC()})
	d := startDemoForCLI(t, clock)
	h := runDemoHistory(t, d, clock)
	current := writeFile(t, "current.yaml", string(demo.Policy))
	edit := func(old, new string) string {
		t.Helper()
		if strings.Count(string(demo.Policy), old) != 1 {
			t.Fatalf("the demo's policy has %q %d times, want once", old, strings.Count(string(demo.Policy), old))
		}
		return writeFile(t, "candidate.yaml", strings.Replace(string(demo.Policy), old, new, 1))
	}
	tests := []struct {
		name      string
		candidate string
		code      int
		regressed []string
		tool      string
		now, cand replay.Counts
	}{
		{"looser: refunds up to $5,000 run unattended", edit("double(args.amount) > 50.0", "double(args.amount) > 5000.0"), 1,
			[]string{h.refund}, "issue_refund", replay.Counts{Asked: 1, Approvals: 1}, replay.Counts{Auto: 1}},
		{"stricter: order lookups are reviewed", edit("review: never", "review: always"), 0,
			nil, "lookup_order", replay.Counts{Auto: 2}, replay.Counts{Asked: 2, Approvals: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t.Context(), "policy", "replay", "--current", current, "--since", "7d", "--json", tc.candidate)
			if code != tc.code {
				t.Fatalf("policy replay = %d, want %d\nstdout %s\nstderr %s", code, tc.code, out, errOut)
			}
			var rep replay.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("policy replay --json: %v\n%s", err, out)
			}
			var got []string
			for _, g := range rep.Regressions {
				got = append(got, g.RequestID)
			}
			if !slices.Equal(got, tc.regressed) {
				t.Errorf("regressions = %v, want %v", got, tc.regressed)
			}
			i := slices.IndexFunc(rep.Tools, func(r replay.ToolRow) bool { return r.Tool == tc.tool })
			if i < 0 || rep.Tools[i].Now != tc.now || rep.Tools[i].Candidate != tc.cand {
				t.Errorf("tools = %+v\nwant %s now %+v, candidate %+v", rep.Tools, tc.tool, tc.now, tc.cand)
			}
			if r := rep.Tools[i]; tc.cand.Asked > tc.now.Asked && r.MinutesAdded <= 0 {
				t.Errorf("%s: %d approvals more and no people-minutes added: %+v", tc.tool, tc.cand.Approvals-tc.now.Approvals, r)
			}
			if len(rep.Unreplayable) != 0 {
				t.Errorf("unreplayable = %+v, want none: the demo's calls are whole in its audit", rep.Unreplayable)
			}
			_, text, _ := runCLI(t.Context(), "policy", "replay", "--current", current, "--since", "7d", tc.candidate)
			t.Logf("policy replay on the demo's audit:\n%s", text)
		})
	}
}
