package approval_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// MustGate builds a gate or fails the test.
func MustGate(tb testing.TB, p approval.Policy) *approval.Gate {
	tb.Helper()
	g, err := approval.NewGate(p)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return g
}

func conf(v float64) *float64 { return &v }

func testPolicy() approval.Policy {
	return approval.Policy{
		Version: 1,
		Tools: map[string]approval.ToolPolicy{
			"lookup_order": {Risk: approval.RiskLow, Capabilities: []string{"read"}, Review: approval.ReviewNever},
			"search":       {Risk: approval.RiskLow, Capabilities: []string{"read"}, Review: approval.ReviewAuto},
			"update_note":  {Risk: approval.RiskMedium, Capabilities: []string{"write"}},
			"wipe":         {Risk: approval.RiskHigh, Review: approval.ReviewAuto},
			"send_email":   {Risk: approval.RiskMedium, Capabilities: []string{"send_email", "external_write", "send_email"}, Review: approval.ReviewAlways},
			"issue_refund": {
				Risk: approval.RiskHigh, Capabilities: []string{"spend_money"},
				Review: approval.ReviewAuto, When: "args.amount > 50",
				Quorum:     1,
				QuorumWhen: []approval.QuorumRule{{When: "double(args.amount) > 500.0", Quorum: 2}},
			},
			"tag_user": {Risk: approval.RiskLow, When: `requester == "U_BOSS" || tool != "tag_user"`},
			"flagged":  {Risk: approval.RiskLow, When: "args.flag"},
			"guarded":  {Risk: approval.RiskLow, When: "has(args.amount) && args.amount > 50"},
		},
	}
}

func codes(s []approval.Signal) []string {
	out := make([]string, 0, len(s))
	for _, x := range s {
		out = append(out, x.Code)
	}
	return out
}

