package agent_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// unconfirmedClaims is a store whose first claims Redis's replicas did
// not confirm (Redis failing over): refused with ErrClaimNotConfirmed,
// withdrawn (the record untouched), as store.Claim does with WaitReplicas.
type unconfirmedClaims struct {
	*store.Ledger
	refuse   atomic.Int32 // claims still to refuse
	attempts atomic.Int32
}

func (u *unconfirmedClaims) Claim(ctx context.Context, id, owner, tokenHash, digest string, p approval.Prepared) (*approval.Request, error) {
	u.attempts.Add(1)
	if u.refuse.Add(-1) >= 0 {
		return nil, fmt.Errorf("claim %s: 0 of 1 replicas within 1s: %w", id, approval.ErrClaimNotConfirmed)
	}
	return u.Ledger.Claim(ctx, id, owner, tokenHash, digest, p)
}

// withRecords builds the process's lifecycle over records made from its
// store.
func withRecords(w *world, wrap func(*store.Ledger) approval.Records) processOption {
	return func(o *agent.Options) {
		n := o.Notifier.(*notifier)
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true},
			Records: wrap(store.NewLedger(o.Requests.(*store.Store), o.Auditor)), Cards: n, Gate: w.gate, Schemas: w.file,
		})
		if err != nil {
			w.tb.Fatalf("NewLifecycle: %v", err)
		}
		o.Lifecycle = life
	}
}

// TestClaimNotConfirmedClaimsAgain: an approved call whose claim Redis's
// replicas did not confirm (withdrawn: nothing may run on it) is not run
// and not told in the task thread; the run backs off, reads the request
// again and claims anew. The tool then runs once, its execution is
// audited once, and the thread hears the decision once.
func TestClaimNotConfirmedClaimsAgain(t *testing.T) {
	w := newWorld(t)
	var recs *unconfirmedClaims
	p := w.start(withRecords(w, func(st *store.Ledger) approval.Records {
		recs = &unconfirmedClaims{Ledger: st}
		recs.refuse.Store(2)
		return recs
	}))
	card := approveRefund(t, w, p)
	if res := recv(t, p.notify.results, "the run result"); res.Status != approval.RunDone {
		t.Fatalf("result = %+v, want done", res)
	}
	if got := recs.attempts.Load(); got != 3 {
		t.Errorf("claims attempted = %d, want 3 (two withdrawn, one won)", got)
	}
	if got := w.sor.count("POST /refunds"); got != 1 {
		t.Errorf("refunds at the system of record = %d, want 1", got)
	}
	if cur, err := w.store.Request(context.Background(), card.ID); err != nil || cur.Status != approval.StatusExecuted {
		t.Errorf("request = %+v, %v; want executed", cur, err)
	}
	es, err := w.audit.Range(context.Background(), "", 10000)
	if err != nil {
		t.Fatal(err)
	}
	executing := 0
	for _, e := range es {
		if e.Event == approval.EventExecuting && e.RequestID == card.ID {
			executing++
		}
	}
	if executing != 1 {
		t.Errorf("executing entries = %d, want 1", executing)
	}
	p.notify.mu.Lock()
	told := 0
	for _, r := range p.notify.decided {
		if r.ID == card.ID && r.Status == approval.StatusApproved {
			told++
		}
	}
	p.notify.mu.Unlock()
	if told != 1 {
		t.Errorf("approval lines in the task thread = %d, want 1", told)
	}
	backoffs := 0
	for _, d := range *p.sleeps {
		if d >= 100*time.Millisecond {
			backoffs++
		}
	}
	if backoffs < 2 {
		t.Errorf("sleeps = %v; want a backoff before each claim again", *p.sleeps)
	}
}
