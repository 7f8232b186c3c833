package policyfile_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// MustParse parses a policy file or fails the test.
func MustParse(tb testing.TB, src string) *policyfile.File {
	tb.Helper()
	f, err := policyfile.Parse([]byte(src))
	if err != nil {
		tb.Fatalf("Parse:\n%v", err)
	}
	return f
}

// MustGate builds the gate for f or fails the test.
func MustGate(tb testing.TB, f *policyfile.File) *approval.Gate {
	tb.Helper()
	g, err := approval.NewGate(f.Policy)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return g
}

// wants reads the "# want: ..." lines at the top of a testdata file: each
// is a substring the error must contain. No want lines: the file is valid.
func wants(tb testing.TB, data []byte) []string {
	tb.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if w, ok := strings.CutPrefix(sc.Text(), "# want: "); ok {
			out = append(out, w)
		}
	}
	return out
}

func TestTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			want := wants(t, data)
			f, err := policyfile.Parse(data)
			if len(want) == 0 {
				if err != nil {
					t.Fatalf("Parse(%s) error:\n%v", file, err)
				}
				if _, err := approval.NewGate(f.Policy); err != nil {
					t.Fatalf("NewGate(%s) = %v", file, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse(%s) = nil error, want errors %q", file, want)
			}
			if !errors.Is(err, policyfile.ErrInvalid) {
				t.Errorf("Parse(%s) error does not wrap ErrInvalid", file)
			}
			lines := strings.Split(err.Error(), "\n")
			for _, w := range want {
				if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, w) }) {
					t.Errorf("Parse(%s) error has no line containing %q; got:\n%v", file, w, err)
				}
			}
			if len(lines) != len(want) {
				t.Errorf("Parse(%s) reported %d problems, want %d:\n%v", file, len(lines), len(want), err)
			}
		})
	}
}

func TestLoadNamesFileAndLine(t *testing.T) {
	_, err := policyfile.Load("testdata/unknown_keys.yaml")
	if err == nil || !strings.Contains(err.Error(), "testdata/unknown_keys.yaml:11: tools[0].risc: unknown key") {
		t.Errorf("Load(unknown_keys.yaml) = %v, want a file:line: path: message line", err)
	}
	if _, err := policyfile.Load("testdata/missing.yaml"); err == nil || errors.Is(err, policyfile.ErrInvalid) {
		t.Errorf("Load(missing) = %v, want a read error that is not ErrInvalid", err)
	}
}

func TestDefaultsApplied(t *testing.T) {
	f, err := policyfile.Load("testdata/minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 1 || f.Slack.ApprovalsChannel != "C0APPROVALS" || f.Agent.MaxSteps != 8 || f.Agent.StopOnRejection {
		t.Errorf("file settings = %+v %+v %+v, want defaults", f.Version, f.Slack, f.Agent)
	}
	if f.Policy.MinConfidence != 0.6 || !slices.Equal(f.Policy.SensitiveCapabilities, approval.DefaultSensitiveCapabilities) {
		t.Errorf("policy = %+v, want default min confidence and sensitive capabilities", f.Policy)
	}
	tp := f.Policy.Tools["ping"]
	want := approval.ToolPolicy{
		Name:        "ping",
		Risk:        approval.RiskMedium,
		Review:      approval.ReviewAuto,
		Decisions:   []approval.Verdict{approval.VerdictApprove, approval.VerdictReject},
		Timeout:     24 * time.Hour,
		Quorum:      1,
		Approvers:   approval.Approvers{ChannelMembers: true},
		RemindAfter: time.Hour,
	}
	if tp.Name != want.Name || tp.Risk != want.Risk || tp.Review != want.Review || !slices.Equal(tp.Decisions, want.Decisions) ||
		tp.Timeout != want.Timeout || tp.Quorum != want.Quorum || tp.Approvers.ChannelMembers != true || tp.Approvers.AllowSelf ||
		tp.RemindAfter != want.RemindAfter || tp.EscalateAfter != 0 || tp.Remember != 0 || tp.When != "" {
		t.Errorf("ping policy = %+v, want %+v", tp, want)
	}
	tool, ok := f.Tool("ping")
	if !ok || string(tool.Schema) != `{"type":"object","properties":{}}` || tool.HTTP != nil || tool.Preview != nil {
		t.Errorf("Tool(ping) = %+v, %v; want default schema, no http, no preview", tool, ok)
	}
	if f.Schema("ping") == nil {
		t.Errorf("Schema(ping) = nil, want the compiled default schema")
	}
}