func TestAssessSignals(t *testing.T) {
	g := MustGate(t, testPolicy())
	tests := []struct {
		name       string
		call       approval.ToolCall
		requester  string
		wantHuman  bool
		wantCodes  []string
		wantText   string // substring of some signal's text
		wantQuorum int
	}{
		{
			name: "never: no human, no signals, even with low confidence",
			call: approval.ToolCall{Tool: "lookup_order", Args: json.RawMessage(`{"order_id":"A1"}`), Confidence: conf(0.1)},
		},
		{
			name:      "always: review_always plus sensitive capabilities once each",
			call:      approval.ToolCall{Tool: "send_email", Args: json.RawMessage(`{}`), Confidence: conf(0.99)},
			wantHuman: true,
			wantCodes: []string{"review_always", "sensitive_capability", "sensitive_capability"},
			wantText:  "it can send email (a sensitive capability)",
		},
		{
			name:      "always: low confidence also listed",
			call:      approval.ToolCall{Tool: "send_email", Confidence: conf(0.42)},
			wantHuman: true,
			wantCodes: []string{"review_always", "sensitive_capability", "sensitive_capability", "low_confidence"},
			wantText:  "model confidence 0.42 is below 0.60",
		},
		{
			name: "auto low risk, confident: no human",
			call: approval.ToolCall{Tool: "search", Args: json.RawMessage(`{"q":"x"}`), Confidence: conf(0.9)},
		},
		{
			name: "auto low risk, confidence missing: no human",
			call: approval.ToolCall{Tool: "search", Args: json.RawMessage(`{"q":"x"}`)},
		},
		{
			name:      "auto low risk, low confidence",
			call:      approval.ToolCall{Tool: "search", Confidence: conf(0.42)},
			wantHuman: true,
			wantCodes: []string{"low_confidence"},
			wantText:  "model confidence 0.42 is below 0.60",
		},
		{
			name: "auto confidence equal to minimum is enough",
			call: approval.ToolCall{Tool: "update_note", Confidence: conf(0.6)},
		},
		{
			name:      "auto confidence just under minimum is shown exactly",
			call:      approval.ToolCall{Tool: "update_note", Confidence: conf(0.599)},
			wantHuman: true,
			wantCodes: []string{"low_confidence"},
			wantText:  "model confidence 0.599 is below 0.60",
		},
		{
			name:      "auto medium risk, confidence missing fails closed",
			call:      approval.ToolCall{Tool: "update_note"},
			wantHuman: true,
			wantCodes: []string{"low_confidence"},
			wantText:  "model gave no confidence (required for medium-risk tools)",
		},
		{
			name:      "auto confidence out of range",
			call:      approval.ToolCall{Tool: "update_note", Confidence: conf(85)},
			wantHuman: true,
			wantCodes: []string{"low_confidence"},
			wantText:  "not between 0 and 1",
		},
		{
			name:      "auto high risk",
			call:      approval.ToolCall{Tool: "wipe", Confidence: conf(1)},
			wantHuman: true,
			wantCodes: []string{"risk_high"},
			wantText:  "risk is high",
		},
		{
			name:      "auto high risk, confidence missing",
			call:      approval.ToolCall{Tool: "wipe"},
			wantHuman: true,
			wantCodes: []string{"risk_high", "low_confidence"},
			wantText:  "required for high-risk tools",
		},
		{
			name:      "when false: risk and capability still need a human",
			call:      approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":20}`), Confidence: conf(0.9)},
			wantHuman: true,
			wantCodes: []string{"risk_high", "sensitive_capability"},
		},
		{
			name:       "when true: human, static signals listed for context",
			call:       approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":80}`), Confidence: conf(0.9)},
			wantHuman:  true,
			wantCodes:  []string{"risk_high", "sensitive_capability", "when_rule"},
			wantText:   "rule: amount > 50",
			wantQuorum: 1,
		},
		{
			name:       "quorum_when raises the quorum",
			call:       approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":800}`), Confidence: conf(0.9)},
			wantHuman:  true,
			wantCodes:  []string{"risk_high", "sensitive_capability", "when_rule", "quorum_rule"},
			wantText:   "rule: amount > 500: 2 approvals needed",
			wantQuorum: 2,
		},
		{
			name:      "when false but confidence missing still needs a human",
			call:      approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":20}`)},
			wantHuman: true,
			wantCodes: []string{"risk_high", "sensitive_capability", "low_confidence"},
		},
		{
			name:       "when error fails closed, quorum raised to the highest rule",
			call:       approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amt":20}`), Confidence: conf(0.9)},
			wantHuman:  true,
			wantCodes:  []string{"risk_high", "sensitive_capability", "when_error", "when_error"},
			wantText:   "no such key: amount",
			wantQuorum: 2,
		},
		{
			name:      "when error on wrong type",
			call:      approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":"lots"}`), Confidence: conf(0.9)},
			wantHuman: true,
			wantCodes: []string{"risk_high", "sensitive_capability", "when_error", "when_error"},
		},
		{
			name:      "when sees requester",
			call:      approval.ToolCall{Tool: "tag_user", Confidence: conf(0.9)},
			requester: "U_BOSS",
			wantHuman: true,
			wantCodes: []string{"when_rule"},
		},
		{
			name:      "when false for another requester",
			call:      approval.ToolCall{Tool: "tag_user", Confidence: conf(0.9)},
			requester: "U_OTHER",
		},
		{
			name: "guarded rule, key absent: no error",
			call: approval.ToolCall{Tool: "guarded", Args: json.RawMessage(`{}`), Confidence: conf(0.9)},
		},
		{
			name:      "guarded rule, key present",
			call:      approval.ToolCall{Tool: "guarded", Args: json.RawMessage(`{"amount":51}`), Confidence: conf(0.9)},
			wantHuman: true,
			wantCodes: []string{"when_rule"},
		},
		{
			name:      "dyn rule returning bool",
			call:      approval.ToolCall{Tool: "flagged", Args: json.RawMessage(`{"flag":true}`), Confidence: conf(0.9)},
			wantHuman: true,
			wantCodes: []string{"when_rule"},
		},
		{
			name:      "dyn rule returning a non-bool fails closed",
			call:      approval.ToolCall{Tool: "flagged", Args: json.RawMessage(`{"flag":"yes"}`), Confidence: conf(0.9)},
			wantHuman: true,
			wantCodes: []string{"when_error"},
			wantText:  "not bool",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Assess(tt.call, tt.requester)
			if err != nil {
				t.Fatalf("Assess(%s) error = %v", tt.call.Tool, err)
			}
			if got.NeedsHuman != tt.wantHuman {
				t.Errorf("Assess(%s).NeedsHuman = %v, want %v (signals %v)", tt.call.Tool, got.NeedsHuman, tt.wantHuman, got.Signals)
			}
			if gotCodes := codes(got.Signals); !slices.Equal(gotCodes, tt.wantCodes) && !(len(gotCodes) == 0 && len(tt.wantCodes) == 0) {
				t.Errorf("Assess(%s) signals = %v, want %v", tt.call.Tool, gotCodes, tt.wantCodes)
			}
			if tt.wantText != "" && !slices.ContainsFunc(got.Signals, func(s approval.Signal) bool { return strings.Contains(s.Text, tt.wantText) }) {
				t.Errorf("Assess(%s) signals = %+v, want one containing %q", tt.call.Tool, got.Signals, tt.wantText)
			}
			if tt.wantQuorum != 0 && got.Policy.Quorum != tt.wantQuorum {
				t.Errorf("Assess(%s).Policy.Quorum = %d, want %d", tt.call.Tool, got.Policy.Quorum, tt.wantQuorum)
			}
			if got.Tool != tt.call.Tool || got.Policy.Name != tt.call.Tool {
				t.Errorf("Assess(%s) tool = %q, policy name %q", tt.call.Tool, got.Tool, got.Policy.Name)
			}
			again, _ := g.Assess(tt.call, tt.requester)
			if !reflect.DeepEqual(got, again) {
				t.Errorf("Assess(%s) not deterministic: %+v then %+v", tt.call.Tool, got, again)
			}
		})
	}
}

