package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// retrying returns a client through a proxy to rdb's server with
// go-redis's default retry policy (as cmd/countersign builds it) and a
// short ReadTimeout, so a withheld reply is retried soon.
func retrying(tb testing.TB, rdb redis.UniversalClient) (*redis.Client, *storetest.Proxy) {
	tb.Helper()
	storetest.RequireRealRedis(tb)
	c, ok := rdb.(*redis.Client)
	if !ok {
		tb.Skip("the retry tests proxy one node; REDIS_URL names a Cluster")
	}
	p := storetest.NewProxy(tb, c.Options().Addr)
	o := *c.Options()
	o.Addr = p.Addr()
	o.MaxRetries = 0 // go-redis's default: 3 retries
	o.ReadTimeout = 300 * time.Millisecond
	pc := redis.NewClient(&o)
	tb.Cleanup(func() { _ = pc.Close() })
	return pc, p
}

// TestTransitionsSurviveRetriedScripts: every state transition whose
// script's first reply is lost (the client times out, go-redis runs the
// script again) answers what the first run did — the change it made —
// rather than refusing it as already done, and the record shows one change.
func TestTransitionsSurviveRetriedScripts(t *testing.T) {
	ctx := context.Background()
	type env struct {
		f     fixture
		audit *store.Audit
		p     *storetest.Proxy
	}
	approve := func(tb testing.TB, e env, r *approval.Request, who string) {
		tb.Helper()
		if _, err := decide(ctx, e.f.s, decision(r, approval.VerdictApprove, who)); err != nil {
			tb.Fatalf("Decide(approve %s) = %v", who, err)
		}
	}
	claim := func(tb testing.TB, e env, r *approval.Request) {
		tb.Helper()
		if _, err := e.f.s.Claim(ctx, r.ID, "run_owner", "", ""); err != nil {
			tb.Fatalf("Claim = %v", err)
		}
	}
	tests := []struct {
		name string
		// setup prepares the request (not through the armed proxy).
		setup func(tb testing.TB, e env, r *approval.Request)
		// quorum of the request.
		quorum int
		// call runs the transition with the reply withheld once, and checks
		// its answer.
		call func(tb testing.TB, e env, r *approval.Request)
	}{
		{
			name: "approve decides",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U1"))
				if err != nil || got.Status != approval.StatusApproved || len(got.Approvals) != 1 {
					tb.Fatalf("RecordDecision(approve) = %+v, %v; want approved with one approval", got, err)
				}
			},
		},
		{
			name:   "approve counts toward quorum",
			quorum: 2,
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U1"))
				if err != nil || got.Status != approval.StatusPending || len(got.Approvals) != 1 {
					tb.Fatalf("RecordDecision(approve) = %+v, %v; want pending with one approval", got, err)
				}
			},
		},
		{
			name:   "last approval completes quorum",
			quorum: 2,
			setup:  func(tb testing.TB, e env, r *approval.Request) { approve(tb, e, r, "U1") },
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U2"))
				if err != nil || got.Status != approval.StatusApproved || len(got.Approvals) != 2 {
					tb.Fatalf("RecordDecision(approve U2) = %+v, %v; want approved with two approvals", got, err)
				}
			},
		},
		{
			name: "reject",
			call: func(tb testing.TB, e env, r *approval.Request) {
				d := decision(r, approval.VerdictReject, "U1")
				d.Text = "no"
				got, err := e.f.s.RecordDecision(ctx, d)
				if err != nil || got.Status != approval.StatusRejected {
					tb.Fatalf("RecordDecision(reject) = %+v, %v; want rejected", got, err)
				}
			},
		},
		{
			name: "decision past the deadline expires",
			call: func(tb testing.TB, e env, r *approval.Request) {
				d := decision(r, approval.VerdictApprove, "U1")
				d.At = r.Deadline.Add(time.Second)
				got, err := e.f.s.RecordDecision(ctx, d)
				var de *approval.DecidedError
				if !errors.As(err, &de) || !de.Now || got.Status != approval.StatusExpired {
					tb.Fatalf("RecordDecision(late) = %+v, %v; want expired now (DecidedError.Now)", got, err)
				}
			},
		},
		{
			name: "cancel",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.RecordCancel(ctx, r.ID, "run_test", "stopped")
				if err != nil || got.Status != approval.StatusCancelled {
					tb.Fatalf("RecordCancel = %+v, %v; want cancelled", got, err)
				}
			},
		},
		{
			name: "expiry sweep",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.RecordExpiries(ctx, r.Deadline.Add(time.Second))
				if err != nil || len(got) != 1 || got[0].ID != r.ID {
					tb.Fatalf("RecordExpiries = %v, %v; want [%s]", got, err, r.ID)
				}
			},
		},
		{
			name:  "claim",
			setup: func(tb testing.TB, e env, r *approval.Request) { approve(tb, e, r, "U1") },
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.Claim(ctx, r.ID, "run_owner", "", "")
				if err != nil || got.Status != approval.StatusExecuting {
					tb.Fatalf("Claim = %+v, %v; want executing", got, err)
				}
			},
		},
		{
			name:  "finish",
			setup: func(tb testing.TB, e env, r *approval.Request) { approve(tb, e, r, "U1"); claim(tb, e, r) },
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.Finish(ctx, r.ID, approval.StatusExecuted, "done")
				if err != nil || got.Status != approval.StatusExecuted {
					tb.Fatalf("Finish = %+v, %v; want executed", got, err)
				}
			},
		},
		{
			name: "reminder claimed",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.ClaimReminder(ctx, r.ID, 1, t0.Add(time.Minute))
				if err != nil || !got {
					tb.Fatalf("ClaimReminder(1) = %v, %v; want true", got, err)
				}
			},
		},
		{
			name: "escalation",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, did, err := e.f.s.Escalate(ctx, r.ID, approval.Approvers{Users: []string{"U_BOSS"}}, true, t0.Add(time.Minute))
				if err != nil || !did || got.Escalated == nil {
					tb.Fatalf("Escalate = %+v, %v, %v; want escalated by this call", got, did, err)
				}
			},
		},
		{
			name: "event first seen",
			call: func(tb testing.TB, e env, r *approval.Request) {
				got, err := e.f.s.FirstSeen(ctx, "Ev_"+r.ID, time.Hour)
				if err != nil || !got {
					tb.Fatalf("FirstSeen = %v, %v; want true", got, err)
				}
			},
		},
		{
			name: "audit append",
			call: func(tb testing.TB, e env, r *approval.Request) {
				if _, err := e.audit.Append(ctx, approval.Record{Event: approval.EventDecided, RequestID: r.ID}); err != nil {
					tb.Fatalf("Append = %v", err)
				}
				entries, err := e.audit.Range(ctx, "", 10)
				if err != nil || len(entries) != 1 {
					tb.Fatalf("Range = %d entries, %v; want the one appended", len(entries), err)
				}
				if n, err := e.audit.Verify(ctx); err != nil || n != 1 {
					tb.Fatalf("Verify = %d, %v; want 1, nil", n, err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, prefix := storetest.New(t)
			pc, p := retrying(t, rdb)
			f := mustStoreOn(t, pc, prefix, store.Options{})
			e := env{f: f, p: p, audit: store.NewAudit(pc, store.AuditOptions{Stream: prefix + ":{audit}", Now: f.clock.Now})}
			r := request(t, func(r *approval.Request) { r.Quorum = max(tt.quorum, 1) })
			// Creating is a transition too: its reply is withheld first.
			p.Arm(r.ID)
			if err := f.s.CreateRequest(ctx, r); err != nil {
				t.Fatalf("CreateRequest with its reply lost = %v, want nil", err)
			}
			if p.Withheld() != 1 {
				t.Fatalf("proxy withheld %d create replies, want 1", p.Withheld())
			}
			if tt.setup != nil {
				tt.setup(t, e, r)
			}
			marker := r.ID
			if tt.name == "audit append" {
				marker = prefix + ":{audit}"
			}
			p.Arm(marker)
			tt.call(t, e, r)
			if p.Withheld() != 1 {
				t.Fatalf("proxy withheld %d replies, want 1 (the test did not exercise a retry)", p.Withheld())
			}
		})
	}
}
