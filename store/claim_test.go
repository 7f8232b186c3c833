package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// nopAudit takes audit entries and keeps none.
type nopAudit struct{}

func (nopAudit) Append(context.Context, approval.Record) (approval.Entry, error) {
	return approval.Entry{}, nil
}

// mustLifecycle is the lifecycle owner over f's store, with f's clock.
func (f fixture) mustLifecycle(tb testing.TB) *approval.Lifecycle {
	tb.Helper()
	l, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(f.s, nopAudit{}), Now: f.clock.Now, Gate: refundGate(tb)})
	if err != nil {
		tb.Fatalf("NewLifecycle: %v", err)
	}
	return l
}

// claimArgs are the arguments of the claimed requests of these tests.
const claimArgs = `{"amount":12.50,"tags":[],"note":"café <b>&"}`

// approvedExternal creates an API caller's request and approves it
// through the lifecycle.
func (f fixture) approvedExternal(tb testing.TB, l *approval.Lifecycle) *approval.Request {
	tb.Helper()
	ctx := context.Background()
	r := request(tb, func(r *approval.Request) {
		r.Caller = approval.Caller{Kind: approval.CallerAPI, Name: "k"}
		// Arguments the claim's judgement can read (testArgs' 1e400 is
		// byte-exact JSON no gate decodes: never proposed, never approved).
		r.Args = json.RawMessage(claimArgs)
	})
	if _, err := l.Create(ctx, r); err != nil {
		tb.Fatalf("Create: %v", err)
	}
	cur, err := f.s.Request(ctx, r.ID)
	if err != nil {
		tb.Fatal(err)
	}
	after, err := l.Decide(ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U1", At: f.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{})
	if err != nil || after.Status != approval.StatusApproved {
		tb.Fatalf("Decide = %v, %v; want approved", after, err)
	}
	return after
}

// TestClaimTokenOnce: of twenty concurrent token claims exactly one wins
// and gets a token; the record keeps only its SHA-256; every loser gets
// the winner's state (executing, then executed with its result), never a
// token. Only the winner's token finishes the request.
func TestClaimTokenOnce(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	l := f.mustLifecycle(t)
	r := f.approvedExternal(t, l)

	const claimers = 20
	tokens := make([]string, claimers)
	states := make([]*approval.Request, claimers)
	errs := make([]error, claimers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Go(func() {
			<-start
			states[i], tokens[i], errs[i] = l.ClaimToken(ctx, r.ID, fmt.Sprintf("api:k%d", i))
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range claimers {
		switch {
		case errs[i] == nil && winner >= 0:
			t.Fatalf("ClaimToken %d and %d both won", winner, i)
		case errs[i] == nil:
			winner = i
			if !strings.HasPrefix(tokens[i], "cst_") || len(tokens[i]) < 60 {
				t.Errorf("token = %q, want cst_ and 32 random bytes", tokens[i])
			}
		case !errors.Is(errs[i], approval.ErrAlreadyClaimed) || tokens[i] != "" || states[i] == nil || states[i].Status != approval.StatusExecuting:
			t.Errorf("ClaimToken %d = %+v, %q, %v; want the executing record, no token, ErrAlreadyClaimed", i, states[i], tokens[i], errs[i])
		}
	}
	if winner < 0 {
		t.Fatal("no claim won")
	}
	token := tokens[winner]
	raw, err := f.rdb.HGetAll(ctx, f.prefix+":req:{"+r.ID+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range raw {
		if strings.Contains(v, token) {
			t.Errorf("record field %s holds the token itself", k)
		}
	}
	if got := raw["claim_token"]; got != approval.HashClaimToken(token) {
		t.Errorf("claim_token = %q, want the token's SHA-256", got)
	}

	if _, err := l.FinishClaim(ctx, r.ID, "cst_wrong", "api:k", approval.Outcome{Status: approval.StatusExecuted}); !errors.Is(err, approval.ErrClaimToken) {
		t.Errorf("FinishClaim(wrong token) = %v, want ErrClaimToken", err)
	}
	done, err := l.FinishClaim(ctx, r.ID, token, "api:k", approval.Outcome{Status: approval.StatusExecuted, Result: "refunded"})
	if err != nil || done.Status != approval.StatusExecuted || done.Result != "refunded" {
		t.Fatalf("FinishClaim = %+v, %v; want executed", done, err)
	}
	again, err := l.FinishClaim(ctx, r.ID, token, "api:k", approval.Outcome{Status: approval.StatusFailed})
	if !errors.Is(err, approval.ErrAlreadyClaimed) || again == nil || again.Result != "refunded" {
		t.Errorf("second FinishClaim = %+v, %v; want ErrAlreadyClaimed with the first outcome", again, err)
	}
	late, tok, err := l.ClaimToken(ctx, r.ID, "api:late")
	if !errors.Is(err, approval.ErrAlreadyClaimed) || tok != "" || late == nil || late.Status != approval.StatusExecuted || late.Result != "refunded" {
		t.Errorf("ClaimToken after the outcome = %+v, %q, %v; want the executed record with its result", late, tok, err)
	}
}

// TestFinishClaimRefusals: an outcome without the claim is refused by
// what the request is: approved and unclaimed, claimed by the agent
// (no token), pending.
func TestFinishClaimRefusals(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	l := f.mustLifecycle(t)
	r := f.approvedExternal(t, l)
	if _, err := l.FinishClaim(ctx, r.ID, "cst_x", "api:k", approval.Outcome{Status: approval.StatusExecuted}); !errors.Is(err, approval.ErrNotClaimed) {
		t.Errorf("FinishClaim(unclaimed) = %v, want ErrNotClaimed", err)
	}
	if _, err := l.Claim(ctx, r.ID, "agent"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.FinishClaim(ctx, r.ID, "", "api:k", approval.Outcome{Status: approval.StatusExecuted}); !errors.Is(err, approval.ErrClaimToken) {
		t.Errorf("FinishClaim(claimed without a token, empty token) = %v, want ErrClaimToken", err)
	}
	p := f.mustCreate(t, nil)
	if _, err := l.FinishClaim(ctx, p.ID, "cst_x", "api:k", approval.Outcome{Status: approval.StatusExecuted}); !errors.Is(err, approval.ErrNotApproved) {
		t.Errorf("FinishClaim(pending) = %v, want ErrNotApproved", err)
	}
}

// TestAbandonRacesClaim: a claim and the claim window's end race on one
// script each: whichever runs first wins, the other is refused, and two
// sweepers abandon a request once.
func TestAbandonRacesClaim(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	l := f.mustLifecycle(t)
	claimed := f.approvedExternal(t, l)
	left := f.approvedExternal(t, l)
	if _, _, err := l.ClaimToken(ctx, claimed.ID, "api:k"); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(approval.DefaultClaimWindow + time.Second)
	second := mustStoreOn(t, f.rdb, f.prefix, store.Options{Now: f.clock.Now})
	l2 := second.mustLifecycle(t)
	var n1, n2 int
	var e1, e2 error
	var wg sync.WaitGroup
	wg.Go(func() { n1, e1 = l.ExpireDue(ctx) })
	wg.Go(func() { n2, e2 = l2.ExpireDue(ctx) })
	wg.Wait()
	if e1 != nil || e2 != nil || n1+n2 != 1 {
		t.Fatalf("two sweeps = %d (%v) + %d (%v), want one abandon in all", n1, e1, n2, e2)
	}
	if got, _ := f.s.Request(ctx, claimed.ID); got.Status != approval.StatusExecuting {
		t.Errorf("claimed request = %s, want still executing", got.Status)
	}
	got, _ := f.s.Request(ctx, left.ID)
	if got.Status != approval.StatusAbandoned {
		t.Fatalf("unclaimed request = %s, want abandoned", got.Status)
	}
	if _, _, err := l.ClaimToken(ctx, left.ID, "api:k"); !errors.Is(err, approval.ErrAbandoned) {
		t.Errorf("ClaimToken(abandoned) = %v, want ErrAbandoned", err)
	}
	if n, _ := f.rdb.ZCard(ctx, f.prefix+":claims").Result(); n != 0 {
		t.Errorf("claim-window index holds %d entries after the sweep, want 0", n)
	}
}

// TestDecisionIndexesClaimWindow: an approval of a request with a claim
// window indexes it by the window's end (the decision's time plus the
// window) in the decision's own round trip on a single node (decideScript,
// from the record's claim_ms); a record written before claim_ms existed,
// and a Cluster (the index is in another slot), get the same entry from
// Store.awaitClaim after the script. A rejection, and an approval short of
// its quorum, index nothing.
func TestDecisionIndexesClaimWindow(t *testing.T) {
	ctx := context.Background()
	const window = 5 * time.Minute
	for _, tc := range []struct {
		name      string
		old       bool // the record has no claim_ms (written by an older version)
		verdict   approval.Verdict
		quorum    int
		wantIndex bool
	}{
		{name: "approved", verdict: approval.VerdictApprove, wantIndex: true},
		{name: "approved, an older record", old: true, verdict: approval.VerdictApprove, wantIndex: true},
		{name: "rejected", verdict: approval.VerdictReject},
		{name: "one of two approvals", verdict: approval.VerdictApprove, quorum: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustStore(t, store.Options{})
			trips := &storetest.TripCounter{}
			f.rdb.AddHook(trips)
			r := f.mustCreate(t, func(r *approval.Request) {
				r.ClaimWindow = window
				if tc.quorum > 0 {
					r.Quorum = tc.quorum
				}
			})
			if tc.old {
				if err := f.rdb.HDel(ctx, f.prefix+":req:{"+r.ID+"}", "claim_ms").Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Loads the script (the first run of a script is two round trips).
			warm := f.mustCreate(t, nil)
			if _, err := f.s.RecordDecision(ctx, decision(warm, approval.VerdictReject, "U_APP")); err != nil {
				t.Fatal(err)
			}
			d := decision(r, tc.verdict, "U_APP")
			before := trips.N.Load()
			if _, err := f.s.RecordDecision(ctx, d); err != nil {
				t.Fatalf("RecordDecision = %v", err)
			}
			took := trips.N.Load() - before
			score, err := f.rdb.ZScore(ctx, f.prefix+":claims", r.ID).Result()
			switch {
			case !tc.wantIndex:
				if !errors.Is(err, redis.Nil) {
					t.Errorf("claim-window index has %s (%v, %v), want nothing", r.ID, score, err)
				}
			case err != nil || int64(score) != d.At.Add(window).UnixMilli():
				t.Errorf("claim-window index score = %v, %v; want %d (the decision's time plus the window)", score, err, d.At.Add(window).UnixMilli())
			}
			_, cluster := f.rdb.(*redis.ClusterClient)
			if want := int64(1); tc.wantIndex && !tc.old && !cluster && took != want {
				t.Errorf("RecordDecision took %d round trips, want %d: the index written by the script", took, want)
			}
		})
	}
}

// TestClaimNotConfirmedIsWithdrawn: with WaitReplicas and no replica to
// confirm it (the Redis here has none), a claim that took on the primary
// is withdrawn, not won: refused with approval.ErrClaimNotConfirmed and no
// token, the request approved again with no claimant, nothing audited as
// executing — by every claim path (a token claim, and the agent's claim
// of a request it read, which otherwise rides with its audit entry). The
// request may then be claimed, once, by a process whose claims are
// confirmed; a later unconfirmed claim is refused as already claimed.
// On a Cluster, where WaitReplicas is ignored, the claim simply wins.
func TestClaimNotConfirmedIsWithdrawn(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	l := f.mustLifecycle(t)
	g := mustStoreOn(t, f.rdb, f.prefix, store.Options{WaitReplicas: 1, WaitReplicasTimeout: time.Millisecond, Now: f.clock.Now})
	stream := f.prefix + ":{audit}"
	audit := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream, Wakes: g.s})
	gl, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(g.s, audit), Now: f.clock.Now, Gate: refundGate(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, cluster := f.rdb.(*redis.ClusterClient)
	claims := []struct {
		name  string
		claim func(r *approval.Request) (string, error)
	}{
		{"ClaimToken", func(r *approval.Request) (string, error) {
			_, token, err := gl.ClaimToken(ctx, r.ID, "api:k")
			return token, err
		}},
		{"ClaimRequest", func(r *approval.Request) (string, error) {
			_, err := gl.ClaimRequest(ctx, r, "proc-a")
			return "", err
		}},
	}
	for _, tc := range claims {
		t.Run(tc.name, func(t *testing.T) {
			r := f.approvedExternal(t, l)
			token, err := tc.claim(r)
			if cluster {
				if err != nil {
					t.Fatalf("claim on a Cluster = %v; want it won (WaitReplicas is ignored there)", err)
				}
				return
			}
			if !errors.Is(err, approval.ErrClaimNotConfirmed) || token != "" {
				t.Fatalf("claim with no replica to confirm it = %q, %v; want no token and ErrClaimNotConfirmed", token, err)
			}
			cur, err := f.s.Request(ctx, r.ID)
			if err != nil || cur.Status != approval.StatusApproved || cur.ClaimHash != "" {
				t.Fatalf("request after the withdrawn claim = %+v, %v; want approved with no claim token", cur, err)
			}
			if owner, _, err := f.s.Claimant(ctx, r.ID); owner != "" || err != nil {
				t.Errorf("Claimant after the withdrawn claim = %q, %v; want nobody", owner, err)
			}
			entries, err := audit.Range(ctx, "", 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.RequestID == r.ID && e.Event == approval.EventExecuting {
					t.Errorf("audited %s for a claim that was withdrawn: %+v", e.Event, e)
				}
			}
			// Claimed again, confirmed (no WaitReplicas here): it wins once.
			if _, token, err := l.ClaimToken(ctx, r.ID, "api:k2"); err != nil || token == "" {
				t.Fatalf("claim after the withdrawal = %q, %v; want it won", token, err)
			}
			// A refusal needs no confirmation, and the claim that won stays.
			if _, err := tc.claim(r); !errors.Is(err, approval.ErrAlreadyClaimed) {
				t.Errorf("unconfirmed claim of a claimed request = %v; want ErrAlreadyClaimed", err)
			}
			if owner, _, _ := f.s.Claimant(ctx, r.ID); owner != "api:k2" {
				t.Errorf("Claimant = %q; want api:k2, the claim that won", owner)
			}
		})
	}
}

// TestWithdrawOnlyItsOwnClaim: a withdrawal names its claim by op id, so a
// late one cannot undo another process's claim (WithdrawClaim is the
// script claimConfirmed runs).
func TestWithdrawOnlyItsOwnClaim(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	l := f.mustLifecycle(t)
	r := f.approvedExternal(t, l)
	if _, err := f.s.Claim(ctx, r.ID, "proc-b", "", ""); err != nil {
		t.Fatal(err)
	}
	if n, err := store.WithdrawClaim(ctx, f.s, r.ID, "op-of-another-claim"); err != nil || n != 0 {
		t.Fatalf("WithdrawClaim(another op) = %d, %v; want 0, nothing withdrawn", n, err)
	}
	if cur, err := f.s.Request(ctx, r.ID); err != nil || cur.Status != approval.StatusExecuting {
		t.Fatalf("request = %+v, %v; want still executing by proc-b", cur, err)
	}
}