func TestAssessRefusals(t *testing.T) {
	g := MustGate(t, testPolicy())
	tests := []struct {
		name string
		call approval.ToolCall
		want error
	}{
		{"unknown tool", approval.ToolCall{Tool: "rm_rf", Args: json.RawMessage(`{}`)}, approval.ErrUnknownTool},
		{"invalid JSON", approval.ToolCall{Tool: "search", Args: json.RawMessage(`{"q":`)}, approval.ErrInvalidArgs},
		{"not an object", approval.ToolCall{Tool: "search", Args: json.RawMessage(`[1,2]`)}, approval.ErrInvalidArgs},
		{"null", approval.ToolCall{Tool: "search", Args: json.RawMessage(`null`)}, approval.ErrInvalidArgs},
		{"trailing data", approval.ToolCall{Tool: "search", Args: json.RawMessage(`{} {}`)}, approval.ErrInvalidArgs},
		{"invalid JSON under never", approval.ToolCall{Tool: "lookup_order", Args: json.RawMessage(`nope`)}, approval.ErrInvalidArgs},
		// search has no rule (its arguments are checked, not parsed);
		// flagged has one (they are parsed for it): both refuse alike.
		{"not an object, a rule reads it", approval.ToolCall{Tool: "flagged", Args: json.RawMessage(`[1,2]`)}, approval.ErrInvalidArgs},
		{"trailing data, a rule reads it", approval.ToolCall{Tool: "flagged", Args: json.RawMessage(`{"flag":true} {}`)}, approval.ErrInvalidArgs},
		{"null, a rule reads it", approval.ToolCall{Tool: "flagged", Args: json.RawMessage(` null `)}, approval.ErrInvalidArgs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Assess(tt.call, "U1")
			if !errors.Is(err, tt.want) {
				t.Fatalf("Assess(%s, %s) = %+v, %v; want error %v", tt.call.Tool, tt.call.Args, got, err, tt.want)
			}
		})
	}
}

func TestNewGateDefaultsAndAccessors(t *testing.T) {
	g := MustGate(t, approval.Policy{Tools: map[string]approval.ToolPolicy{
		"b": {},
		"a": {Risk: approval.RiskLow, Decisions: []approval.Verdict{approval.VerdictEdit}},
	}})
	if got, want := g.Tools(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("Tools() = %v, want %v", got, want)
	}
	p, ok := g.Policy("b")
	if !ok {
		t.Fatal(`Policy("b") not found`)
	}
	if p.Name != "b" || p.Risk != approval.RiskMedium || p.Review != approval.ReviewAuto || p.Quorum != 1 ||
		!slices.Equal(p.Decisions, approval.DefaultDecisions) {
		t.Errorf(`Policy("b") = %+v, want defaults`, p)
	}
	p.Decisions[0] = approval.VerdictRespond // must not leak into the gate
	if again, _ := g.Policy("b"); again.Decisions[0] != approval.VerdictApprove {
		t.Errorf("Policy returned a slice shared with the gate")
	}
	if _, ok := g.Policy("zzz"); ok {
		t.Errorf(`Policy("zzz") found, want not found`)
	}
	// Default sensitive capabilities apply when the policy names none; an
	// empty, non-nil list means none are sensitive.
	for _, tc := range []struct {
		sensitive []string
		want      bool
	}{{nil, true}, {[]string{}, false}, {[]string{"delete"}, false}} {
		g := MustGate(t, approval.Policy{SensitiveCapabilities: tc.sensitive, Tools: map[string]approval.ToolPolicy{
			"pay": {Risk: approval.RiskLow, Capabilities: []string{"spend_money"}},
		}})
		a, err := g.Assess(approval.ToolCall{Tool: "pay"}, "U1")
		if err != nil || a.NeedsHuman != tc.want {
			t.Errorf("sensitive %#v: Assess(pay) = %+v, %v; want NeedsHuman %v", tc.sensitive, a, err, tc.want)
		}
	}
	// A custom minimum confidence.
	g = MustGate(t, approval.Policy{MinConfidence: 0.9, Tools: map[string]approval.ToolPolicy{"x": {Risk: approval.RiskLow}}})
	a, _ := g.Assess(approval.ToolCall{Tool: "x", Confidence: conf(0.8)}, "U1")
	if !a.NeedsHuman || !strings.Contains(a.Signals[0].Text, "0.80 is below 0.90") {
		t.Errorf("Assess with min 0.9 = %+v, want low_confidence 0.80 is below 0.90", a)
	}
}

