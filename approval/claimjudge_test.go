package approval_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// TestDecideJudgesWhoDecides (issue 45, point 2): who may decide is judged
// by Lifecycle.Decide itself, for every verdict a person can record —
// whatever surface calls it — not by the Slack click alone: nobody who
// asked for a request approves, edits, runs it now or grants on it; only
// approvers decide; Approve + allow only where it is offered, never by a
// requester (even where self-approval is allowed). A refusal records
// nothing.
func TestDecideJudgesWhoDecides(t *testing.T) {
	ctx := context.Background()
	dir := approvaltest.Directory{Channel: []string{"U0BOB", "U0ALICE"}}
	tests := []struct {
		name  string
		mod   func(r *approval.Request)
		who   string
		v     approval.Verdict
		args  string
		allow bool
		want  error
	}{
		{name: "requester approves", who: "U0ALICE", v: approval.VerdictApprove, want: approval.ErrSelfApproval},
		{name: "requester edits", who: "U0ALICE", v: approval.VerdictEdit, args: `{"order_id":"1234","amount":60}`, want: approval.ErrSelfApproval},
		{name: "another asker approves", who: "U0CAROL", v: approval.VerdictApprove, want: approval.ErrSelfApproval,
			mod: func(r *approval.Request) { r.Requesters = []string{"U0ALICE", "U0CAROL"} }},
		{name: "requester runs now", who: "U0ALICE", v: approval.VerdictRunNow, want: approval.ErrSelfApproval, mod: afterMode},
		{name: "requester grants, self-approval allowed", who: "U0ALICE", v: approval.VerdictApprove, allow: true, want: approval.ErrSelfGrant,
			mod: func(r *approval.Request) { r.Approvers.AllowSelf, r.Preauthorize = true, time.Hour }},
		{name: "grant not offered", who: "U0BOB", v: approval.VerdictApprove, allow: true, want: approval.ErrGrantNotOffered},
		{name: "grant on a quorum of two", who: "U0BOB", v: approval.VerdictApprove, allow: true, want: approval.ErrGrantNotOffered,
			mod: func(r *approval.Request) { r.Preauthorize, r.Quorum = time.Hour, 2 }},
		{name: "not in the approvals channel", who: "U0MALLORY", v: approval.VerdictApprove, want: approval.ErrNotApprover},
		{name: "not among the listed approvers", who: "U0BOB", v: approval.VerdictReject, want: approval.ErrNotApprover,
			mod: func(r *approval.Request) { r.Approvers.Users = []string{"U0DAVE"} }},
		{name: "approver approves", who: "U0BOB", v: approval.VerdictApprove},
		{name: "approver grants", who: "U0BOB", v: approval.VerdictApprove, allow: true, mod: func(r *approval.Request) { r.Preauthorize = time.Hour }},
		{name: "approver runs now", who: "U0BOB", v: approval.VerdictRunNow, mod: afterMode},
		{name: "escalation widened the approvers", who: "U0DAVE", v: approval.VerdictApprove,
			mod: func(r *approval.Request) { r.Approvers.Users = []string{"U0DAVE"} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustLifecycle(t)
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: approvaltest.NewLedger(f.rec, f.audit), Gate: mustRefundGate(t), Now: f.clock.Now, Directory: dir})
			if err != nil {
				t.Fatal(err)
			}
			r := f.create(t, tc.mod)
			d := approval.Decision{RequestID: r.ID, Verdict: tc.v, Approver: tc.who, At: f.clock.Now(), Digest: r.Digest}
			if tc.args != "" {
				d.Args = json.RawMessage(tc.args)
			}
			if err := life.MayDecide(ctx, r, tc.who, tc.v, tc.allow); !errors.Is(err, tc.want) {
				t.Errorf("MayDecide = %v, want %v", err, tc.want)
			}
			got, err := life.Decide(ctx, r, d, approval.DecideOptions{Allow: tc.allow})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decide(%s by %s) = %v, want %v", tc.v, tc.who, err, tc.want)
			}
			cur, rerr := f.rec.Request(ctx, r.ID)
			if rerr != nil {
				t.Fatal(rerr)
			}
			switch {
			case tc.want != nil && (cur.Status != approval.StatusPending || len(cur.Approvals) != 0):
				t.Errorf("refused, yet the record is %s with %d approvals; want it unchanged", cur.Status, len(cur.Approvals))
			case tc.want == nil && (got == nil || got.Status != approval.StatusApproved):
				t.Errorf("Decide = %+v, want approved", got)
			}
		})
	}
}

