package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// decidedRec is the decided entry of d making r final with status st, as
// the lifecycle builds it.
func decidedRec(r *approval.Request, d approval.Decision, st approval.Status) approval.Record {
	return approval.Record{Event: approval.EventDecided, RequestID: r.ID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool,
		Data: approval.DecidedEvent{Verdict: d.Verdict, Digest: d.Digest, Status: st, Created: r.Created}}
}

// indexed reports whether request id is in the pending index and in the
// deadline index.
func indexed(t *testing.T, f fixture, id string) (pending, deadline bool) {
	t.Helper()
	ctx := context.Background()
	in := func(key string) bool {
		err := f.rdb.ZScore(ctx, key, id).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("ZSCORE %s: %v", key, err)
		}
		return err == nil
	}
	return in(f.prefix + ":pending"), in(f.prefix + ":deadlines")
}

// woken reports whether request id's wake list was pushed.
func woken(t *testing.T, f fixture, id string) bool {
	t.Helper()
	n, err := f.rdb.Exists(context.Background(), f.prefix+":req:{"+id+"}:wake").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestDecideAppendWake: a decision, its decided entry and the wake-up go
// in one round trip (Audit.DecideAppendWake), and the entry is written
// and the wake-up pushed only when that very decision made the request
// final: a stale click, a request decided already, an approval that only
// counts toward a quorum and one past the deadline (which expires the
// request) write no decided entry and wake nobody, and the counted one
// leaves the request in the pending and deadline indexes. Behind another
// process's entry the decision is recorded and the entry left to the
// caller, on the head the reply carried. Where one round trip cannot hold
// all three (a Cluster), the decision alone is recorded; an audit with no
// store records nothing.
func TestDecideAppendWake(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		verdict    approval.Verdict
		edit       func(*approval.Request)
		prepare    func(t *testing.T, f fixture, r *approval.Request)
		digest     string // the digest the clicker saw; "" r's
		other      bool   // another process appends first
		noStore    bool
		wantErr    error
		wantStatus approval.Status // the stored status after
		wantFinal  bool            // the decision made it final (appended, but for other/Cluster)
	}{
		{name: "approve", verdict: approval.VerdictApprove, wantStatus: approval.StatusApproved, wantFinal: true},
		{name: "reject", verdict: approval.VerdictReject, wantStatus: approval.StatusRejected, wantFinal: true},
		{name: "stale click", verdict: approval.VerdictApprove, digest: "sha256:an-older-card", wantErr: approval.ErrStaleArgs,
			wantStatus: approval.StatusPending},
		{name: "decided already", verdict: approval.VerdictApprove, wantErr: approval.ErrAlreadyDecided, wantStatus: approval.StatusRejected,
			prepare: func(t *testing.T, f fixture, r *approval.Request) {
				if _, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictReject, "U_OTHER")); err != nil {
					t.Fatal(err)
				}
				if err := f.s.Wake(ctx, r.ID, approval.StatusRejected); err != nil { // as its lifecycle does
					t.Fatal(err)
				}
			}},
		{name: "counted toward a quorum", verdict: approval.VerdictApprove, edit: func(r *approval.Request) { r.Quorum = 2 },
			wantStatus: approval.StatusPending},
		{name: "past the deadline", verdict: approval.VerdictApprove, edit: func(r *approval.Request) { r.Deadline = t0.Add(time.Second) },
			wantErr: approval.ErrExpired, wantStatus: approval.StatusExpired},
		{name: "another entry first", verdict: approval.VerdictApprove, other: true, wantStatus: approval.StatusApproved},
		{name: "no store", verdict: approval.VerdictApprove, noStore: true, wantErr: store.ErrCannotDecide, wantStatus: approval.StatusPending},
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
			wantAppended := tc.wantFinal && !cluster
			// A first decision loads the scripts (a pipeline sends them by
			// SHA only) and tells this audit the chain's head.
			if !tc.noStore {
				warm := f.mustCreate(t, nil)
				d := decision(warm, approval.VerdictApprove, "U_APP")
				if _, _, appended, _, err := a.DecideAppendWake(ctx, d, decidedRec(warm, d, approval.StatusApproved), approval.StatusApproved, warm.Digest); err != nil {
					t.Fatal(err)
				} else if !appended {
					if _, err := a.Append(ctx, decidedRec(warm, d, approval.StatusApproved)); err != nil {
						t.Fatal(err)
					}
				}
			}
			r := f.mustCreate(t, tc.edit)
			if tc.prepare != nil {
				tc.prepare(t, f, r)
			}
			if tc.other {
				other := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream})
				if _, err := other.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "other"}); err != nil {
					t.Fatalf("the other process's Append = %v", err)
				}
			}
			d := decision(r, tc.verdict, "U_APP")
			if tc.digest != "" {
				d.Digest = tc.digest
			}
			want := approval.StatusApproved
			if tc.verdict == approval.VerdictReject {
				want = approval.StatusRejected
			}
			before := trips.N.Load()
			after, e, appended, woke, err := a.DecideAppendWake(ctx, d, decidedRec(r, d, want), want, r.Digest)
			took := trips.N.Load() - before
			if !errors.Is(err, tc.wantErr) || appended != wantAppended || woke != wantAppended {
				t.Fatalf("DecideAppendWake = appended %v, woke %v, %v; want both %v, %v", appended, woke, err, wantAppended, tc.wantErr)
			}
			if appended && took != 1 {
				t.Errorf("DecideAppendWake took %d round trips, want 1", took)
			}
			if appended && (e.Seq == 0 || e.ID == "" || e.Event != approval.EventDecided) {
				t.Errorf("DecideAppendWake's entry = %+v, want the decided entry as stored", e)
			}
			cur, rerr := f.s.Request(ctx, r.ID)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if cur.Status != tc.wantStatus {
				t.Errorf("stored status = %s, want %s", cur.Status, tc.wantStatus)
			}
			if !tc.noStore && (after == nil || after.Status != cur.Status) {
				t.Errorf("DecideAppendWake's request = %+v, want the request as stored (%s)", after, cur.Status)
			}
			n := entriesOf(t, a, r.ID, approval.EventDecided)
			if appended != (n == 1) || n > 1 {
				t.Errorf("%d decided entries for the request, appended %v", n, appended)
			}
			if got := woken(t, f, r.ID); got != woke && tc.prepare == nil { // prepare's decision was woken
				t.Errorf("wake list pushed = %v, want %v (woke)", got, woke)
			}
			// The caller's part, as the lifecycle does it: the entry of a
			// decision that took (or of the expiry it found) when it was
			// not appended, then the wake-up when none was pushed.
			var de *approval.DecidedError
			if took := err == nil || errors.As(err, &de) && de.Now; took && cur.Status != approval.StatusPending && !woke {
				if !appended {
					// The audit knows the head the reply carried, so its
					// first attempt writes it (on a Cluster the decision
					// went alone, and told nothing).
					attempts := 0
					store.SetAppendHook(a, func(n int) { attempts = n })
					if _, err := a.Append(ctx, decidedRec(r, d, cur.Status)); err != nil || (tc.other && attempts != 1 && !cluster) {
						t.Errorf("the caller's Append = %v in %d attempts, want 1", err, attempts)
					}
				}
				if err := f.s.Wake(ctx, r.ID, cur.Status); err != nil {
					t.Errorf("the caller's Wake = %v", err)
				}
			}
			pending, deadline := indexed(t, f, r.ID)
			if stillPending := cur.Status == approval.StatusPending; pending != stillPending || (deadline != stillPending && !tc.noStore) {
				t.Errorf("in the pending index %v, in the deadline index %v; want both %v (status %s)", pending, deadline, stillPending, cur.Status)
			}
			if _, err := a.Verify(ctx); err != nil {
				t.Errorf("Verify = %v", err)
			}
		})
	}
}

