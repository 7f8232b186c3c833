package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	main "github.com/countersign/countersign/cmd/countersign"
)

func TestAuditTail(t *testing.T) {
	env := mustAuditEnv(t)
	h := recordHistory(t, env)

	code, out, errOut := runCLI(t.Context(), "audit", "tail", "-n", "3")
	if code != 0 {
		t.Fatalf("audit tail -n 3 = %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("audit tail -n 3 printed %d lines, want 3:\n%s", len(lines), out)
	}
	last3 := h.entries[h.n-3:]
	for i, e := range last3 {
		want := fmt.Sprintf("%s %6d  %s", auditreport.FormatTime(e.Time), e.Seq, e.Event)
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[1], reqExpire) || !strings.Contains(lines[1], toolEmail) {
		t.Errorf("expired line %q lacks request and tool", lines[1])
	}

	// Default -n 20, and the data column of a decision.
	code, out, _ = runCLI(t.Context(), "audit", "tail")
	if code != 0 || strings.Count(out, "\n") != 20 {
		t.Fatalf("audit tail = %d with %d lines, want 0 and 20", code, strings.Count(out, "\n"))
	}
	code, out, _ = runCLI(t.Context(), "audit", "tail", "-n", "100")
	decided := h.entryOf(t, reqEdit, approval.EventDecided)
	wantLine := auditreport.TailLine(decided)
	if !strings.Contains(out, wantLine) {
		t.Errorf("audit tail lacks %q", wantLine)
	}
	for _, want := range []string{"verdict=edit", `reason="partial refund only"`, "edited=true", "after=1m", bob} {
		if !strings.Contains(wantLine, want) {
			t.Errorf("decided line %q lacks %q", wantLine, want)
		}
	}

	// --json: one entry per line, as stored.
	code, out, _ = runCLI(t.Context(), "audit", "tail", "-n", "2", "--json")
	if code != 0 {
		t.Fatalf("audit tail --json = %d", code)
	}
	got := decodeJSONLines(t, out)
	if len(got) != 2 || got[1]["hash"] != h.entries[h.n-1].Hash || got[0]["event"] != string(approval.EventExpired) {
		t.Errorf("audit tail -n 2 --json = %v, want the last two entries", got)
	}

	// More than the stream holds.
	code, out, _ = runCLI(t.Context(), "audit", "tail", "-n", "5000")
	if code != 0 || strings.Count(out, "\n") != h.n {
		t.Errorf("audit tail -n 5000 = %d with %d lines, want 0 and %d", code, strings.Count(out, "\n"), h.n)
	}
}

// lineWriter collects output and signals each write.
type lineWriter struct {
	mu    sync.Mutex // guards b
	b     strings.Builder
	wrote chan struct{}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(p)
	w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// waitFor waits until w's output contains s.
func (w *lineWriter) waitFor(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !strings.Contains(w.String(), s) {
		select {
		case <-w.wrote:
		case <-timeout:
			t.Fatalf("output never contained %q; got:\n%s", s, w.String())
		}
	}
}

func TestAuditTailFollow(t *testing.T) {
	env := mustAuditEnv(t)
	h := recordHistory(t, env)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &lineWriter{wrote: make(chan struct{}, 1)}
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- main.Run(ctx, []string{"audit", "tail", "-n", "1", "-f"}, main.Stdio{Stdout: out, Stderr: &errOut})
	}()

	out.waitFor(t, string(approval.EventRunFinished))
	e := env.append(t, h.base.Add(2*time.Hour), approval.Record{Event: approval.EventRunStarted, RunID: "run_followed", Actor: alice})
	out.waitFor(t, "run_followed")
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("audit tail -f ended with %d after cancel, want 0; stderr %q", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("audit tail -f did not end after cancel")
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], fmt.Sprintf("%s %6d  run_started", auditreport.FormatTime(e.Time), e.Seq)) {
		t.Errorf("audit tail -n 1 -f printed:\n%s\nwant the last entry, then the new one", out.String())
	}
}

