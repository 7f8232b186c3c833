package approval_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// wakingAuditor is an approval.WakingAuditor over the in-memory doubles:
// AppendWake appends, then, when push, pushes the wake-up itself (as the
// store does in the same round trip) and says so.
type wakingAuditor struct {
	*approvaltest.Auditor
	rec  *approvaltest.Records
	push bool
}

func (a *wakingAuditor) AppendWake(ctx context.Context, r approval.Record, id string, st approval.Status) (approval.Entry, bool, error) {
	e, err := a.Append(ctx, r)
	if err != nil || !a.push {
		return e, false, err
	}
	return e, true, a.rec.Wake(ctx, id, st)
}

// TestDecideWakesWithTheAudit: with an Auditor that can push the wake-up
// behind the entry (approval.WakingAuditor), a decision's wake-up goes
// that way, once; when it reports the wake-up not pushed, the lifecycle
// pushes it (Records.Wake), once.
func TestDecideWakesWithTheAudit(t *testing.T) {
	for _, push := range []bool{true, false} {
		clock := clocktest.New(clocktest.Opts{})
		rec := approvaltest.NewRecords(clock.Now)
		audit := &wakingAuditor{Auditor: approvaltest.NewAuditor(clock.Now), rec: rec, push: push}
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: rec, Audit: audit, Now: clock.Now})
		if err != nil {
			t.Fatalf("NewLifecycle: %v", err)
		}
		f := lifeFixture{life: life, rec: rec, audit: audit.Auditor, clock: clock}
		r := f.create(t, nil)
		got, err := life.Decide(context.Background(), r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
			Approver: "U0BOB", Digest: r.Digest, At: clock.Now()}, approval.DecideOptions{})
		if err != nil || got.Status != approval.StatusApproved {
			t.Fatalf("push %v: Decide = %v, %v; want approved", push, got, err)
		}
		if woken := rec.Woken(r.ID); !slices.Equal(woken, []approval.Status{approval.StatusApproved}) {
			t.Errorf("push %v: wake-ups = %v, want one, approved", push, woken)
		}
		if evs := audit.Events(r.ID); !slices.Contains(evs, approval.EventDecided) {
			t.Errorf("push %v: audit events = %v, want decided", push, evs)
		}
	}
}

// claimingAuditor is an approval.ClaimingAuditor over the in-memory
// doubles: ClaimAppend claims (Records.Claim), then appends r when the
// claim took with the arguments r describes and append is set, as the
// store does in one round trip; cannot: it has no store to claim in.
type claimingAuditor struct {
	*approvaltest.Auditor
	rec    *approvaltest.Records
	append bool
	cannot bool
	calls  int
}

func (a *claimingAuditor) ClaimAppend(ctx context.Context, r approval.Record, id, owner, tokenHash, digest string) (*approval.Request, approval.Entry, bool, error) {
	a.calls++
	if a.cannot {
		return nil, approval.Entry{}, false, approval.ErrCannotClaim
	}
	got, err := a.rec.Claim(ctx, id, owner, tokenHash)
	if err != nil || !a.append || got.Digest != digest {
		return got, approval.Entry{}, false, err
	}
	e, err := a.Append(ctx, r)
	return got, e, err == nil, nil
}

// TestClaimRequestWithTheAudit: a claimant that knows the approved
// request (ClaimRequest) claims through an Auditor that can claim and
// append together (approval.ClaimingAuditor); whichever way the entry goes
// — with the claim, after it by the lifecycle (not appended with it), or
// the usual way (the auditor cannot claim) — the request is executing
// with exactly one executing entry, built from the request, and its card
// redrawn; a second claim is refused and audits nothing.
func TestClaimRequestWithTheAudit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		append, cannot bool
	}{{name: "appended with the claim", append: true}, {name: "appended after"}, {name: "auditor cannot claim", cannot: true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := clocktest.New(clocktest.Opts{})
			rec := approvaltest.NewRecords(clock.Now)
			audit := &claimingAuditor{Auditor: approvaltest.NewAuditor(clock.Now), rec: rec, append: tc.append, cannot: tc.cannot}
			cards := approvaltest.NewCards()
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: rec, Audit: audit, Cards: cards, Now: clock.Now})
			if err != nil {
				t.Fatalf("NewLifecycle: %v", err)
			}
			f := lifeFixture{life: life, rec: rec, audit: audit.Auditor, clock: clock}
			r := f.create(t, func(r *approval.Request) { r.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736" })
			approved, err := life.Decide(ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
				Approver: "U0BOB", Digest: r.Digest, At: clock.Now()}, approval.DecideOptions{})
			if err != nil || approved.Status != approval.StatusApproved {
				t.Fatalf("Decide = %v, %v; want approved", approved, err)
			}
			redraws := cards.Refreshed(r.ID)
			got, err := life.ClaimRequest(ctx, approved, "agent")
			if err != nil || got.Status != approval.StatusExecuting {
				t.Fatalf("ClaimRequest = %v, %v; want executing", got, err)
			}
			if audit.calls != 1 {
				t.Errorf("ClaimAppend called %d times, want 1", audit.calls)
			}
			var executing []approval.Entry
			for _, e := range audit.Entries() {
				if e.RequestID == r.ID && e.Event == approval.EventExecuting {
					executing = append(executing, e)
				}
			}
			if len(executing) != 1 || executing[0].Actor != "agent" || executing[0].RunID != r.RunID || executing[0].TraceID != r.TraceID {
				t.Errorf("executing entries = %+v, want one by agent for run %s with trace %s", executing, r.RunID, r.TraceID)
			}
			if cards.Refreshed(r.ID) != redraws+1 {
				t.Errorf("card redrawn %d times after the claim, want once", cards.Refreshed(r.ID)-redraws)
			}
			if _, err := life.ClaimRequest(ctx, approved, "another"); !errors.Is(err, approval.ErrAlreadyClaimed) {
				t.Errorf("second ClaimRequest = %v, want ErrAlreadyClaimed", err)
			}
			if evs := audit.Events(r.ID); count(evs, approval.EventExecuting) != 1 {
				t.Errorf("audit events after the second claim = %v, want one executing", evs)
			}
		})
	}
}

func count[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