func TestDefaultsSectionAndOverrides(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
agent: {stop_on_rejection: true}
defaults:
  risk: low
  review: always
  decisions: [approve, edit, reject]
  timeout: 2d
  quorum: 2
  approvers: {usergroups: [S1]}
  remind_after: 90m
  escalate_after: 1d12h
  escalate_to: {users: [U9]}
  allow_self_approval: true
  remember: 30m
  widen_on_escalation: true
tools:
  - name: inherits
    http: {url: "http://sor.example/x", body: "{}"}
  - name: overrides
    risk: high
    review: auto
    decisions: [respond, reject]
    timeout: 1h
    quorum: 1
    approvers: {users: [U1]}
    remind_after: 0s
    escalate_after: 0s
    allow_self_approval: false
    remember: 0s
    stop_on_rejection: false
`)
	in := f.Policy.Tools["inherits"]
	if in.Risk != approval.RiskLow || in.Review != approval.ReviewAlways || len(in.Decisions) != 3 || in.Timeout != 48*time.Hour ||
		in.Quorum != 2 || !slices.Equal(in.Approvers.Usergroups, []string{"S1"}) || in.Approvers.ChannelMembers ||
		!in.Approvers.AllowSelf || in.RemindAfter != 90*time.Minute || in.EscalateAfter != 36*time.Hour ||
		!slices.Equal(in.EscalateTo.Users, []string{"U9"}) || in.Remember != 30*time.Minute || !in.WidenOnEscalation || !in.StopOnRejection {
		t.Errorf("inherits = %+v, want the defaults section", in)
	}
	ov := f.Policy.Tools["overrides"]
	if ov.Risk != approval.RiskHigh || ov.Review != approval.ReviewAuto || !slices.Equal(ov.Decisions, []approval.Verdict{"respond", "reject"}) ||
		ov.Timeout != time.Hour || ov.Quorum != 1 || !slices.Equal(ov.Approvers.Users, []string{"U1"}) || len(ov.Approvers.Usergroups) != 0 ||
		ov.Approvers.AllowSelf || ov.RemindAfter != 0 || ov.EscalateAfter != 0 || ov.Remember != 0 || ov.StopOnRejection {
		t.Errorf("overrides = %+v, want its own values", ov)
	}
	h := f.Tools[0].HTTP
	if h == nil || h.Method != "POST" || h.Timeout != 10*time.Second || h.MaxBodyBytes != 1<<20 {
		t.Errorf("inherits http = %+v, want POST, 10s, 1 MiB defaults", h)
	}
}

// TestRemindAfterAdaptsToTimeout: a file that leaves remind_after alone
// is valid whatever its timeouts (the default is half the timeout, at most
// an hour); one that sets it still must keep it under the timeout.
func TestRemindAfterAdaptsToTimeout(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - {name: short, timeout: 10m}
  - {name: long, timeout: 8h}
  - {name: unset}
`)
	for name, want := range map[string]time.Duration{"short": 5 * time.Minute, "long": time.Hour, "unset": time.Hour} {
		if got := f.Policy.Tools[name].RemindAfter; got != want {
			t.Errorf("tools %s: RemindAfter = %v, want %v", name, got, want)
		}
	}
	f = MustParse(t, `
version: 1
slack: {approvals_channel: C1}
defaults: {timeout: 20m}
tools: [{name: inherits}]
`)
	if got := f.Policy.Tools["inherits"].RemindAfter; got != 10*time.Minute {
		t.Errorf("defaults timeout 20m: RemindAfter = %v, want 10m", got)
	}
	_, err := policyfile.Parse([]byte(`
version: 1
slack: {approvals_channel: C1}
tools: [{name: explicit, timeout: 10m, remind_after: 1h}]
`))
	if err == nil || !strings.Contains(err.Error(), "tools[0].remind_after") {
		t.Errorf("Parse(remind_after 1h, timeout 10m) = %v, want an error naming tools[0].remind_after", err)
	}
}

