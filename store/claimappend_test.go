package store_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// executingRec is the executing entry of r, as the lifecycle builds it.
func executingRec(r *approval.Request) approval.Record {
	return approval.Record{Event: approval.EventExecuting, RequestID: r.ID, RunID: r.RunID, Actor: "agent", Tool: r.Tool,
		Data: approval.ExecutingEvent{CallID: r.CallID, Args: r.Args, Gated: true}}
}

// entriesOf counts the stream's entries of event ev about request id.
func entriesOf(t *testing.T, a *store.Audit, id string, ev approval.Event) int {
	t.Helper()
	es, err := a.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatalf("Range: %v", err)
	}
	n := 0
	for _, e := range es {
		if e.RequestID == id && e.Event == ev {
			n++
		}
	}
	return n
}

// TestClaimAppend: a claim and the executing entry it lets start go in
// one round trip (Audit.ClaimAppend), and the entry is written only when
// that very claim took with the arguments it describes: a refused claim
// (claimed already, not approved, or a request whose arguments are no
// longer those the claimant judged: nothing claimed) writes nothing, nor
// does one behind another
// process's entry (the caller then appends it, on the head the reply
// carried). Where one round trip cannot hold both (a Cluster: other
// slots), the claim alone is made; an audit with no store cannot claim.
func TestClaimAppend(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name         string
		prepare      func(t *testing.T, f fixture, r *approval.Request)
		noStore      bool
		digest       string // the digest the claimant knows; "" r's
		other        bool   // another process appends first
		wantErr      error
		wantAppended bool
	}{
		{name: "alone", wantAppended: true},
		{name: "claimed already", wantErr: approval.ErrAlreadyClaimed, prepare: func(t *testing.T, f fixture, r *approval.Request) {
			if _, err := f.s.Claim(ctx, r.ID, "someone else", "", ""); err != nil {
				t.Fatalf("the first Claim = %v", err)
			}
		}},
		{name: "not approved", wantErr: approval.ErrNotApproved},
		{name: "other arguments", digest: "sha256:not-these-arguments", wantErr: approval.ErrStaleArgs},
		{name: "another entry first", other: true},
		{name: "no store", noStore: true, wantErr: store.ErrCannotClaim},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustStore(t, store.Options{})
			trips := &storetest.TripCounter{}
			f.rdb.AddHook(trips)
			stream := f.prefix + ":{audit}"
			opts := store.AuditOptions{Stream: stream, Wakes: f.s}
			if tc.noStore {
				opts.Wakes = nil
			}
			a := store.NewAudit(f.rdb, opts)
			_, cluster := f.rdb.(*redis.ClusterClient)
			if cluster && tc.wantErr == nil {
				tc.wantAppended = false
			}
			// A first claim loads the scripts (a pipeline sends them by
			// SHA only) and tells this audit the chain's head.
			if !tc.noStore {
				warm := f.mustCreate(t, nil)
				if _, err := f.s.RecordDecision(ctx, decision(warm, approval.VerdictApprove, "U_APP")); err != nil {
					t.Fatal(err)
				}
				if _, _, appended, err := a.ClaimAppend(ctx, executingRec(warm), warm.ID, "agent", "", warm.Digest); err != nil {
					t.Fatal(err)
				} else if !appended {
					if _, err := a.Append(ctx, executingRec(warm)); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := f.mustCreate(t, nil)
			if tc.wantErr != approval.ErrNotApproved {
				if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP")); err != nil {
					t.Fatal(err)
				}
			}
			if tc.prepare != nil {
				tc.prepare(t, f, r)
			}
			if tc.other {
				other := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream})
				if _, err := other.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "other"}); err != nil {
					t.Fatalf("the other process's Append = %v", err)
				}
			}
			digest := tc.digest
			if digest == "" {
				digest = r.Digest
			}
			before := trips.N.Load()
			got, e, appended, err := a.ClaimAppend(ctx, executingRec(r), r.ID, "agent", "", digest)
			took := trips.N.Load() - before
			if !errors.Is(err, tc.wantErr) || appended != tc.wantAppended {
				t.Fatalf("ClaimAppend = appended %v, %v; want appended %v, %v", appended, err, tc.wantAppended, tc.wantErr)
			}
			if appended && took != 1 {
				t.Errorf("ClaimAppend took %d round trips, want 1", took)
			}
			if appended && (e.Seq == 0 || e.ID == "" || e.Event != approval.EventExecuting) {
				t.Errorf("ClaimAppend's entry = %+v, want the executing entry as stored", e)
			}
			cur, rerr := f.s.Request(ctx, r.ID)
			if rerr != nil {
				t.Fatal(rerr)
			}
			switch {
			case tc.noStore:
				if cur.Status != approval.StatusApproved {
					t.Errorf("status = %s, want approved: an audit without a store claims nothing", cur.Status)
				}
			case tc.wantErr == nil:
				if got == nil || got.Status != approval.StatusExecuting || cur.Status != approval.StatusExecuting {
					t.Errorf("claimed = %+v (stored %s), want executing", got, cur.Status)
				}
			case got == nil || got.Status != cur.Status:
				t.Errorf("refused claim's record = %+v, want the request as it is (%s)", got, cur.Status)
			}
			want := 0
			if appended {
				want = 1
			}
			if n := entriesOf(t, a, r.ID, approval.EventExecuting); n != want {
				t.Errorf("%d executing entries for the request, want %d", n, want)
			}
			if tc.other {
				// The caller appends it; the audit knows the head the
				// reply carried, so its first attempt writes it (on a
				// Cluster the claim went alone, and told nothing).
				attempts := 0
				store.SetAppendHook(a, func(n int) { attempts = n })
				if _, err := a.Append(ctx, executingRec(r)); err != nil || (attempts != 1 && !cluster) {
					t.Errorf("Append after the other entry = %v in %d attempts, want 1", err, attempts)
				}
			}
			if _, err := a.Verify(ctx); err != nil {
				t.Errorf("Verify = %v", err)
			}
		})
	}
}