// afterMode makes a request a cancel window's (review: after).
func afterMode(r *approval.Request) {
	r.Mode = approval.ModeAfter
	r.Decisions = []approval.Verdict{approval.VerdictCancel, approval.VerdictRunNow}
}

// judgePolicy is a refund policy: deny above denyOver, two approvals
// above quorumOver, amounts at most max (0: no such rule).
func judgePolicy(tb testing.TB, denyOver, quorumOver, maxAmount int) (*approval.Gate, approval.Schemas) {
	tb.Helper()
	tp := approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewAlways,
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject}}
	if denyOver > 0 {
		tp.Deny = []approval.DenyRule{{When: fmt.Sprintf("double(args.amount) > %d.0", denyOver), Reason: "too much"}}
	}
	if quorumOver > 0 {
		tp.QuorumWhen = []approval.QuorumRule{{When: fmt.Sprintf("double(args.amount) > %d.0", quorumOver), Quorum: 2, Reason: "large"}}
	}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": tp}})
	if err != nil {
		tb.Fatal(err)
	}
	return gate, maxSchema(maxAmount)
}

// maxSchema validates that amount is at most its value (0: any).
type maxSchema int

func (m maxSchema) ValidateCall(tool string, _, args json.RawMessage) error {
	var a struct{ Amount float64 }
	if err := json.Unmarshal(args, &a); err != nil {
		return fmt.Errorf("%w: %v", approval.ErrInvalidArgs, err)
	}
	if m > 0 && a.Amount > float64(m) {
		return fmt.Errorf("%w: amount %v is above %d", approval.ErrInvalidArgs, a.Amount, int(m))
	}
	return nil
}

