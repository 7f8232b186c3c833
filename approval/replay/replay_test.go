package replay_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/replay"
)

var (
	approve = approval.VerdictApprove
	reject  = approval.VerdictReject
	edit    = approval.VerdictEdit
)

// refundPolicy is the policy in force of the fixture history, with the
// refund tool's when rule when.
func refundPolicy(when string) approval.Policy {
	decisions := []approval.Verdict{approve, edit, reject}
	return approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {When: when, Decisions: decisions,
			QuorumWhen: []approval.QuorumRule{{When: "args.amount > 500", Quorum: 2}}},
		"send_email": {Review: approval.ReviewAlways, Decisions: decisions},
		"lookup":     {Review: approval.ReviewNever, Risk: approval.RiskLow},
		"archive":    {Review: approval.ReviewAlways, Decisions: decisions},
	}}
}

// fixture is a recorded history with known decisions, and the request
// ids of the calls people did not let through as proposed.
type fixture struct {
	w                             *world
	rejected90, edited70, wrong75 string
	redacted, archived, cut       string
}

// recordFixture records, under refundPolicy("args.amount > 50"):
//
//	refund  20  auto, ran
//	refund  80  asked, approved after 60 s, ran
//	refund  90  asked, rejected after 120 s
//	refund  70  asked, edited to 60 after 30 s, ran
//	refund  75  asked, approved after 30 s, ran, then marked wrong
//	refund 600  asked for 2 approvals, approved by two people (at 60 s and 90 s)
//	refund 200  asked, rejected after 60 s
//	send_email  asked, approved after 10 s
//	send_email  with an api_key (redacted in the audit), approved after 10 s
//	lookup      auto, ran
//	lookup      auto, ran, with a query longer than the audit keeps (cut)
//	archive     asked, approved after 10 s (a tool the candidates drop)
func recordFixture(t *testing.T) fixture {
	t.Helper()
	w := mustWorld(t, refundPolicy("args.amount > 50"))
	var f fixture
	f.w = w
	asked := func(tool, args string) *approval.Request {
		t.Helper()
		p := w.propose(t, tool, "api:bot", args)
		if p.Outcome != approval.ProposedAsk {
			t.Fatalf("Propose(%s %s) outcome %s, want ask", tool, args, p.Outcome)
		}
		return p.Request
	}
	if p := w.propose(t, "issue_refund", "api:bot", `{"order_id":"A1","amount":20}`); p.Outcome != approval.ProposedAuto {
		t.Fatalf("refund 20: outcome %s, want auto", p.Outcome)
	}
	r := asked("issue_refund", `{"order_id":"A2","amount":80}`)
	w.decide(t, r, approve, "U0ANN", 60*time.Second, "")
	w.run(t, r.ID)
	r = asked("issue_refund", `{"order_id":"A3","amount":90}`)
	w.decide(t, r, reject, "U0ANN", 120*time.Second, "")
	f.rejected90 = r.ID
	r = asked("issue_refund", `{"order_id":"A4","amount":70}`)
	w.decide(t, r, edit, "U0BOB", 30*time.Second, `{"order_id":"A4","amount":60}`)
	w.run(t, r.ID)
	f.edited70 = r.ID
	r = asked("issue_refund", `{"order_id":"A5","amount":75}`)
	w.decide(t, r, approve, "U0BOB", 30*time.Second, "")
	w.run(t, r.ID)
	w.clock.Advance(time.Hour)
	w.markWrong(t, r.ID, "U0ANN")
	f.wrong75 = r.ID
	r = asked("issue_refund", `{"order_id":"A6","amount":600}`)
	w.decide(t, r, approve, "U0ANN", 60*time.Second, "")
	w.decide(t, r, approve, "U0BOB", 30*time.Second, "")
	w.run(t, r.ID)
	r = asked("issue_refund", `{"order_id":"A7","amount":200}`)
	w.decide(t, r, reject, "U0ANN", 60*time.Second, "")
	r = asked("send_email", `{"to":"ops@example.com","subject":"hi"}`)
	w.decide(t, r, approve, "U0ANN", 10*time.Second, "")
	r = asked("send_email", `{"to":"ops@example.com","subject":"key","api_key":"sk-live-123"}`)
	w.decide(t, r, approve, "U0ANN", 10*time.Second, "")
	f.redacted = r.ID
	if p := w.propose(t, "lookup", "api:bot", `{"q":"x"}`); p.Outcome != approval.ProposedAuto {
		t.Fatalf("lookup: outcome %s, want auto", p.Outcome)
	}
	p := w.propose(t, "lookup", "api:bot", `{"q":"`+strings.Repeat("a", approval.MaxDataField+10)+`"}`)
	f.cut = p.Request.ID
	r = asked("archive", `{"id":"1"}`)
	w.decide(t, r, approve, "U0ANN", 10*time.Second, "")
	f.archived = r.ID
	return f
}