func TestAuditShow(t *testing.T) {
	env := mustAuditEnv(t)
	h := recordHistory(t, env)

	tests := []struct {
		name string
		id   string
		want []string
	}{
		{"approve after a refused self-approval", reqApprove, []string{
			kv("request", reqApprove),
			kv("outcome", "approved"),
			kv("requested", auditreport.FormatTime(h.base)+" by "+requester),
			kv("arguments", `{"amount":64,"order":"1234"}`),
			kv("digest", digestOf64),
			kv("preview", "Refund order 1234"),
			kv("  fact", "Order total: $64.00"),
			kv("signal", "sensitive_capability — capability spend_money is sensitive"),
			kv("quorum", "1"),
			kv("model's reason", `"customer asked for it" (unverified, written by the model)`),
			kv("card", "posted "+auditreport.FormatTime(h.base.Add(time.Second))+" to C0APPROVALS (ts 1700000000.000100)"),
			kv("click", auditreport.FormatTime(h.base.Add(2*time.Second))+" "+requester+" approve — refused: self_approval"),
			kv("click", auditreport.FormatTime(h.base.Add(4*time.Second))+" "+alice+" approve — decided"),
			kv("decision", "approve by "+alice+" at "+auditreport.FormatTime(h.base.Add(4*time.Second))),
			kv("execution", "executed at "+auditreport.FormatTime(h.base.Add(5200*time.Millisecond))+" in 200ms"),
			kv("  result", "refunded $64.00"),
			kv("timings", "to decision 4s; to execute 200ms; request to result 5.2s"),
			"entries (6):",
		}},
		{"edit with a diff", reqEdit, []string{
			kv("outcome", "edited"),
			kv("decision", "edit by "+bob),
			kv("  reason", `"partial refund only"`),
			kv("  edit", "amount: 64 → 50"),
			kv("  edited args", `{"amount":50,"order":"1234"}`),
			kv("timings", "to decision 1m; to execute 150ms"),
		}},
		{"quorum: a vote, a refused second click, the decision", reqQuorum, []string{
			kv("quorum", "2"),
			bob + " approve — counted",
			bob + " approve — refused: already_voted",
			alice + " approve — decided",
			"to decision 30s",
		}},
		{"failed execution", reqFailed, []string{
			kv("execution", "failed at"),
			"in 80ms",
			kv("  error", "upstream returned 500"),
		}},
		{"expired", reqExpire, []string{
			kv("outcome", "expired"),
			kv("decision", "expired at "+auditreport.FormatTime(h.base.Add(200*time.Second+time.Hour))),
			"to expiry 1h",
		}},
		{"secret redacted", reqReject, []string{
			kv("outcome", "rejected"),
			kv("  reason", `"wrong customer"`),
		}},
		{"pending", reqPending, []string{kv("outcome", "pending")}},
		{"as the agent and bot record it", reqBotShape, []string{
			auditreport.FormatTime(h.base.Add(600*time.Second)) + " by " + requester,
			"preview unavailable: status 503",
			"risk_high — tool deploy is high risk",
			`"release is green" (unverified, written by the model)`,
			"0.90 (self-reported)",
			"posted " + auditreport.FormatTime(h.base.Add(601*time.Second)) + " to C0APPROVALS",
			"decision", "edit by " + bob,
			`"pin to v1.2.4"`,
			`version: "1.2.3" → "1.2.4"`,
			"to decision 8s; to execute 300ms",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t.Context(), "audit", "show", tt.id)
			if code != 0 {
				t.Fatalf("audit show %s = %d, stderr %q", tt.id, code, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("audit show %s lacks %q; got:\n%s", tt.id, w, out)
				}
			}
			if strings.Contains(out, "hunter2") {
				t.Errorf("audit show %s prints a secret:\n%s", tt.id, out)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		code, out, _ := runCLI(t.Context(), "audit", "show", "--json", reqEdit)
		if code != 0 {
			t.Fatalf("audit show --json = %d", code)
		}
		var got struct {
			auditreport.ExportRecord
			Entries []approval.Entry `json:"entries"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("audit show --json: %v\n%s", err, out)
		}
		if got.Outcome != "edited" || len(got.Entries) != 4 || got.Decision == nil || len(got.Decision.Changes) != 1 ||
			got.Decision.Changes[0].Path != "amount" || string(got.Decision.Changes[0].Before) != "64" || string(got.Decision.Changes[0].After) != "50" {
			t.Errorf("audit show --json = %+v", got)
		}
	})

	t.Run("unknown request", func(t *testing.T) {
		code, _, errOut := runCLI(t.Context(), "audit", "show", "req_nosuch")
		if code != 1 || !strings.Contains(errOut, "no entries") {
			t.Errorf("audit show req_nosuch = %d, %q; want 1 and no entries", code, errOut)
		}
	})
}

// TestAuditShowPages checks that show reads past the first XRANGE page.
func TestAuditShowPages(t *testing.T) {
	if testing.Short() {
		t.Skip("appends 2500 entries")
	}
	env := mustAuditEnv(t)
	at := time.Now().Add(-time.Hour)
	for i := range 2 * auditreport.Page {
		env.append(t, at, approval.Record{Event: approval.EventProposed, RunID: fmt.Sprintf("run_%d", i)})
	}
	env.append(t, at, approval.Record{Event: approval.EventRequested, RequestID: "req_late", Tool: "refund", Data: map[string]any{"digest": "abc"}})
	code, out, errOut := runCLI(t.Context(), "audit", "show", "req_late")
	if code != 0 || !regexp.MustCompile(`(?m)^digest\s+abc$`).MatchString(out) {
		t.Errorf("audit show req_late = %d, stdout:\n%s\nstderr %q", code, out, errOut)
	}
	code, out, _ = runCLI(t.Context(), "audit", "verify")
	if code != 0 || out != fmt.Sprintf("audit chain intact: %d entries\n", 2*auditreport.Page+1) {
		t.Errorf("audit verify = %d, %q", code, out)
	}
}

func TestAuditVerify(t *testing.T) {
	env := mustAuditEnv(t)
	h := recordHistory(t, env)
	ctx := t.Context()

	code, out, errOut := runCLI(ctx, "audit", "verify")
	if want := fmt.Sprintf("audit chain intact: %d entries\n", h.n); code != 0 || out != want {
		t.Fatalf("audit verify = %d, %q (stderr %q), want 0, %q", code, out, errOut, want)
	}

	t.Run("edited field in a copy", func(t *testing.T) {
		copyKey := env.stream + ":copy{x}"
		msgs, err := env.rdb.XRange(ctx, env.stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		edited := h.entryOf(t, reqReject, approval.EventDecided)
		for _, m := range msgs {
			if m.ID == edited.ID {
				m.Values["actor"] = carol // someone else takes the blame
			}
			if err := env.rdb.XAdd(ctx, &redis.XAddArgs{Stream: copyKey, ID: m.ID, Values: m.Values}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { env.rdb.Del(context.Background(), copyKey) })
		t.Setenv("COUNTERSIGN_AUDIT_STREAM", copyKey)

		code, out, _ := runCLI(ctx, "audit", "verify")
		if code != 1 {
			t.Fatalf("audit verify on an edited copy = %d, want 1; stdout:\n%s", code, out)
		}
		for _, want := range []string{
			fmt.Sprintf("id %s, seq %d", edited.ID, edited.Seq),
			"hash does not match",
			"first bad entry: " + auditreport.FormatTime(edited.Time),
			carol,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("audit verify output lacks %q:\n%s", want, out)
			}
		}

		code, out, _ = runCLI(ctx, "audit", "verify", "--json")
		var got auditreport.VerifyResult
		if err := json.Unmarshal([]byte(out), &got); err != nil || code != 1 || got.Intact || got.Break == nil ||
			got.Break.ID != edited.ID || got.Entry == nil || got.Entry.Actor != carol || got.Entries != int(edited.Seq-1) {
			t.Errorf("audit verify --json = %d, %s (%v)", code, out, err)
		}
	})

	t.Run("deleted entry", func(t *testing.T) {
		t.Setenv("COUNTERSIGN_AUDIT_STREAM", env.stream)
		gone := h.entryOf(t, reqEdit, approval.EventDecided)
		if err := env.rdb.XDel(ctx, env.stream, gone.ID).Err(); err != nil {
			t.Fatal(err)
		}
		next := h.entries[gone.Seq] // seq is 1-based: entries[seq] is the one after
		code, out, _ := runCLI(ctx, "audit", "verify")
		if code != 1 {
			t.Fatalf("audit verify after XDEL = %d, want 1; stdout:\n%s", code, out)
		}
		for _, want := range []string{
			fmt.Sprintf("audit chain BROKEN after %d intact entries", gone.Seq-1),
			fmt.Sprintf("id %s, seq %d", next.ID, next.Seq),
			fmt.Sprintf("sequence %d follows %d", next.Seq, gone.Seq-1),
			"first bad entry: " + auditreport.TailLine(next),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("audit verify output lacks %q:\n%s", want, out)
			}
		}
	})
}

func TestAuditExport(t *testing.T) {
	env := mustAuditEnv(t)
	h := recordHistory(t, env)

	code, out, errOut := runCLI(t.Context(), "audit", "export", "--since", "24h", "--only", "rejected,edited")
	if code != 0 {
		t.Fatalf("audit export = %d, stderr %q", code, errOut)
	}
	got := decodeJSONLines(t, out)
	if len(got) != 3 || got[0]["request_id"] != reqEdit || got[1]["request_id"] != reqReject || got[2]["request_id"] != reqBotShape {
		t.Fatalf("audit export --only rejected,edited = %s, want %s, %s, %s", out, reqEdit, reqReject, reqBotShape)
	}
	var edit, reject, botShape auditreport.ExportRecord
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[2]), &botShape); err != nil {
		t.Fatal(err)
	}
	// What the agent and bot record today is enough for an eval case.
	if botShape.Requester != requester || botShape.Proposed.ModelReason != "release is green" || botShape.Proposed.Confidence == nil ||
		botShape.Shown == nil || botShape.Shown.PreviewError == "" || botShape.Decision == nil ||
		string(botShape.Decision.OriginalArgs) != `{"service":"api","version":"1.2.3"}` || len(botShape.Decision.Changes) != 1 ||
		botShape.Decision.Reason != "pin to v1.2.4" || *botShape.Decision.TimeToDecideMS != 8000 ||
		botShape.Execution == nil || *botShape.Execution.DurationMS != 300 {
		t.Errorf("export of an agent/bot-shaped request = %s", lines[2])
	}
	if err := json.Unmarshal([]byte(lines[0]), &edit); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &reject); err != nil {
		t.Fatal(err)
	}

	if edit.Outcome != "edited" || edit.Tool != toolRefund || edit.Requester != requester ||
		string(edit.Proposed.Args) != `{"amount":64,"order":"1234"}` || edit.Proposed.Digest != digestOf64 ||
		edit.Proposed.ModelReason != "customer asked for it" {
		t.Errorf("edit export proposed = %+v", edit)
	}
	if s := edit.Shown; s == nil || s.Digest != digestOf64 || s.Preview == nil || s.Preview.Facts[0].Value != "$64.00" ||
		len(s.Signals) != 1 || s.Signals[0].Code != "sensitive_capability" || s.Quorum != 1 {
		t.Errorf("edit export shown = %+v", edit.Shown)
	}
	if d := edit.Decision; d == nil || d.Verdict != approval.VerdictEdit || d.Approver != bob || d.Reason != "partial refund only" ||
		string(d.Args) != `{"amount":50,"order":"1234"}` || string(d.OriginalArgs) != `{"amount":64,"order":"1234"}` ||
		len(d.Changes) != 1 || d.Changes[0].Path != "amount" || d.TimeToDecideMS == nil || *d.TimeToDecideMS != 60000 {
		t.Errorf("edit export decision = %+v", edit.Decision)
	}
	if x := edit.Execution; x == nil || x.Status != "executed" || x.Result != "refunded $50.00" || x.DurationMS == nil || *x.DurationMS != 150 {
		t.Errorf("edit export execution = %+v", edit.Execution)
	}
	if d := reject.Decision; d == nil || d.Verdict != approval.VerdictReject || d.Approver != alice || d.Reason != "wrong customer" ||
		*d.TimeToDecideMS != 3000 || reject.Execution != nil {
		t.Errorf("reject export = %+v", reject)
	}
	if strings.Contains(out, "hunter2") || !strings.Contains(string(reject.Proposed.Args), `"password":`) {
		t.Errorf("reject export args = %s, want the password present and redacted", reject.Proposed.Args)
	}

	// Every outcome, in request order; the request of ten days ago is out of the window.
	code, out, _ = runCLI(t.Context(), "audit", "export", "--since", "1d")
	var outcomes []string
	for _, m := range decodeJSONLines(t, out) {
		outcomes = append(outcomes, m["request_id"].(string)+"="+m["outcome"].(string))
	}
	want := []string{reqApprove + "=approved", reqEdit + "=edited", reqReject + "=rejected", reqExpire + "=expired",
		reqFailed + "=approved", reqQuorum + "=approved", reqPending + "=pending", reqBotShape + "=edited"}
	if code != 0 || strings.Join(outcomes, " ") != strings.Join(want, " ") {
		t.Errorf("audit export --since 1d = %d, %v, want %v", code, outcomes, want)
	}
	code, out, _ = runCLI(t.Context(), "audit", "export", "--since", "30d", "--only", "approve")
	if got := decodeJSONLines(t, out); code != 0 || len(got) != 4 || got[0]["request_id"] != reqOld {
		t.Errorf("audit export --since 30d --only approve = %d, %d lines, want 0 and 4 starting with %s", code, len(got), reqOld)
	}
	_ = h

	code, _, errOut = runCLI(t.Context(), "audit", "export", "--only", "maybe")
	if code != 2 || !strings.Contains(errOut, `unknown outcome "maybe"`) {
		t.Errorf("audit export --only maybe = %d, %q", code, errOut)
	}
}

func TestAuditStats(t *testing.T) {
	env := mustAuditEnv(t)
	recordHistory(t, env)

	code, out, errOut := runCLI(t.Context(), "audit", "stats", "--since", "7d", "--json")
	if code != 0 {
		t.Fatalf("audit stats --json = %d, stderr %q", code, errOut)
	}
	var rep auditreport.StatsReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit stats --json: %v\n%s", err, out)
	}
	type want struct {
		name        string
		total       int
		counts      map[approval.Verdict]int
		median, p90 float64
		timed       int
		rubber      bool
	}
	check := func(kind string, rows []auditreport.StatRow, wants []want) {
		t.Helper()
		if len(rows) != len(wants) {
			t.Fatalf("%s rows = %+v, want %d", kind, rows, len(wants))
		}
		for i, w := range wants {
			r := rows[i]
			if r.Name != w.name || r.Total != w.total || r.Timed != w.timed || r.RubberStamp != w.rubber {
				t.Errorf("%s[%d] = %s total %d timed %d rubber %v, want %s %d %d %v", kind, i, r.Name, r.Total, r.Timed, r.RubberStamp, w.name, w.total, w.timed, w.rubber)
			}
			for _, k := range auditreport.StatVerdicts {
				wantRate := float64(w.counts[k]) / float64(w.total)
				if r.Counts[k] != w.counts[k] || math.Abs(r.Rates[k]-wantRate) > 1e-9 {
					t.Errorf("%s %s %s = %d (rate %v), want %d (%v)", kind, w.name, k, r.Counts[k], r.Rates[k], w.counts[k], wantRate)
				}
			}
			if r.MedianSec == nil || math.Abs(*r.MedianSec-w.median) > 1e-9 || math.Abs(*r.P90Sec-w.p90) > 1e-9 {
				t.Errorf("%s %s median/p90 = %v/%v, want %v/%v", kind, w.name, deref(r.MedianSec), deref(r.P90Sec), w.median, w.p90)
			}
		}
	}
	// refund: approve 4 s, edit 60 s, approve 2 s, approve 30 s (quorum).
	// send_email: reject 3 s, expired (no decision time).
	check("tools", rep.Tools, []want{
		{toolRefund, 4, map[approval.Verdict]int{approval.VerdictApprove: 3, approval.VerdictEdit: 1}, 17, 51, 4, false},
		{toolEmail, 2, map[approval.Verdict]int{approval.VerdictReject: 1, approval.VerdictExpire: 1}, 3, 3, 1, false},
		{toolDeploy, 1, map[approval.Verdict]int{approval.VerdictEdit: 1}, 8, 8, 1, false},
	})
	// alice: 4, 3, 2, 30 s; bob: edit 60 s, a quorum vote at 20 s, and the
	// deploy edit at 8 s (timed from its requested entry).
	check("approvers", rep.Approvers, []want{
		{alice, 4, map[approval.Verdict]int{approval.VerdictApprove: 3, approval.VerdictReject: 1}, 3.5, 22.2, 4, true},
		{bob, 3, map[approval.Verdict]int{approval.VerdictApprove: 1, approval.VerdictEdit: 2}, 20, 52, 3, false},
	})
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], alice) {
		t.Errorf("warnings = %q, want one about %s", rep.Warnings, alice)
	}

	// The table for people.
	code, out, _ = runCLI(t.Context(), "audit", "stats")
	if code != 0 {
		t.Fatalf("audit stats = %d", code)
	}
	for _, re := range []string{
		`(?m)^TOOL\s+TOTAL\s+APPROVE\s+EDIT\s+REJECT\s+RESPOND\s+EXPIRE\s+MEDIAN\s+P90`,
		`(?m)^refund\s+4\s+3 \(75%\)\s+1 \(25%\)\s+0 \(0%\)\s+0 \(0%\)\s+0 \(0%\)\s+17s\s+51s\s+0\s+-\s*$`,
		`(?m)^send_email\s+2\s+0 \(0%\)\s+0 \(0%\)\s+1 \(50%\)\s+0 \(0%\)\s+1 \(50%\)\s+3s\s+3s\s+0\s+-\s*$`,
		`(?m)^U0ALICE\s+4\s+3 \(75%\)\s+0 \(0%\)\s+1 \(25%\)\s+0 \(0%\)\s+0 \(0%\)\s+3.5s\s+22.2s\s+0\s+!$`,
		`(?m)^U0BOB\s+3\s+1 \(33%\)\s+2 \(67%\)\s+0 \(0%\)\s+0 \(0%\)\s+0 \(0%\)\s+20s\s+52s\s+0\s*$`,
		`(?m)^deploy\s+1\s+0 \(0%\)\s+1 \(100%\)\s+0 \(0%\)\s+0 \(0%\)\s+0 \(0%\)\s+8s\s+8s\s+0\s+-\s*$`,
		`(?m)^warning: approver U0ALICE decides in a median of 3.5s over 4 decisions \(under 5s\): rubber-stamping\?$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("audit stats output does not match %s:\n%s", re, out)
		}
	}

	// A wider window brings in carol's decision of ten days ago.
	code, out, _ = runCLI(t.Context(), "audit", "stats", "--since", "30d", "--json")
	rep = auditreport.StatsReport{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("audit stats --since 30d = %d, %v", code, err)
	}
	if len(rep.Approvers) != 3 || rep.Approvers[2].Name != carol || rep.Tools[0].Total != 5 {
		t.Errorf("audit stats --since 30d approvers = %+v, tools = %+v", rep.Approvers, rep.Tools)
	}
}

// kv is one row of `audit show`: the key column is as wide as its longest
// key ("model's reason") plus two spaces.
func kv(k, v string) string { return fmt.Sprintf("%-16s%s", k, v) }

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestAuditUsage(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0") // never dialled
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no command", []string{"audit"}, 2, "usage: countersign audit"},
		{"unknown command", []string{"audit", "grep"}, 2, `unknown command "grep"`},
		{"show without id", []string{"audit", "show"}, 2, "usage: countersign audit show"},
		{"bad since", []string{"audit", "stats", "--since", "a week"}, 2, "--since"},
		{"extra argument", []string{"audit", "verify", "now"}, 2, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runCLI(t.Context(), tt.args...)
			if code != tt.code || !strings.Contains(errOut, tt.want) {
				t.Errorf("main.Run(%q) = %d, %q; want %d and %q", tt.args, code, errOut, tt.code, tt.want)
			}
		})
	}
}