// TestDecideAppendWakeScriptsNotLoaded: on a server that has not seen the
// scripts yet (a fresh Redis, or one restarted: a pipeline sends them by
// SHA only), the decision is still recorded, once, and the entry and
// wake-up left to the caller; the next decision rides in one round trip.
func TestDecideAppendWakeScriptsNotLoaded(t *testing.T) {
	ctx := context.Background()
	f, a := coldAudit(t)
	for i, wantAppended := range []bool{false, true} {
		r := f.mustCreate(t, nil)
		d := decision(r, approval.VerdictApprove, "U_APP")
		rec := decidedRec(r, d, approval.StatusApproved)
		got, _, appended, woke, err := a.DecideAppendWake(ctx, d, rec, approval.StatusApproved, r.Digest)
		if err != nil || got.Status != approval.StatusApproved || appended != wantAppended || woke != wantAppended {
			t.Fatalf("decision %d: DecideAppendWake = %v, appended %v, woke %v, %v; want approved, both %v", i+1, got, appended, woke, err, wantAppended)
		}
		if !appended {
			if _, err := a.Append(ctx, rec); err != nil {
				t.Fatal(err)
			}
		}
		if n := entriesOf(t, a, r.ID, approval.EventDecided); n != 1 {
			t.Errorf("decision %d: %d decided entries, want 1", i+1, n)
		}
		if pending, deadline := indexed(t, f, r.ID); pending || deadline {
			t.Errorf("decision %d: still indexed (pending %v, deadline %v) once approved", i+1, pending, deadline)
		}
	}
	if _, err := a.Verify(ctx); err != nil {
		t.Errorf("Verify = %v", err)
	}
}

// TestDecideAppendWakeRace: approvers in separate processes (each with its
// own audit) click Approve on one request at once — one decision takes,
// every other is refused as decided already, and the stream holds one
// decided entry, the winner's, on an unbroken chain.
func TestDecideAppendWakeRace(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	stream := f.prefix + ":{audit}"
	r := f.mustCreate(t, nil)
	audits := racingAudits(t, f, stream, 8)
	warm := f.mustCreate(t, nil)
	if _, err := f.s.RecordDecision(ctx, decision(warm, approval.VerdictReject, "U_APP")); err != nil {
		t.Fatal(err)
	}
	d := decision(r, approval.VerdictApprove, "U_APP")
	race(t, audits, r.ID, decidedRec(r, d, approval.StatusApproved), approval.ErrAlreadyDecided,
		func(i int, a *store.Audit) (bool, error) {
			d := decision(r, approval.VerdictApprove, fmt.Sprintf("U_APP%d", i))
			_, _, appended, _, err := a.DecideAppendWake(ctx, d, decidedRec(r, d, approval.StatusApproved), approval.StatusApproved, r.Digest)
			return appended, err
		})
}