func TestNewGateErrors(t *testing.T) {
	tests := []struct {
		name string
		tp   approval.ToolPolicy
		want string
	}{
		{"undeclared variable", approval.ToolPolicy{When: "arg.amount > 5"}, `tool "t": when: 1:1: undeclared reference to 'arg'`},
		{"syntax error", approval.ToolPolicy{When: "args.amount >"}, `tool "t": when: 1:`},
		{"not bool", approval.ToolPolicy{When: "1 + 2"}, "must return bool, returns int"},
		{"bad quorum rule", approval.ToolPolicy{QuorumWhen: []approval.QuorumRule{{When: "args.x >", Quorum: 2}}}, "quorum_when[0].when: "},
		{"quorum rule below 1", approval.ToolPolicy{QuorumWhen: []approval.QuorumRule{{When: "true", Quorum: 0}}}, "quorum_when[0].quorum 0: must be at least 1"},
		{"never on high risk", approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewNever}, `review: "never" is not allowed for a high-risk tool`},
		{"never on sensitive", approval.ToolPolicy{Risk: approval.RiskLow, Capabilities: []string{"read", "spend_money"}, Review: approval.ReviewNever}, "sensitive capability spend_money"},
		{"never with when", approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewNever, When: "true"}, "no effect"},
		{"bad risk", approval.ToolPolicy{Risk: "hgh"}, `risk "hgh": must be low, medium or high`},
		{"bad review", approval.ToolPolicy{Review: "sometimes"}, `review "sometimes"`},
		{"bad quorum", approval.ToolPolicy{Quorum: -1}, "quorum -1"},
		{"bad decision", approval.ToolPolicy{Decisions: []approval.Verdict{approval.VerdictExpire}}, `decision "expire"`},
		{"name mismatch", approval.ToolPolicy{Name: "u"}, `name "u" differs`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{"t": tt.tp}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewGate(%+v) error = %v, want containing %q", tt.tp, err, tt.want)
			}
		})
	}
	if _, err := approval.NewGate(approval.Policy{MinConfidence: 1.5}); err == nil {
		t.Errorf("NewGate(min confidence 1.5) error = nil, want error")
	}
}

func TestCheckWhen(t *testing.T) {
	tests := []struct {
		expr string
		want string // "" means valid
	}{
		{`double(args.amount) > 50.0`, ""},
		{`args.amount > 50`, ""},
		{`tool == "x" && requester.startsWith("U")`, ""},
		{`"to" in args && args.to.endsWith("@example.com")`, ""},
		{`args.name.lowerAscii() == "x"`, ""},
		{``, "empty expression"},
		{`arg.amount`, "undeclared reference to 'arg'"},
		{`"x"`, "must return bool, returns string"},
		{`args.command.matches("^git (status|diff)$")`, ""},
		// A constant pattern is compiled with the rule: one that does not
		// compile is the policy's error, not a when_error at every call.
		{`args.command.matches("^git (status")`, "missing closing )"},
	}
	for _, tt := range tests {
		err := approval.CheckWhen(tt.expr)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckWhen(%q) = %v, want nil", tt.expr, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckWhen(%q) = %v, want containing %q", tt.expr, err, tt.want)
		}
	}
}