func TestReviewForms(t *testing.T) {
	tests := []struct {
		name, tool string
		review     approval.Review
		when       string
	}{
		{"string", `{name: t, review: always}`, approval.ReviewAlways, ""},
		{"mapping", `{name: t, review: {mode: auto, when: "args.x > 1"}}`, approval.ReviewAuto, "args.x > 1"},
		{"mapping without mode", `{name: t, review: {when: "args.x > 1"}}`, approval.ReviewAuto, "args.x > 1"},
		{"top-level when", `{name: t, when: "args.x > 1"}`, approval.ReviewAuto, "args.x > 1"},
		{"when with always", `{name: t, review: always, when: "args.x > 1"}`, approval.ReviewAlways, "args.x > 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := MustParse(t, "version: 1\nslack: {approvals_channel: C1}\ntools: ["+tt.tool+"]\n")
			tp := f.Policy.Tools["t"]
			if tp.Review != tt.review || tp.When != tt.when {
				t.Errorf("review, when = %q, %q; want %q, %q", tp.Review, tp.When, tt.review, tt.when)
			}
		})
	}
}

// TestExampleThroughGate loads examples/policy.yaml and runs every signal
// through the gate built from it.
func TestExampleThroughGate(t *testing.T) {
	f, err := policyfile.Load("../../examples/policy.yaml")
	if err != nil {
		t.Fatalf("Load(examples/policy.yaml):\n%v", err)
	}
	g := MustGate(t, f)
	if got, want := g.Tools(), []string{"add_order_note", "delete_customer", "issue_refund", "lookup_order", "send_email", "set_order_priority"}; !slices.Equal(got, want) {
		t.Errorf("Tools() = %v, want %v", got, want)
	}
	sure, unsure := 0.9, 0.3
	tests := []struct {
		name       string
		tool, args string
		confidence *float64
		wantHuman  bool
		wantCodes  []string
		wantQuorum int
	}{
		{"lookup never reviewed", "lookup_order", `{"order_id":"A-1"}`, nil, false, nil, 1},
		{"email always reviewed", "send_email", `{"to":"a@b.c","subject":"s","body":"b"}`, &sure, true,
			[]string{"review_always", "sensitive_capability", "sensitive_capability"}, 1},
		{"small refund runs", "issue_refund", `{"order_id":"A-1","amount":20,"reason":"late"}`, &sure, false, nil, 1},
		{"refund above 50 needs one", "issue_refund", `{"order_id":"A-1","amount":80,"reason":"late"}`, &sure, true,
			[]string{"when_rule"}, 1},
		{"refund above 500 needs two", "issue_refund", `{"order_id":"A-1","amount":800,"reason":"late"}`, &sure, true,
			[]string{"when_rule", "quorum_rule"}, 2},
		{"refund without amount fails closed", "issue_refund", `{"order_id":"A-1"}`, &sure, true,
			[]string{"when_error", "when_error"}, 2},
		{"small refund, unsure model", "issue_refund", `{"order_id":"A-1","amount":20,"reason":"late"}`, &unsure, true,
			[]string{"low_confidence"}, 1},
		{"note, sure model", "add_order_note", `{"order_id":"A-1","note":"x"}`, &sure, false, nil, 1},
		{"note, no confidence", "add_order_note", `{"order_id":"A-1","note":"x"}`, nil, true, []string{"low_confidence"}, 1},
		{"priority after a window", "set_order_priority", `{"order_id":"A-1","priority":"rush"}`, nil, true, []string{"review_after"}, 1},
		{"delete always", "delete_customer", `{"customer_id":"C-1","confirm_email":"a@b.c"}`, &sure, true,
			[]string{"review_always", "risk_high", "sensitive_capability"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := g.Assess(approval.ToolCall{Tool: tt.tool, Args: json.RawMessage(tt.args), Confidence: tt.confidence}, "U_REQ")
			if err != nil {
				t.Fatalf("Assess(%s) error = %v", tt.tool, err)
			}
			var codes []string
			for _, s := range a.Signals {
				codes = append(codes, s.Code)
			}
			if a.NeedsHuman != tt.wantHuman || !slices.Equal(codes, tt.wantCodes) || a.Policy.Quorum != tt.wantQuorum {
				t.Errorf("Assess(%s %s) = human %v, signals %v, quorum %d; want %v, %v, %d",
					tt.tool, tt.args, a.NeedsHuman, codes, a.Policy.Quorum, tt.wantHuman, tt.wantCodes, tt.wantQuorum)
			}
		})
	}
	if got := f.Policy.Tools["issue_refund"].Preauthorize; got != 2*time.Hour {
		t.Errorf("issue_refund preauthorize = %v, want 2h from the example", got)
	}
	if a, err := g.Assess(approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"order_id":"A-1","amount":20,"reason":"Chargeback filed"}`), Confidence: &sure}, "U_REQ"); err != nil || a.Denied == nil {
		t.Errorf("Assess(chargeback refund) = %+v, %v; want Denied by the example's deny rule", a, err)
	}
	if _, err := g.Assess(approval.ToolCall{Tool: "drop_tables"}, "U_REQ"); !errors.Is(err, approval.ErrUnknownTool) {
		t.Errorf("Assess(drop_tables) error = %v, want ErrUnknownTool", err)
	}
	del := f.Policy.Tools["delete_customer"]
	if !slices.Equal(del.Approvers.Usergroups, []string{"S0DPO"}) || del.Approvers.ChannelMembers || !slices.Equal(del.Secret, []string{"confirm_email"}) {
		t.Errorf("delete_customer policy = %+v, want approvers S0DPO only and confirm_email secret", del)
	}
	lookup, _ := f.Tool("lookup_order")
	if lookup.HTTP == nil || lookup.HTTP.Method != "GET" || lookup.HTTP.Timeout != 5*time.Second || lookup.HTTP.MaxBodyBytes != 65536 ||
		lookup.HTTP.Headers["Authorization"] != `Bearer {{env "SOR_TOKEN"}}` {
		t.Errorf("lookup_order http = %+v", lookup.HTTP)
	}
	refund, _ := f.Tool("issue_refund")
	if p := refund.Preview; p == nil || len(p.Fields) != 4 || p.Fields[0] != (policyfile.PreviewField{Label: "Customer", Path: "customer.name"}) ||
		p.Timeout != 5*time.Second {
		t.Errorf("issue_refund preview = %+v", refund.Preview)
	}
	// Schema properties keep file order (the edit form follows it).
	if s := string(refund.Schema); strings.Index(s, `"order_id"`) > strings.Index(s, `"amount"`) {
		t.Errorf("issue_refund schema reordered properties: %s", s)
	}
}

func TestValidateArgs(t *testing.T) {
	f, err := policyfile.Load("../../examples/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool, args string
		want             error
		wantText         string
	}{
		{"valid", "issue_refund", `{"order_id":"A-1","amount":12.5,"reason":"late"}`, nil, ""},
		{"wrong type", "issue_refund", `{"order_id":"A-1","amount":"12","reason":"late"}`, approval.ErrInvalidArgs, "at '/amount'"},
		{"missing property", "issue_refund", `{"order_id":"A-1"}`, approval.ErrInvalidArgs, "missing properties"},
		{"extra property", "lookup_order", `{"order_id":"A-1","x":1}`, approval.ErrInvalidArgs, "additional properties"},
		{"not JSON", "lookup_order", `{`, approval.ErrInvalidArgs, ""},
		{"unknown tool", "nope", `{}`, approval.ErrUnknownTool, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := f.ValidateArgs(tt.tool, json.RawMessage(tt.args))
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("ValidateArgs(%s, %s) = %v, want %v", tt.tool, tt.args, err, tt.want)
			}
			if err != nil && (strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tt.wantText)) {
				t.Errorf("ValidateArgs(%s, %s) = %q, want one line containing %q", tt.tool, tt.args, err, tt.wantText)
			}
		})
	}
	if _, ok := f.Tool("nope"); ok {
		t.Errorf("Tool(nope) found")
	}
	if f.Schema("nope") != nil {
		t.Errorf("Schema(nope) != nil")
	}
	// A File built by hand compiles its schemas on demand.
	hand := &policyfile.File{Tools: []policyfile.Tool{{Name: "x", Schema: json.RawMessage(`{"type":"object","required":["a"]}`)}}}
	if err := hand.ValidateArgs("x", json.RawMessage(`{}`)); !errors.Is(err, approval.ErrInvalidArgs) {
		t.Errorf("hand-built ValidateArgs(x, {}) = %v, want ErrInvalidArgs", err)
	}
}

func TestFuncs(t *testing.T) {
	env := map[string]string{"TOKEN": "s3cret"}
	tpl := template.Must(template.New("t").Funcs(policyfile.Funcs(func(k string) string { return env[k] })).
		Parse(`{{env "TOKEN"}} {{json .}} {{urlquery "a b"}}`))
	var b strings.Builder
	if err := tpl.Execute(&b, map[string]any{"q": `"x"`}); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), `s3cret {"q":"\"x\""} a+b`; got != want {
		t.Errorf("template = %q, want %q", got, want)
	}
}

func TestSyntaxErrorLine(t *testing.T) {
	tests := []struct {
		name, src string
		wantLine  int
	}{
		{"bad indent", "version: 1\nslack:\n  approvals_channel: C1\n tools: []\n", 4},
		{"tab", "version: 1\nslack:\n\tapprovals_channel: C1\n", 3},
		{"colon in plain value", "version: 1\nagent:\n  system_prompt: a: b\n", 3},
		{"unclosed quote", "version: 1\nagent:\n  system_prompt: \"abc\ntools: []\n", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policyfile.Parse([]byte(tt.src))
			list, ok := errors.AsType[policyfile.ErrorList](err)
			if !ok || len(list) != 1 || !strings.HasPrefix(list[0].Message, "invalid YAML: ") {
				t.Fatalf("Parse(%q) = %v, want one invalid YAML error", tt.src, err)
			}
			if list[0].Line != tt.wantLine {
				t.Errorf("Parse(%q) = %v, want line %d", tt.src, err, tt.wantLine)
			}
		})
	}
}

// TestDocsEmbedExample keeps docs/policy.md's copy of the example in step
// with examples/policy.yaml.
func TestDocsEmbedExample(t *testing.T) {
	ex, err := os.ReadFile("../../examples/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, append([]byte("```yaml\n"), ex...)) {
		t.Errorf("docs/policy.md does not contain examples/policy.yaml verbatim; copy it into the Complete example section")
	}
	guide, err := os.ReadFile("../../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(guide, append([]byte("```yaml\n"), ex...)) {
		t.Errorf("docs/guide.md does not contain examples/policy.yaml verbatim; copy it into the Policy file section")
	}
}

// TestRuleReasons: review.reason and quorum_when[].reason are kept for the
// card; a reason without its rule names the key.
func TestRuleReasons(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - name: refund
    schema: {type: object, properties: {amount: {type: number}}}
    review: {mode: auto, when: "double(args.amount) > 50.0", reason: "refund above $50"}
    quorum_when: [{when: "double(args.amount) > 500.0", quorum: 2, reason: "refund above $500"}]
`)
	tp := f.Policy.Tools["refund"]
	if tp.WhenReason != "refund above $50" || len(tp.QuorumWhen) != 1 || tp.QuorumWhen[0].Reason != "refund above $500" {
		t.Errorf("refund = %+v, want both reasons", tp)
	}
	_, err := policyfile.Parse([]byte(`
version: 1
slack: {approvals_channel: C1}
tools: [{name: t, review: {mode: auto, reason: "why"}}]
`))
	if err == nil || !strings.Contains(err.Error(), "tools[0].review.reason") {
		t.Errorf("Parse(reason without when) = %v, want an error naming tools[0].review.reason", err)
	}
}