// TestAuditEmptyStreamSaysSo: reading a stream that holds nothing says so
// on stderr, naming the stream, instead of printing nothing (tail) or
// "intact: 0 entries" alone (verify); the exit codes stay those of a read
// that worked.
func TestAuditEmptyStreamSaysSo(t *testing.T) {
	mustAuditEnv(t)
	for _, args := range [][]string{{"audit", "tail"}, {"audit", "verify"}, {"audit", "stats"}, {"audit", "export"}} {
		code, _, errOut := runCLI(t.Context(), args...)
		if code != 0 || !strings.Contains(errOut, "is empty or missing") || !strings.Contains(errOut, ":{audit}") {
			t.Errorf("main.Run(%q) = %d, stderr %q; want 0 and a line saying which stream is empty", args, code, errOut)
		}
	}
}

// TestAuditStreamFollowsPrefix: without COUNTERSIGN_AUDIT_STREAM the CLI
// reads the stream of the prefix it is given, the one serve and demo write
// with the same prefix.
func TestAuditStreamFollowsPrefix(t *testing.T) {
	env := mustAuditEnv(t)
	env.append(t, time.Now(), approval.Record{Event: approval.EventRunStarted, RunID: "run_prefix", Actor: "U1"})
	prefix, ok := strings.CutSuffix(env.stream, ":{audit}")
	if !ok {
		t.Fatalf("stream %q has no prefix", env.stream)
	}
	t.Setenv("COUNTERSIGN_AUDIT_STREAM", "")
	os.Unsetenv("COUNTERSIGN_AUDIT_STREAM")
	t.Setenv("COUNTERSIGN_REDIS_PREFIX", prefix)
	code, out, errOut := runCLI(t.Context(), "audit", "tail")
	if code != 0 || !strings.Contains(out, "run_started") || errOut != "" {
		t.Errorf("audit tail with the prefix only = %d, %q, %q; want the entry", code, out, errOut)
	}
}