// TestCheckRule: a rule is read with the types its tool's schema gives the
// arguments. A rule the checker accepts runs as it reads: the gate fires
// it on arguments that match (numbers arrive as doubles, compared with
// int literals by value); one it refuses could never match or never be
// evaluated.
func TestCheckRule(t *testing.T) {
	types := map[string]approval.ArgType{
		"count": approval.ArgNumber, "env": approval.ArgString, "force": approval.ArgBool,
		"tags": approval.ArgList, "meta": approval.ArgObject, "any": approval.ArgAny,
	}
	tests := []struct {
		expr string
		args string // arguments the accepted rule must fire on
		want string // "" means accepted
	}{
		{expr: `args.count == 3`, args: `{"count":3}`},
		{expr: `args.count != 3`, args: `{"count":4}`},
		{expr: `-1 == args.count && args.count == -1`, args: `{"count":-1}`},
		{expr: `args.count in [1, 2]`, args: `{"count":2}`},
		{expr: `args.count > 2 && double(args.count) > 2.5 && int(args.count) % 2 == 0`, args: `{"count":4}`},
		{expr: `args.env == "prod" && args["env"].startsWith("pr")`, args: `{"env":"prod"}`},
		{expr: `args.force && size(args.tags) > 1 && "x" in args.tags && args.meta.rush == true`, args: `{"force":true,"tags":["x","y"],"meta":{"rush":true}}`},
		{expr: `has(args.env) && args.env == "prod"`, args: `{"env":"prod"}`},
		{expr: `args.any == 1 || args.any == "one"`, args: `{"any":"one"}`},
		{expr: `args.undeclared == 1`, args: `{"undeclared":1}`}, // names: ArgRefs
		{expr: `args.force == "true"`, want: "found no matching overload for '_==_' applied to '(bool, string)' (the tool's schema: args.force is a boolean)"},
		{expr: `args.env == 1`, want: "(string, int)"},
		{expr: `args.count > "500"`, want: "'_>_' applied to '(double, string)' (the tool's schema: args.count is a number; arguments arrive as JSON"},
		{expr: `args.count % 2 == 0`, want: "'_%_' applied to '(double, int)'"},
		{expr: `args.count + 1 > 3`, want: "'_+_' applied to '(double, int)'"},
		{expr: `args.count.startsWith("1")`, want: "startsWith"},
		{expr: `args.env`, want: "must return bool, returns string"},
		{expr: `arg.count > 1`, want: "undeclared reference to 'arg'"},
		{expr: ``, want: "empty expression"},
	}
	for _, tt := range tests {
		err := approval.CheckRule(tt.expr, types)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckRule(%q) = %v, want nil", tt.expr, err)
			continue
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckRule(%q) = %v, want containing %q", tt.expr, err, tt.want)
			continue
		case tt.want != "":
			continue
		}
		g := MustGate(t, approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"t": {Risk: approval.RiskLow, When: tt.expr}}})
		a, err := g.Assess(approval.ToolCall{Tool: "t", Args: json.RawMessage(tt.args)}, "U0ALICE01")
		if err != nil || !slices.Contains(codes(a.Signals), approval.SignalWhenRule) {
			t.Errorf("rule %q on %s: signals %v, %v; want when_rule (the rule the checker accepts fires)", tt.expr, tt.args, codes(a.Signals), err)
		}
	}
}

func TestAuthorize(t *testing.T) {
	errBoom := errors.New("slack down")
	groups := func(member map[string]bool, err error) func(string) (bool, error) {
		return func(id string) (bool, error) { return member[id], err }
	}
	channel := func(ok bool, err error) func() (bool, error) {
		return func() (bool, error) { return ok, err }
	}
	tests := []struct {
		name      string
		approvers approval.Approvers
		user      string
		groups    func(string) (bool, error)
		channel   func() (bool, error)
		want      error // nil means allowed
	}{
		{"listed user", approval.Approvers{Users: []string{"U1", "U2"}}, "U2", nil, nil, nil},
		{"unlisted user", approval.Approvers{Users: []string{"U1"}}, "U9", groups(nil, nil), channel(true, nil), approval.ErrNotApprover},
		{"requester may not approve own", approval.Approvers{Users: []string{"UREQ"}}, "UREQ", nil, nil, approval.ErrSelfApproval},
		{"requester allowed with AllowSelf", approval.Approvers{Users: []string{"UREQ"}, AllowSelf: true}, "UREQ", nil, nil, nil},
		{"self with AllowSelf still needs rights", approval.Approvers{Users: []string{"U1"}, AllowSelf: true}, "UREQ", groups(nil, nil), channel(true, nil), approval.ErrNotApprover},
		{"usergroup member", approval.Approvers{Usergroups: []string{"S1", "S2"}}, "U5", groups(map[string]bool{"S2": true}, nil), nil, nil},
		{"not in usergroup", approval.Approvers{Usergroups: []string{"S1"}}, "U5", groups(nil, nil), channel(true, nil), approval.ErrNotApprover},
		{"usergroup lookup fails closed", approval.Approvers{Usergroups: []string{"S1"}}, "U5", groups(nil, errBoom), nil, errBoom},
		{"channel members", approval.Approvers{ChannelMembers: true}, "U5", nil, channel(true, nil), nil},
		{"channel members, not a member", approval.Approvers{ChannelMembers: true}, "U5", nil, channel(false, nil), approval.ErrNotApprover},
		{"channel lookup fails closed", approval.Approvers{ChannelMembers: true}, "U5", nil, channel(false, errBoom), errBoom},
		{"empty approvers means channel members", approval.Approvers{}, "U5", nil, channel(true, nil), nil},
		{"empty approvers, not a member", approval.Approvers{}, "U5", nil, channel(false, nil), approval.ErrNotApprover},
		{"group or channel: channel admits despite group error", approval.Approvers{Usergroups: []string{"S1"}, ChannelMembers: true}, "U5", groups(nil, errBoom), channel(true, nil), nil},
		{"empty user", approval.Approvers{}, "", nil, channel(true, nil), approval.ErrNotApprover},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &approval.Request{ID: "req_1", Requester: "UREQ", Approvers: tt.approvers}
			err := approval.Authorize(r, tt.user, tt.groups, tt.channel)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Authorize(%+v, %q) = %v, want %v", tt.approvers, tt.user, err, tt.want)
			}
		})
	}
}