// TestConfirmDefaultsToHighRisk: high-risk tools ask "are you sure?" unless
// they say otherwise; others only when they ask.
func TestConfirmDefaultsToHighRisk(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - {name: high, risk: high}
  - {name: high_off, risk: high, confirm: false}
  - {name: low_on, risk: low, confirm: true}
  - {name: medium}
`)
	for name, want := range map[string]bool{"high": true, "high_off": false, "low_on": true, "medium": false} {
		if got := f.Policy.Tools[name].Confirm; got != want {
			t.Errorf("tools %s: Confirm = %v, want %v", name, got, want)
		}
	}
}

// TestFormats: preview fields and arguments take a format; a bad one
// names its key.
func TestFormats(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - name: refund
    formats: {amount: {currency: USD}, fee: {currency: EUR, minor_units: true}, when: date}
    preview:
      url: "http://sor.example/orders/1"
      fields:
        - {label: Order total, path: total, format: {currency: USD}}
        - {label: Share, path: share, format: percent}
`)
	tp := f.Policy.Tools["refund"]
	if tp.Formats["amount"] != (approval.ValueFormat{Kind: "currency", Currency: "USD"}) || !tp.Formats["fee"].MinorUnits || tp.Formats["when"].Kind != "date" {
		t.Errorf("formats = %+v", tp.Formats)
	}
	if p := f.Tools[0].Preview; p == nil || p.Fields[0].Format.Currency != "USD" || p.Fields[1].Format.Kind != "percent" {
		t.Errorf("preview fields = %+v", f.Tools[0].Preview)
	}
	_, err := policyfile.Parse([]byte(`
version: 1
slack: {approvals_channel: C1}
tools: [{name: t, formats: {amount: money}}]
`))
	if err == nil || !strings.Contains(err.Error(), "tools[0].formats.amount") {
		t.Errorf("Parse(format money) = %v, want an error naming tools[0].formats.amount", err)
	}
}