func without(p approval.Policy, tool string) approval.Policy {
	p.Tools = mapsClone(p.Tools)
	delete(p.Tools, tool)
	return p
}

func mapsClone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestReplayFixture replays the fixture history against a looser and a
// stricter candidate; every count, minute and regression is known.
func TestReplayFixture(t *testing.T) {
	f := recordFixture(t)
	current := refundPolicy("args.amount > 50")
	tests := []struct {
		name      string
		candidate approval.Policy
		refund    replay.ToolRow // the fields compared
		regress   map[string]string
	}{
		{
			name:      "looser: refunds up to 100 run unattended",
			candidate: without(refundPolicy("args.amount > 100"), "archive"),
			refund: replay.ToolRow{Calls: 7, Replayed: 7,
				Now:          replay.Counts{Auto: 1, Asked: 6, Approvals: 7},
				Candidate:    replay.Counts{Auto: 5, Asked: 2, Approvals: 3},
				MinutesSaved: (60 + 120 + 30 + 30) / 60.0, Regressions: 3},
			regress: map[string]string{f.rejected90: "rejected", f.edited70: "edited", f.wrong75: "marked_wrong"},
		},
		{
			name:      "stricter: refunds above 10 ask",
			candidate: without(refundPolicy("args.amount > 10"), "archive"),
			refund: replay.ToolRow{Calls: 7, Replayed: 7,
				Now:       replay.Counts{Auto: 1, Asked: 6, Approvals: 7},
				Candidate: replay.Counts{Asked: 7, Approvals: 8},
				// one approval more, at the tool's mean per approval:
				// seven recorded, each timed from the request's creation
				// (the second of the 600's at 90 s): 450 s / 7
				MinutesAdded: 450.0 / 7 / 60},
			regress: map[string]string{},
		},
		{
			name: "deny rule: refunds above 150 refused",
			candidate: func() approval.Policy {
				p := without(refundPolicy("args.amount > 50"), "archive")
				tp := p.Tools["issue_refund"]
				tp.Deny = []approval.DenyRule{{When: "args.amount > 150", Reason: "too much"}}
				p.Tools["issue_refund"] = tp
				return p
			}(),
			refund: replay.ToolRow{Calls: 7, Replayed: 7,
				Now:       replay.Counts{Auto: 1, Asked: 6, Approvals: 7},
				Candidate: replay.Counts{Auto: 1, Asked: 4, Denied: 2, Approvals: 4},
				// the 600's two approvals (60 s, 90 s) and the 200's (60 s)
				MinutesSaved: (60 + 90 + 60) / 60.0},
			regress: map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := replay.Run(context.Background(), f.w.audit, replay.Options{
				Current: replay.Policy{Policy: current}, Candidate: replay.Policy{Policy: tc.candidate}})
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			if rep.Calls != 12 {
				t.Errorf("Calls = %d, want 12", rep.Calls)
			}
			i := slices.IndexFunc(rep.Tools, func(r replay.ToolRow) bool { return r.Tool == "issue_refund" })
			if i < 0 {
				t.Fatalf("no issue_refund row in %+v", rep.Tools)
			}
			got := rep.Tools[i]
			want := tc.refund
			if got.Calls != want.Calls || got.Replayed != want.Replayed || got.Now != want.Now || got.Candidate != want.Candidate ||
				got.Regressions != want.Regressions || math.Abs(got.MinutesSaved-want.MinutesSaved) > 1e-9 || math.Abs(got.MinutesAdded-want.MinutesAdded) > 1e-9 {
				t.Errorf("issue_refund row = %+v\nwant calls %d replayed %d now %+v candidate %+v saved %.4f added %.4f regressions %d",
					got, want.Calls, want.Replayed, want.Now, want.Candidate, want.MinutesSaved, want.MinutesAdded, want.Regressions)
			}
			gotRegress := map[string]string{}
			for _, g := range rep.Regressions {
				gotRegress[g.RequestID] = g.Person
				if !g.Candidate.Outcome.Unattended() {
					t.Errorf("regression %s: candidate %s, want unattended", g.RequestID, g.Candidate.Outcome)
				}
			}
			if !mapsEqual(gotRegress, tc.regress) {
				t.Errorf("regressions = %v, want %v", gotRegress, tc.regress)
			}
			// Never guessed: the redacted call and the dropped tool are
			// named, not judged.
			wantUn := map[string]string{f.redacted: replay.WhyArgsRedacted, f.archived: replay.WhyUnknownCandidate, f.cut: replay.WhyArgsCut}
			gotUn := map[string]string{}
			for _, u := range rep.Unreplayable {
				gotUn[u.RequestID] = u.Why
			}
			if !mapsEqual(gotUn, wantUn) {
				t.Errorf("unreplayable = %v, want %v", gotUn, wantUn)
			}
			for _, r := range rep.Tools {
				if r.Tool == "lookup" && (r.Calls != 2 || r.Replayed != 1 || r.Now != replay.Counts{Auto: 1} || r.Candidate != replay.Counts{Auto: 1}) {
					t.Errorf("lookup row = %+v, want two calls, one replayed, auto both ways", r)
				}
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestReplayBadInput: an empty stream, a stream trimmed before the period,
// and a candidate whose rules do not compile are errors, never a report.
func TestReplayBadInput(t *testing.T) {
	current := replay.Policy{Policy: refundPolicy("args.amount > 50")}
	t.Run("empty stream", func(t *testing.T) {
		w := mustWorld(t, current.Policy)
		_, err := replay.Run(context.Background(), w.audit, replay.Options{Current: current, Candidate: current})
		if !errors.Is(err, replay.ErrEmpty) {
			t.Errorf("Run(empty) = %v, want ErrEmpty", err)
		}
	})
	t.Run("trimmed before the period", func(t *testing.T) {
		f := recordFixture(t)
		f.w.trimOldest(t, 5)
		_, err := replay.Run(context.Background(), f.w.audit, replay.Options{Current: current, Candidate: current})
		if !errors.Is(err, replay.ErrTrimmed) {
			t.Errorf("Run(trimmed) = %v, want ErrTrimmed", err)
		}
	})
	t.Run("an entry cut inside the period", func(t *testing.T) {
		f := recordFixture(t)
		f.w.cut(t, 10)
		_, err := replay.Run(context.Background(), f.w.audit, replay.Options{Current: current, Candidate: current})
		if !errors.Is(err, replay.ErrTrimmed) {
			t.Errorf("Run(cut) = %v, want ErrTrimmed", err)
		}
	})
	t.Run("candidate does not compile", func(t *testing.T) {
		f := recordFixture(t)
		_, err := replay.Run(context.Background(), f.w.audit, replay.Options{Current: current,
			Candidate: replay.Policy{Policy: refundPolicy("args.amount >")}})
		if err == nil {
			t.Errorf("Run(bad candidate) = nil error, want one")
		}
	})
}

// TestReplayModelCalls: calls of Countersign's own model are judged as the
// model's (its confidence counts), with the requester its run names; an
// outside caller's call let through names none, so a rule over the
// requester cannot judge it.
func TestReplayModelCalls(t *testing.T) {
	p := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {When: "args.amount > 50", Decisions: []approval.Verdict{approve, edit, reject}},
		"lookup":       {Risk: approval.RiskLow},
	}}
	w := mustWorld(t, p)
	// A low-risk tool needs no confidence; raised to medium risk, the
	// model's call without one asks a person (an outside caller's would not).
	if got := w.proposeModel(t, "lookup", "U0ALICE", `{"q":"x"}`, nil); got.Outcome != approval.ProposedAuto {
		t.Fatalf("lookup: outcome %s, want auto", got.Outcome)
	}
	unsure := w.proposeModel(t, "issue_refund", "U0ALICE", `{"amount":10}`, ptr(0.4)) // low confidence: asked
	if unsure.Outcome != approval.ProposedAsk {
		t.Fatalf("unsure call: outcome %s, want ask", unsure.Outcome)
	}
	w.decide(t, unsure.Request, reject, "U0ANN", 30*time.Second, "")
	// The model gave no confidence: asked, now and under the candidate
	// (an outside caller's missing confidence would not be).
	silent := w.proposeModel(t, "issue_refund", "U0ALICE", `{"amount":5}`, nil)
	if silent.Outcome != approval.ProposedAsk {
		t.Fatalf("call without confidence: outcome %s, want ask", silent.Outcome)
	}
	w.decide(t, silent.Request, approve, "U0ANN", 30*time.Second, "")
	sure := w.proposeModel(t, "issue_refund", "U0ALICE", `{"amount":20}`, ptr(0.9))
	if sure.Outcome != approval.ProposedAuto {
		t.Fatalf("sure call: outcome %s, want auto", sure.Outcome)
	}
	outside := w.propose(t, "issue_refund", "api:bot", `{"amount":30}`) // no confidence: an outside caller's is not asked for
	if outside.Outcome != approval.ProposedAuto {
		t.Fatalf("outside call: outcome %s, want auto", outside.Outcome)
	}

	cand := approval.Policy{Version: 1, MinConfidence: 0.3, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {When: `args.amount > 50 || requester == "U0MALLORY"`, Decisions: []approval.Verdict{approve, edit, reject}},
		"lookup":       {Risk: approval.RiskMedium},
	}}
	rep, err := replay.Run(context.Background(), w.audit, replay.Options{Current: replay.Policy{Policy: p}, Candidate: replay.Policy{Policy: cand}})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if len(rep.Tools) != 2 || rep.Tools[0].Now != (replay.Counts{Auto: 1, Asked: 2, Approvals: 2}) || rep.Tools[0].Candidate != (replay.Counts{Auto: 2, Asked: 1, Approvals: 1}) ||
		rep.Tools[1].Now != (replay.Counts{Auto: 1}) || rep.Tools[1].Candidate != (replay.Counts{Asked: 1, Approvals: 1}) {
		t.Errorf("tools = %+v\nwant issue_refund now 1 auto 2 asked, candidate 2 auto 1 asked; lookup now auto, candidate asked", rep.Tools)
	}
	if len(rep.Regressions) != 1 || rep.Regressions[0].RequestID != unsure.Request.ID || rep.Regressions[0].Person != "rejected" {
		t.Errorf("regressions = %+v, want the unsure call, rejected", rep.Regressions)
	}
	if len(rep.Unreplayable) != 1 || rep.Unreplayable[0].RequestID != outside.Request.ID || rep.Unreplayable[0].Why != replay.WhyRequesterUnknown {
		t.Errorf("unreplayable = %+v, want the outside call, requester unknown", rep.Unreplayable)
	}
}

// TestReplayGrantsRunOut: a grant let four refunds through; under a
// candidate allowing two uses (or a budget of $50) it runs out, and the
// calls past it would have asked a person.
func TestReplayGrantsRunOut(t *testing.T) {
	pol := func(lim approval.GrantLimits) approval.Policy {
		return approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
			"issue_refund": {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approve, reject},
				Preauthorize: 2 * time.Hour, PreauthorizeLimits: lim},
		}}
	}
	w := mustWorld(t, pol(approval.GrantLimits{}))
	thread := approval.Origin{Channel: "C0TASKS", ThreadTS: "1.000"}
	first := w.proposeIn(t, thread, "issue_refund", "U0ALICE", `{"amount":10}`)
	if first.Outcome != approval.ProposedAsk {
		t.Fatalf("first refund: outcome %s, want ask", first.Outcome)
	}
	w.approveAllow(t, first.Request, "U0ANN")
	for i, amount := range []int{20, 15, 30, 5} {
		if got := w.proposeIn(t, thread, "issue_refund", "U0ALICE", fmt.Sprintf(`{"amount":%d}`, amount)); got.Outcome != approval.ProposedPreauthorized {
			t.Fatalf("refund %d: outcome %s, want preauthorized", i, got.Outcome)
		}
	}
	tests := []struct {
		name         string
		lim          approval.GrantLimits
		runOut, asks int
	}{
		{"no limits", approval.GrantLimits{}, 0, 0},
		{"two uses", approval.GrantLimits{MaxUses: 2}, 1, 2},
		// 20 and 15 fit, 30 would pass the budget (a person), 5 fits
		// again: the store refuses only the use that passes a limit.
		{"a $50 budget", approval.GrantLimits{Argument: "amount", MaxTotal: 50}, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := replay.Run(context.Background(), w.audit, replay.Options{Current: replay.Policy{Policy: pol(approval.GrantLimits{})},
				Candidate: replay.Policy{Policy: pol(tc.lim)}})
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
			if len(rep.Tools) != 1 || rep.Tools[0].Calls != 5 || rep.Tools[0].GrantsRunOut != tc.runOut || rep.Tools[0].GrantCallsAsked != tc.asks {
				t.Errorf("tools = %+v, want 5 calls, %d grants run out, %d calls asked", rep.Tools, tc.runOut, tc.asks)
			}
		})
	}
}

