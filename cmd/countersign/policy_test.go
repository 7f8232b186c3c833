package main_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval/replay"
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
	if code, _, errOut := runCLI(t.Context(), "policy", "suggest", "--current", current, "--min", "1"); code != 2 || !strings.Contains(errOut, "--min") {
		t.Errorf("policy suggest --min 1 = %d, %q; want 2", code, errOut)
	}
}