// FuzzClaimUnderPolicyChange (issue 45, point 4): a request is made and
// approved (by one or two approvers, or edited) under one policy, and
// claimed by a lifecycle holding another — deny threshold, quorum
// threshold and schema bound each chosen by the fuzzer. Whatever the
// interleaving, a claim that wins is of arguments the claiming policy
// admits (schema, no deny rule) with as many approvals as it asks; a
// claim that does not win leaves the request refused (for good) or
// pending again (needing more approvals) and never executing.
func FuzzClaimUnderPolicyChange(f *testing.F) {
	f.Add(uint16(300), uint8(1), false, uint16(0), uint16(0), uint16(0), uint16(100), uint16(0), uint16(0))
	f.Add(uint16(300), uint8(1), false, uint16(0), uint16(0), uint16(0), uint16(0), uint16(100), uint16(0))
	f.Add(uint16(300), uint8(1), false, uint16(0), uint16(0), uint16(0), uint16(0), uint16(0), uint16(100))
	f.Add(uint16(300), uint8(2), false, uint16(0), uint16(100), uint16(0), uint16(0), uint16(100), uint16(0))
	f.Add(uint16(64), uint8(1), true, uint16(0), uint16(0), uint16(0), uint16(500), uint16(50), uint16(0))
	f.Add(uint16(900), uint8(2), true, uint16(0), uint16(500), uint16(0), uint16(0), uint16(0), uint16(1000))
	f.Fuzz(func(t *testing.T, amount uint16, approvers uint8, edit bool, deny0, quorum0, max0, deny1, quorum1, max1 uint16) {
		ctx := context.Background()
		clock := clocktest.New(clocktest.Opts{})
		rec, audit := approvaltest.NewRecords(clock.Now), approvaltest.NewAuditor(clock.Now)
		dir := approvaltest.Directory{Everyone: true}
		lifeOf := func(deny, quorum, max uint16) *approval.Lifecycle {
			gate, schemas := judgePolicy(t, int(deny), int(quorum), int(max))
			l, err := approval.NewLifecycle(approval.LifecycleOptions{Records: approvaltest.NewLedger(rec, audit), Gate: gate, Schemas: schemas, Now: clock.Now, Directory: dir})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		decider, claimer := lifeOf(deny0, quorum0, max0), lifeOf(deny1, quorum1, max1)
		args := json.RawMessage(fmt.Sprintf(`{"order_id":"1234","amount":%d}`, amount))
		// Proposed under the first policy: a call it refuses is never a request.
		as, err := decider.Judge(approval.ToolCall{Tool: "issue_refund", Args: args}, nil, "U0ALICE", false)
		if err != nil || as.Denied != nil {
			return
		}
		now := clock.Now()
		r, err := decider.Create(ctx, &approval.Request{ID: approval.NewID("req"), RunID: "run", Requester: "U0ALICE", Tool: "issue_refund", Args: args,
			Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
			Quorum:    max(as.Policy.Quorum, 1), Created: now, Deadline: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		voters := []string{"U0BOB", "U0CAROL", "U0DAVE"}
		for i := 0; i < int(approvers%3)+1 && r.Status == approval.StatusPending; i++ {
			d := approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: voters[i], At: clock.Now(), Digest: r.Digest}
			if edit && i == 0 {
				d.Verdict, d.Args = approval.VerdictEdit, json.RawMessage(fmt.Sprintf(`{"order_id":"1234","amount":%d}`, amount/2+1))
			}
			got, err := decider.Decide(ctx, r, d, approval.DecideOptions{})
			if err != nil {
				return // the edit refused under the first policy: nothing to claim
			}
			r = got
		}
		if r.Status != approval.StatusApproved {
			return
		}
		// Claimed under the second policy, once, and once more after a
		// reopening's remaining approval.
		for round := 0; round < 2; round++ {
			got, err := claimer.ClaimRequest(ctx, r, "agent")
			cur, rerr := rec.Request(ctx, r.ID)
			if rerr != nil {
				t.Fatal(rerr)
			}
			as, jerr := claimer.Judge(approval.ToolCall{Tool: "issue_refund", Args: cur.Args}, nil, "U0ALICE", false)
			switch {
			case err == nil:
				if jerr != nil || as.Denied != nil || len(cur.Approvals) < max(as.Policy.Quorum, 1) {
					t.Fatalf("claimed %s with %d approvals; the policy in force says %v, denied %v, quorum %d", cur.Args, len(cur.Approvals), jerr, as.Denied, as.Policy.Quorum)
				}
				if got.Status != approval.StatusExecuting {
					t.Fatalf("claimed as %s, want executing", got.Status)
				}
				return
			case errors.Is(err, approval.ErrRefused):
				if cur.Status != approval.StatusRefused || (jerr == nil && as.Denied == nil) {
					t.Fatalf("refused (%v), yet the record is %s and the policy in force admits %s", err, cur.Status, cur.Args)
				}
				return
			case errors.Is(err, approval.ErrNeedsApprovals):
				if cur.Status != approval.StatusPending || len(cur.Approvals) >= max(as.Policy.Quorum, 1) || cur.Quorum < as.Policy.Quorum {
					t.Fatalf("needs approvals (%v), yet the record is %s with %d of quorum %d", err, cur.Status, len(cur.Approvals), cur.Quorum)
				}
				// The rest approve, under the first process's lifecycle.
				for i := len(cur.Approvals); cur.Status == approval.StatusPending && i < len(voters); i++ {
					next, err := decider.Decide(ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: voters[i],
						At: clock.Now(), Digest: cur.Digest}, approval.DecideOptions{})
					if errors.Is(err, approval.ErrAlreadyVoted) {
						continue
					}
					if err != nil {
						t.Fatalf("Decide after the reopening = %v", err)
					}
					cur = next
				}
				r = cur
			default:
				t.Fatalf("ClaimRequest = %v", err)
			}
		}
	})
}