// TestAssessConcurrent exercises one gate from many goroutines (run with
// -race); each goroutine exits when its loop ends and wg.Wait joins them.
func TestAssessConcurrent(t *testing.T) {
	g := MustGate(t, testPolicy())
	call := approval.ToolCall{Tool: "issue_refund", Args: json.RawMessage(`{"amount":800}`), Confidence: conf(0.9)}
	want, err := g.Assess(call, "U1")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				got, err := g.Assess(call, "U1")
				if err != nil || !reflect.DeepEqual(got, want) {
					errs <- fmt.Sprintf("Assess = %+v, %v; want %+v", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestDenyRules: a matching deny rule refuses the call whatever the review
// mode, with the policy's reason, as a value (Assessment.Denied); a rule
// that cannot be evaluated sends the call to a human, or refuses it under
// review never; a call no rule matches is assessed as usual.
func TestDenyRules(t *testing.T) {
	deny := []approval.DenyRule{
		{When: `args.amount > 5000`, Reason: "refunds above $5,000 go through finance"},
		{When: `requester == "U_INTERN"`, Reason: "interns cannot refund"},
	}
	g := MustGate(t, approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"refund": {Risk: approval.RiskMedium, Review: approval.ReviewAlways, Deny: deny},
		"peek":   {Risk: approval.RiskLow, Review: approval.ReviewNever, Deny: []approval.DenyRule{{When: `args.id.startsWith("VIP")`, Reason: "VIP records are off limits"}}},
	}})
	tests := []struct {
		name, tool, args, requester string
		wantReason                  string // "" = not denied
	}{
		{"above limit", "refund", `{"amount": 6000}`, "U1", "refunds above $5,000 go through finance"},
		{"second rule", "refund", `{"amount": 10}`, "U_INTERN", "interns cannot refund"},
		{"no rule matches", "refund", `{"amount": 10}`, "U1", ""},
		{"rule cannot be evaluated: a human looks", "refund", `{}`, "U1", ""},
		{"under review never", "peek", `{"id": "VIP-7"}`, "U1", "VIP records are off limits"},
		{"never, rule cannot be evaluated: denied", "peek", `{}`, "U1", "deny rule args.id.startsWith(\"VIP\") could not be evaluated"},
		{"never, no match", "peek", `{"id": "C-7"}`, "U1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := g.Assess(approval.ToolCall{Tool: tt.tool, Args: json.RawMessage(tt.args)}, tt.requester)
			if err != nil {
				t.Fatalf("Assess = %v, want an assessment (a denial is a value, not an error)", err)
			}
			if tt.wantReason == "" {
				if a.Denied != nil {
					t.Fatalf("Assess = denied %+v, want no denial", a.Denied)
				}
				if wantHuman := tt.tool == "refund"; a.NeedsHuman != wantHuman {
					t.Errorf("NeedsHuman = %v, want %v", a.NeedsHuman, wantHuman)
				}
				unevaluable := slices.ContainsFunc(a.Signals, func(s approval.Signal) bool {
					return s.Code == approval.SignalWhenError && strings.Contains(s.Text, "deny rule args.amount > 5000")
				})
				if want := tt.args == `{}`; unevaluable != want {
					t.Errorf("signals = %+v, want the unevaluable deny rule listed: %v", a.Signals, want)
				}
				return
			}
			if a.Denied == nil || !strings.Contains(a.Denied.Reason, tt.wantReason) || a.Denied.Rule == "" {
				t.Fatalf("Assess = %+v, want denied with reason containing %q", a, tt.wantReason)
			}
			if !a.NeedsHuman {
				t.Error("a denied assessment has NeedsHuman false; a caller overlooking Denied could run it unreviewed")
			}
		})
	}
	_, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"refund": {Deny: []approval.DenyRule{{When: "true"}, {When: "args.", Reason: "x"}}},
	}})
	for _, want := range []string{"deny[0].reason: required", "deny[1].when:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewGate error = %v, want it to name %q", err, want)
		}
	}
}

