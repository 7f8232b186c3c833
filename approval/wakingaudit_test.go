package approval_test

import (
	"context"
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