// TestPreviewLabel: a preview's label names the system of record for
// the card; one too long for the card's line names its key.
func TestPreviewLabel(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - name: refund
    preview: {label: the order system, url: "http://sor.example/orders/1", fields: [{label: Total, path: total}]}
  - name: other
    preview: {url: "http://sor.example/orders/1"}
`)
	if p := f.Tools[0].Preview; p == nil || p.Label != "the order system" {
		t.Errorf("refund preview = %+v, want label %q", p, "the order system")
	}
	if p := f.Tools[1].Preview; p == nil || p.Label != "" {
		t.Errorf("other preview = %+v, want no label", p)
	}
	_, err := policyfile.Parse([]byte("version: 1\nslack: {approvals_channel: C1}\ntools: [{name: t, preview: {label: " +
		strings.Repeat("x", 101) + ", url: 'http://sor.example/x'}}]\n"))
	if err == nil || !strings.Contains(err.Error(), "tools[0].preview.label") {
		t.Errorf("Parse(label of 101 characters) = %v, want an error naming tools[0].preview.label", err)
	}
}

// TestPreauthorizeLimits: preauthorize takes a duration or a duration with
// limits; a bad limit names its key.
func TestPreauthorizeLimits(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: C1}
tools:
  - name: refund
    schema: {type: object, properties: {amount: {type: number}}}
    preauthorize: {for: 24h, uses: 3, total: {argument: amount, max: 100}}
  - {name: plain, preauthorize: 1h}
`)
	tp := f.Policy.Tools["refund"]
	if tp.Preauthorize != 24*time.Hour || tp.PreauthorizeLimits != (approval.GrantLimits{MaxUses: 3, Argument: "amount", MaxTotal: 100}) {
		t.Errorf("refund = %v %+v, want 24h, 3 uses, $100 of amount", tp.Preauthorize, tp.PreauthorizeLimits)
	}
	if p := f.Policy.Tools["plain"]; p.Preauthorize != time.Hour || p.PreauthorizeLimits != (approval.GrantLimits{}) {
		t.Errorf("plain = %v %+v", p.Preauthorize, p.PreauthorizeLimits)
	}
	for _, tt := range []struct{ yaml, key string }{
		{`{name: t, preauthorize: {uses: 3}}`, "tools[0].preauthorize.for"},
		{`{name: t, preauthorize: {for: 1h, uses: 0}}`, "tools[0].preauthorize.uses"},
		{`{name: t, preauthorize: {for: 1h, total: {argument: amount}}}`, "tools[0].preauthorize.total"},
	} {
		_, err := policyfile.Parse([]byte("version: 1\nslack: {approvals_channel: C1}\ntools: [" + tt.yaml + "]\n"))
		if err == nil || !strings.Contains(err.Error(), tt.key) {
			t.Errorf("Parse(%s) = %v, want an error naming %s", tt.yaml, err, tt.key)
		}
	}
}