// TestGrantCovers: a grant covers only its tool, requester and thread,
// while active, for calls needing one approval, never its grantor's own.
func TestGrantCovers(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	thread := approval.Origin{Channel: "C1", ThreadTS: "1.1"}
	g := &approval.Grant{ID: "g", Tool: "refund", Requester: "U_A", Origin: thread, GrantedBy: "U_B", Expires: now.Add(time.Hour)}
	if !g.Covers("refund", "U_A", thread, 1, now) {
		t.Fatal("grant does not cover its own scope")
	}
	revoked := *g
	revoked.RevokedBy = "U_C"
	own := *g
	own.GrantedBy = "U_A"
	for name, covers := range map[string]bool{
		"other tool":      g.Covers("email", "U_A", thread, 1, now),
		"other requester": g.Covers("refund", "U_C", thread, 1, now),
		"other thread":    g.Covers("refund", "U_A", approval.Origin{Channel: "C1", ThreadTS: "1.2"}, 1, now),
		"quorum 2":        g.Covers("refund", "U_A", thread, 2, now),
		"at expiry":       g.Covers("refund", "U_A", thread, 1, now.Add(time.Hour)),
		"revoked":         revoked.Covers("refund", "U_A", thread, 1, now),
		"grantor's own":   own.Covers("refund", "U_A", thread, 1, now),
		"no grant (nil)":  (*approval.Grant)(nil).Covers("refund", "U_A", thread, 1, now),
	} {
		if covers {
			t.Errorf("%s: covered, want not", name)
		}
	}
}