// coldAudit is a store and its audit (AuditOptions.Wakes) on a Redis of
// their own, which has loaded no script yet: a fresh server, or one
// restarted (a pipeline sends scripts by SHA only).
func coldAudit(t *testing.T) (fixture, *store.Audit) {
	t.Helper()
	mr, err := store.StartEmbedded() // a server of its own: no other test loaded anything there
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mr.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	f := mustStoreOn(t, rdb, "cold", store.Options{})
	return f, store.NewAudit(rdb, store.AuditOptions{Stream: "cold:{audit}", Wakes: f.s})
}

// racingAudits is n audits of stream over f's store, as n processes
// have: each has learned the head (and the first loaded the scripts); the
// later ones moved it, so most start behind.
func racingAudits(t *testing.T, f fixture, stream string, n int) []*store.Audit {
	t.Helper()
	audits := make([]*store.Audit, n)
	for i := range audits {
		audits[i] = store.NewAudit(f.rdb, store.AuditOptions{Stream: stream, Wakes: f.s})
		if _, err := audits[i].Append(context.Background(), approval.Record{Event: approval.EventExecuted, Actor: "warm"}); err != nil {
			t.Fatal(err)
		}
	}
	return audits
}

// TestClaimAppendScriptsNotLoaded: on a server that has not seen the
// scripts yet (a fresh Redis, or one restarted: a pipeline sends them by
// SHA only), the claim is still made, once, and the entry left to the
// caller; the next claim rides in one round trip.
func TestClaimAppendScriptsNotLoaded(t *testing.T) {
	ctx := context.Background()
	f, a := coldAudit(t)
	for i, wantAppended := range []bool{false, true} {
		r := f.mustCreate(t, nil)
		if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP")); err != nil {
			t.Fatal(err)
		}
		got, _, appended, err := a.ClaimAppend(ctx, executingRec(r), r.ID, "agent", "", r.Digest)
		if err != nil || got.Status != approval.StatusExecuting || appended != wantAppended {
			t.Fatalf("claim %d: ClaimAppend = %v, appended %v, %v; want executing, appended %v", i+1, got, appended, err, wantAppended)
		}
		if !appended {
			if _, err := a.Append(ctx, executingRec(r)); err != nil {
				t.Fatal(err)
			}
		}
		if n := entriesOf(t, a, r.ID, approval.EventExecuting); n != 1 {
			t.Errorf("claim %d: %d executing entries, want 1", i+1, n)
		}
	}
	if _, err := a.Verify(ctx); err != nil {
		t.Errorf("Verify = %v", err)
	}
}

// TestClaimAppendRace: processes racing to claim one approved request
// (each with its own audit, as separate processes have) — one claim wins,
// every other is refused, and the stream holds one executing entry, the
// winner's, on an unbroken chain.
func TestClaimAppendRace(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	stream := f.prefix + ":{audit}"
	r := f.mustCreate(t, nil)
	if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP")); err != nil {
		t.Fatal(err)
	}
	race(t, racingAudits(t, f, stream, 8), r.ID, executingRec(r), approval.ErrAlreadyClaimed,
		func(i int, a *store.Audit) (bool, error) {
			_, _, appended, err := a.ClaimAppend(ctx, executingRec(r), r.ID, "process-"+string(rune('a'+i)), "", r.Digest)
			return appended, err
		})
}

// race runs try in each of audits' processes at once: exactly one must
// succeed (its entry rec appended with it, or by it after, as the
// lifecycle does), every other be refused with refusal and append
// nothing; the stream then holds one entry of rec's event about request
// id, on an unbroken chain.
func race(t *testing.T, audits []*store.Audit, id string, rec approval.Record, refusal error, try func(i int, a *store.Audit) (appended bool, err error)) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	var won, refused atomic.Int64
	start := make(chan struct{})
	for i, a := range audits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			appended, err := try(i, a)
			switch {
			case err == nil:
				won.Add(1)
				if !appended {
					if _, err := a.Append(ctx, rec); err != nil {
						t.Errorf("the winner's Append = %v", err)
					}
				}
			case errors.Is(err, refusal):
				refused.Add(1)
				if appended {
					t.Errorf("a refused process appended its entry")
				}
			default:
				t.Errorf("process %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := int64(len(audits)); won.Load() != 1 || refused.Load() != n-1 {
		t.Errorf("%d won, %d refused; want 1 and %d", won.Load(), refused.Load(), n-1)
	}
	if got := entriesOf(t, audits[0], id, rec.Event); got != 1 {
		t.Errorf("%d %s entries, want 1", got, rec.Event)
	}
	if _, err := audits[0].Verify(ctx); err != nil {
		t.Errorf("Verify = %v", err)
	}
}