// TestReplayReopened: a request approved, reopened at its claim because
// the policy in force by then asks two approvals, and rejected by the
// second person is a call a person rejected.
func TestReplayReopened(t *testing.T) {
	one := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approve, reject}},
	}}
	two := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approve, reject},
			QuorumWhen: []approval.QuorumRule{{When: "args.amount > 500", Quorum: 2}}},
	}}
	w := mustWorld(t, one)
	p := w.propose(t, "issue_refund", "api:bot", `{"amount":600}`)
	w.decide(t, p.Request, approve, "U0ANN", 30*time.Second, "")
	gate, err := approval.NewGate(two)
	if err != nil {
		t.Fatal(err)
	}
	w.life = w.lifecycle(t, gate) // the policy changed: claims ask two approvals now
	if _, err := w.life.Claim(context.Background(), p.Request.ID, "caller"); !errors.Is(err, approval.ErrNeedsApprovals) {
		t.Fatalf("Claim = %v, want ErrNeedsApprovals (reopened)", err)
	}
	w.decide(t, p.Request, reject, "U0BOB", 30*time.Second, "")

	never := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": {Review: approval.ReviewNever}}}
	rep, err := replay.Run(context.Background(), w.audit, replay.Options{Current: replay.Policy{Policy: two}, Candidate: replay.Policy{Policy: never}})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if len(rep.Regressions) != 1 || rep.Regressions[0].RequestID != p.Request.ID || rep.Regressions[0].Person != "rejected" || rep.Regressions[0].By != "U0BOB" {
		t.Errorf("regressions = %+v, want the reopened refund, rejected by U0BOB", rep.Regressions)
	}
	if len(rep.Tools) != 1 || rep.Tools[0].Now != (replay.Counts{Asked: 1, Approvals: 2}) {
		t.Errorf("tools = %+v, want one call asked for 2 approvals now", rep.Tools)
	}
}