func TestPlainRule(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"double(args.amount) > 50.0", "amount > 50"},
		{"args.amount >= 1000 && args.currency != 'EUR'", "amount >= 1000 and currency is not 'EUR'"},
		{"string(args.to).endsWith('@example.com') || !args.notify", "to.endsWith('@example.com') or not notify"},
		{"int(double(args.n)) == 3", "n is 3"},
		{"double(args.amount) > 50.5", "amount > 50.5"},
	}
	for _, tt := range tests {
		if got := approval.PlainRule(tt.expr); got != tt.want {
			t.Errorf("PlainRule(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

// TestRuleReasonShownInWords: a when or quorum_when rule with a reason is
// shown as that reason, not as the rule.
func TestRuleReasonShownInWords(t *testing.T) {
	g, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{
		"refund": {Name: "refund", When: "double(args.amount) > 50.0", WhenReason: "refund above $50",
			QuorumWhen: []approval.QuorumRule{{When: "double(args.amount) > 500.0", Quorum: 2, Reason: "refund above $500"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	as, err := g.Assess(approval.ToolCall{Tool: "refund", Args: []byte(`{"amount":600}`)}, "U1")
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, s := range as.Signals {
		texts = append(texts, s.Text)
	}
	got := strings.Join(texts, "; ")
	if !strings.Contains(got, "refund above $50") || !strings.Contains(got, "refund above $500: 2 approvals needed") || strings.Contains(got, "args.") {
		t.Errorf("signals = %q, want the reasons in words", got)
	}
}

// TestAssessExternal: a call from an outside agent is assessed by its
// tool's own rule when the policy declares it, else by the external rule
// (named after the tool); without an external rule it is an unknown tool.
// The agent's Assess never falls back to the external rule.
func TestAssessExternal(t *testing.T) {
	ext := approval.ToolPolicy{Risk: approval.RiskMedium, Review: approval.ReviewAlways, Quorum: 2}
	with, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{"lookup": {Risk: approval.RiskLow, Review: approval.ReviewNever}}, External: &ext})
	if err != nil {
		t.Fatal(err)
	}
	without, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{"lookup": {Risk: approval.RiskLow, Review: approval.ReviewNever}}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		gate       *approval.Gate
		tool       string
		external   bool
		wantErr    error
		needsHuman bool
		quorum     int
	}{
		{"declared tool keeps its rule", with, "lookup", true, nil, false, 1},
		{"undeclared tool gets the external rule", with, "deploy", true, nil, true, 2},
		{"no external rule", without, "deploy", true, approval.ErrUnknownTool, false, 0},
		{"the agent's Assess ignores the external rule", with, "deploy", false, approval.ErrUnknownTool, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call := approval.ToolCall{Tool: c.tool, Args: json.RawMessage(`{"service":"web"}`)}
			assess := c.gate.Assess
			if c.external {
				assess = c.gate.AssessExternal
			}
			a, err := assess(call, "api:bot")
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) {
				t.Fatalf("assess(%s) error = %v, want %v", c.tool, err, c.wantErr)
			}
			if err != nil {
				return
			}
			if a.NeedsHuman != c.needsHuman || a.Policy.Quorum != c.quorum || a.Policy.Name != c.tool {
				t.Errorf("assess(%s) = needs human %v, quorum %d, name %q; want %v, %d, %q", c.tool, a.NeedsHuman, a.Policy.Quorum, a.Policy.Name, c.needsHuman, c.quorum, c.tool)
			}
		})
	}
}

// TestAnnotationsTightenExternal: an undeclared tool's MCP annotations
// set its review and risk, never less strict than the external rule (the
// stricter review, the higher risk); MCP's defaults (no annotations at
// all) are destructive and open-world; a declared tool ignores them.
func TestAnnotationsTightenExternal(t *testing.T) {
	yes, no := true, false
	cases := []struct {
		name       string
		ext        approval.ToolPolicy
		hints      *approval.ToolAnnotations
		review     approval.Review
		risk       approval.Risk
		needsHuman bool
	}{
		{"no hints keep the external rule", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, nil, approval.ReviewNever, approval.RiskLow, false},
		{"empty hints are MCP's defaults: destructive", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, &approval.ToolAnnotations{}, approval.ReviewAlways, approval.RiskHigh, true},
		{"read-only under never stays never", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, &approval.ToolAnnotations{ReadOnly: &yes}, approval.ReviewNever, approval.RiskLow, false},
		{"read-only never loosens always", approval.ToolPolicy{Review: approval.ReviewAlways, Risk: approval.RiskMedium}, &approval.ToolAnnotations{ReadOnly: &yes}, approval.ReviewAlways, approval.RiskMedium, true},
		{"destructive hint alone gates", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, &approval.ToolAnnotations{Destructive: &yes}, approval.ReviewAlways, approval.RiskHigh, true},
		{"non-destructive open world: auto, medium", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, &approval.ToolAnnotations{Destructive: &no}, approval.ReviewAuto, approval.RiskMedium, true},
		{"non-destructive closed world: auto, low", approval.ToolPolicy{Review: approval.ReviewNever, Risk: approval.RiskLow}, &approval.ToolAnnotations{Destructive: &no, OpenWorld: &no}, approval.ReviewAuto, approval.RiskLow, false},
		{"auto low never lowers a high external risk", approval.ToolPolicy{Review: approval.ReviewAuto, Risk: approval.RiskHigh}, &approval.ToolAnnotations{Destructive: &no, OpenWorld: &no}, approval.ReviewAuto, approval.RiskHigh, true},
		{"after stays after under a read-only hint", approval.ToolPolicy{Review: approval.ReviewAfter, Risk: approval.RiskLow, CancelWindow: time.Minute}, &approval.ToolAnnotations{ReadOnly: &yes}, approval.ReviewAfter, approval.RiskLow, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ext := c.ext
			g, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{"lookup": {Risk: approval.RiskLow, Review: approval.ReviewNever}}, External: &ext})
			if err != nil {
				t.Fatal(err)
			}
			a, err := g.AssessExternal(approval.ToolCall{Tool: "github.delete_repo", Args: json.RawMessage(`{}`), Annotations: c.hints}, "api:bot")
			if err != nil {
				t.Fatal(err)
			}
			if a.Policy.Review != c.review || a.Policy.Risk != c.risk || a.NeedsHuman != c.needsHuman {
				t.Errorf("assess = review %s, risk %s, needs human %v; want %s, %s, %v", a.Policy.Review, a.Policy.Risk, a.NeedsHuman, c.review, c.risk, c.needsHuman)
			}
			// A declared tool ignores the hints.
			d, err := g.AssessExternal(approval.ToolCall{Tool: "lookup", Args: json.RawMessage(`{}`), Annotations: &approval.ToolAnnotations{Destructive: &yes}}, "api:bot")
			if err != nil || d.NeedsHuman || d.Policy.Review != approval.ReviewNever {
				t.Errorf("declared tool with hints = review %s, needs human %v, err %v; want never, false", d.Policy.Review, d.NeedsHuman, err)
			}
		})
	}
}
