package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestRevRaisedByEveryChange: the record's revision (Request.Rev) starts
// at 1 and every change of what a person is shown or judged raises it by
// one, in the script that makes the change — a card bound, a vote, an
// escalation, the decision, a claim, the outcome, feedback, a grant, a
// cancel, an expiry, a refusal and a reopening at the claim — while a
// refusal changes neither the record nor its revision. A decision made on
// a copy at another revision (Decision.Rev) is refused with
// approval.ErrMoved and the record as it is, nothing recorded.
func TestRevRaisedByEveryChange(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	rev := func(id string) int64 {
		t.Helper()
		r, err := f.s.Request(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return r.Rev
	}
	step := func(what string, id string, change func() error) {
		t.Helper()
		before := rev(id)
		if err := change(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := rev(id); got != before+1 {
			t.Errorf("%s: rev %d → %d, want %d", what, before, got, before+1)
		}
	}

	r := f.mustCreate(t, func(r *approval.Request) { r.Quorum = 2 })
	if r.Rev != 1 || rev(r.ID) != 1 {
		t.Fatalf("a new request's rev = %d (stored %d), want 1", r.Rev, rev(r.ID))
	}
	step("BindCard", r.ID, func() error {
		_, err := f.s.BindCard(ctx, r.ID, approval.CardRef{Channel: "C_APPROVALS", TS: "1.000100"})
		return err
	})
	copyAt := rev(r.ID)
	step("a vote short of the quorum", r.ID, func() error {
		_, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP1"))
		return err
	})
	// A vote on the copy read before that vote: moved, nothing counted.
	stale := decision(r, approval.VerdictApprove, "U_APP2")
	stale.Rev = copyAt
	got, err := f.s.RecordDecision(ctx, stale)
	if !errors.Is(err, approval.ErrMoved) || got == nil || got.Rev != copyAt+1 || len(got.Approvals) != 1 {
		t.Fatalf("a vote at rev %d = %+v, %v; want ErrMoved with the record at %d (one approval)", copyAt, got, err, copyAt+1)
	}
	if rev(r.ID) != copyAt+1 {
		t.Errorf("the moved vote changed the revision")
	}
	step("Escalate", r.ID, func() error {
		_, ok, err := f.s.Escalate(ctx, r.ID, approval.Approvers{Users: []string{"U_BOSS"}}, true, t0.Add(time.Minute))
		if err == nil && !ok {
			err = errors.New("not escalated")
		}
		return err
	})
	current := decision(r, approval.VerdictApprove, "U_APP2")
	current.Rev = rev(r.ID)
	step("the vote that completes the quorum, at the current revision", r.ID, func() error {
		_, err := f.s.RecordDecision(ctx, current)
		return err
	})
	if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictReject, "U_APP3")); err == nil {
		t.Fatal("a decision on an approved request was recorded")
	}
	step("Claim", r.ID, func() error {
		_, err := f.s.Claim(ctx, r.ID, "proc-a", "", r.Digest)
		return err
	})
	step("Finish", r.ID, func() error {
		_, err := f.s.Finish(ctx, r.ID, approval.StatusExecuted, "done")
		return err
	})
	step("RecordFeedback", r.ID, func() error {
		_, err := f.s.RecordFeedback(ctx, r.ID, approval.Feedback{Wrong: true, By: "U_APP1", At: t0.Add(time.Hour), Reason: "too much"})
		return err
	})

	g := f.mustCreate(t, nil)
	if _, err := f.s.RecordDecision(ctx, decision(g, approval.VerdictApprove, "U_APP1")); err != nil {
		t.Fatal(err)
	}
	step("PutGrant", g.ID, func() error {
		return f.s.PutGrant(ctx, &approval.Grant{ID: "grt_1", RequestID: g.ID, Tool: "refund", Requester: "U_REQ", GrantedBy: "U_APP1",
			Created: t0, Expires: t0.Add(time.Hour)})
	})
	step("Refuse", g.ID, func() error {
		_, err := f.s.Refuse(ctx, g.ID, g.Digest, "the policy in force refuses it")
		return err
	})

	o := f.mustCreate(t, nil)
	if _, err := f.s.RecordDecision(ctx, decision(o, approval.VerdictApprove, "U_APP1")); err != nil {
		t.Fatal(err)
	}
	step("Reopen", o.ID, func() error {
		_, err := f.s.Reopen(ctx, o.ID, o.Digest, approval.Reopening{Need: 2, Have: 1, Reason: "more", At: t0.Add(time.Minute), Deadline: t0.Add(2 * time.Hour)})
		return err
	})
	step("RecordCancel", o.ID, func() error {
		_, err := f.s.RecordCancel(ctx, o.ID, "countersign", "test")
		return err
	})

	e := f.mustCreate(t, nil)
	a := f.mustCreate(t, func(r *approval.Request) { r.ClaimWindow = 5 * time.Minute })
	if _, err := f.s.RecordDecision(ctx, decision(a, approval.VerdictApprove, "U_APP1")); err != nil {
		t.Fatal(err)
	}
	before := rev(a.ID)
	step("RecordExpiries (an expiry)", e.ID, func() error {
		_, err := f.s.RecordExpiries(ctx, t0.Add(2*time.Hour))
		return err
	})
	if cur, err := f.s.Request(ctx, a.ID); err != nil || cur.Status != approval.StatusAbandoned || cur.Rev != before+1 {
		t.Errorf("the request whose claim window ended = %v at rev %d, %v; want abandoned at %d", cur.Status, cur.Rev, err, before+1)
	}
}