// TestClaimWindow: api.claim_window sets how long an approved request of
// an outside caller waits to be claimed; without it, the default.
func TestClaimWindow(t *testing.T) {
	base := "version: 1\nslack:\n  approvals_channel: G0APPROV1\ntools:\n  - name: lookup\n    risk: low\n    review: never\n"
	for _, tt := range []struct {
		name, src string
		want      time.Duration
	}{
		{"default", base, approval.DefaultClaimWindow},
		{"set", base + "api:\n  claim_window: 15m\n", 15 * time.Minute},
	} {
		f, err := policyfile.Parse([]byte(tt.src))
		if err != nil {
			t.Fatalf("%s: Parse: %v", tt.name, err)
		}
		if f.API.ClaimWindow != tt.want {
			t.Errorf("%s: ClaimWindow = %v, want %v", tt.name, f.API.ClaimWindow, tt.want)
		}
	}
}

// TestSlackRefs: every Slack id a file gives is listed with its key path,
// line and kind, names written where ids belong included, whether or not
// the file is valid (countersign check --slack looks them up).
func TestSlackRefs(t *testing.T) {
	data, err := os.ReadFile("testdata/bad_slack_ids.yaml")
	if err != nil {
		t.Fatal(err)
	}
	refs, err := policyfile.SlackRefs(data)
	if err != nil {
		t.Fatalf("SlackRefs: %v", err)
	}
	type ref struct {
		path  string
		line  int
		kind  policyfile.SlackKind
		value string
		name  string // Name(): "" for an id
	}
	want := []ref{
		{"slack.approvals_channel", 11, policyfile.SlackApprovals, "D0DIRECT1", "D0DIRECT1"},
		{"slack.task_channels[0]", 12, policyfile.SlackChannel, "C0TASKS01", ""},
		{"slack.task_channels[1]", 12, policyfile.SlackChannel, "#ops", "ops"},
		{"slack.task_channels[2]", 12, policyfile.SlackChannel, "G0PRIV001", ""},
		{"slack.task_channels[3]", 12, policyfile.SlackChannel, "D0DM00001", ""},
		{"slack.allowed_teams[0]", 13, policyfile.SlackTeam, "acme", "acme"},
		{"slack.allowed_teams[1]", 13, policyfile.SlackTeam, "T0ACME001", ""},
		{"defaults.approvers.usergroups[0]", 15, policyfile.SlackUsergroup, "@sre", "sre"},
		{"defaults.approvers.usergroups[1]", 15, policyfile.SlackUsergroup, "S0SRE0001", ""},
		{"defaults.approvers.users[0]", 15, policyfile.SlackUser, "U0ALICE01", ""},
		{"defaults.approvers.users[1]", 15, policyfile.SlackUser, "alice", "alice"},
		{"defaults.approvers.users[2]", 15, policyfile.SlackUser, "W0GRID001", ""},
		{"tools[0].escalate_to.usergroups[0]", 19, policyfile.SlackUsergroup, "sre-leads", "sre-leads"},
		{"api.keys[0].slack_user", 25, policyfile.SlackUser, "@bob", "bob"},
	}
	var got []ref
	for _, r := range refs {
		got = append(got, ref{r.Path, r.Line, r.Kind, r.Value, r.Name()})
	}
	if !slices.Equal(got, want) {
		t.Errorf("SlackRefs =\n%v\nwant\n%v", got, want)
	}
	if _, err := policyfile.SlackRefs([]byte("slack: [\n")); !errors.Is(err, policyfile.ErrInvalid) {
		t.Errorf("SlackRefs(bad YAML) = %v, want ErrInvalid", err)
	}
}

// step_up: a tool's own rule (with when, over its schema), the defaults'
// by risk (with its methods and fresh), and false turning the defaults'
// off; the gate says which votes need a confirmation.
func TestStepUp(t *testing.T) {
	data, err := os.ReadFile("testdata/step_up.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := MustParse(t, string(data))
	g := MustGate(t, f)
	for _, c := range []struct {
		tool, risk, args string
		want             string
	}{
		{"refund", "medium", `{"amount":900}`, "your vote needs a passkey confirmation (refund above $500)"},
		{"refund", "medium", `{"amount":90}`, ""},
		{"delete_customer", "high", `{}`, "your vote needs a passkey or a single sign-on confirmation"},
		{"deploy", "high", `{}`, ""},
		// oidc alone: the step-up page signs in at the identity provider.
		{"rotate_keys", "medium", `{}`, "your vote needs a single sign-on confirmation"},
	} {
		n := g.StepUpFor(&approval.Request{Tool: c.tool, Risk: approval.Risk(c.risk)}, json.RawMessage(c.args))
		got := ""
		if n != nil {
			got = n.Words()
		}
		if got != c.want {
			t.Errorf("StepUpFor(%s, %s) = %q, want %q", c.tool, c.args, got, c.want)
		}
	}
	if su := f.Policy.Tools["delete_customer"].StepUp; su == nil || su.Fresh != 10*time.Minute {
		t.Errorf("delete_customer's step_up = %+v, want the defaults' (fresh 10m)", su)
	}
}

// slack.passkey_admins names who may vouch for a passkey enrollment:
// Slack ids checked as approvers are, refused when it names no one or
// lets someone vouch for themself.
func TestPasskeyAdmins(t *testing.T) {
	f := MustParse(t, "version: 1\nslack: {approvals_channel: C0APPROVALS, passkey_admins: {users: [U0ADMIN01], usergroups: [S0ADMINS1]}}\ntools: [{name: t}]\n")
	if a := f.Policy.PasskeyAdmins; a == nil || !slices.Equal(a.Users, []string{"U0ADMIN01"}) || !slices.Equal(a.Usergroups, []string{"S0ADMINS1"}) {
		t.Errorf("PasskeyAdmins = %+v", a)
	}
	if f := MustParse(t, "version: 1\nslack: {approvals_channel: C0APPROVALS}\ntools: [{name: t}]\n"); f.Policy.PasskeyAdmins != nil {
		t.Errorf("PasskeyAdmins without the key = %+v, want nil (the approvals channel's members)", f.Policy.PasskeyAdmins)
	}
	for _, c := range []struct{ yaml, want string }{
		{"passkey_admins: {}", "slack.passkey_admins: names no one"},
		{"passkey_admins: {users: [U0ADMIN01], allow_self: true}", "slack.passkey_admins.allow_self"},
	} {
		_, err := policyfile.Parse([]byte("version: 1\nslack: {approvals_channel: C0APPROVALS, " + c.yaml + "}\ntools: [{name: t}]\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.yaml, err, c.want)
		}
	}
}
