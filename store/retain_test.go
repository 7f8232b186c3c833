package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// TestRetention: a record gets its retention TTL once nothing more can
// happen to it, and never while it is pending or approved (waiting to run).
func TestRetention(t *testing.T) {
	ctx := context.Background()
	const retain = 72 * time.Hour
	f := mustStore(t, store.Options{Retain: retain})
	ttl := func(id string) time.Duration {
		t.Helper()
		d, err := f.rdb.TTL(ctx, f.prefix+":req:{"+id+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	retained := func(what, id string) {
		t.Helper()
		if d := ttl(id); d <= retain-time.Minute || d > retain {
			t.Errorf("%s: record TTL = %v, want about %v", what, d, retain)
		}
	}
	kept := func(what, id string) {
		t.Helper()
		if d := ttl(id); d != -1 {
			t.Errorf("%s: record TTL = %v, want none", what, d)
		}
	}

	pending := f.mustCreate(t, nil)
	kept("pending", pending.ID)

	rejected := f.mustCreate(t, nil)
	if _, err := decide(ctx, f.s, decision(rejected, approval.VerdictReject, "U1")); err != nil {
		t.Fatal(err)
	}
	retained("rejected", rejected.ID)

	run := f.mustCreate(t, nil)
	if _, err := decide(ctx, f.s, decision(run, approval.VerdictApprove, "U1")); err != nil {
		t.Fatal(err)
	}
	kept("approved, not yet run", run.ID)
	if _, err := f.s.Claim(ctx, run.ID, "p1", "", ""); err != nil {
		t.Fatal(err)
	}
	kept("executing", run.ID)
	if _, err := f.s.Finish(ctx, run.ID, approval.StatusExecuted, "ok"); err != nil {
		t.Fatal(err)
	}
	retained("executed", run.ID)

	cancelled := f.mustCreate(t, nil)
	if _, err := cancelRequest(ctx, f.s, cancelled.ID, "agent", "run stopped"); err != nil {
		t.Fatal(err)
	}
	retained("cancelled", cancelled.ID)

	expired := f.mustCreate(t, func(r *approval.Request) { r.Deadline = t0.Add(time.Minute) })
	if _, err := expireDue(ctx, f.s, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	retained("expired", expired.ID)

	forever := mustStoreOn(t, f.rdb, f.prefix, store.Options{Retain: -1})
	keep := f.mustCreate(t, nil)
	if _, err := decide(ctx, forever.s, decision(keep, approval.VerdictReject, "U1")); err != nil {
		t.Fatal(err)
	}
	kept("rejected with Retain < 0", keep.ID)
}

// TestFinishOneTrip: the outcome of a run and the finished record's
// retention are one script call, one round trip (the retention was an
// EXPIRE of its own after it), with and without a retention.
func TestFinishOneTrip(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		retain time.Duration
	}{{"retained", 72 * time.Hour}, {"kept forever", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustStore(t, store.Options{Retain: tc.retain})
			trips := &storetest.TripCounter{}
			f.rdb.AddHook(trips)
			claimed := func() string {
				t.Helper()
				r := f.mustCreate(t, nil)
				if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
					t.Fatal(err)
				}
				if _, err := f.s.Claim(ctx, r.ID, "p1", "", ""); err != nil {
					t.Fatal(err)
				}
				return r.ID
			}
			// Loads the script (the first run of a script is two round trips):
			// on every node of a Cluster, where the next request may live on
			// another node than this one (a fresh Cluster failed here once).
			if _, err := f.s.Finish(ctx, claimed(), approval.StatusExecuted, "ok"); err != nil {
				t.Fatal(err)
			}
			if err := store.FinishScript.Load(ctx, f.rdb).Err(); err != nil {
				t.Fatal(err)
			}
			id := claimed()
			before := trips.N.Load()
			got, err := f.s.Finish(ctx, id, approval.StatusExecuted, "ok")
			if err != nil {
				t.Fatalf("Finish = %v", err)
			}
			if n := trips.N.Load() - before; n != 1 {
				t.Errorf("Finish took %d round trips, want 1", n)
			}
			if got.Status != approval.StatusExecuted {
				t.Errorf("Finish returned status %s, want executed", got.Status)
			}
			ttl, err := f.rdb.PTTL(ctx, f.prefix+":req:{"+id+"}").Result()
			switch {
			case err != nil:
				t.Fatal(err)
			case tc.retain < 0 && ttl != -1:
				t.Errorf("record TTL = %v, want none", ttl)
			case tc.retain > 0 && (ttl <= tc.retain-time.Minute || ttl > tc.retain):
				t.Errorf("record TTL = %v, want about %v", ttl, tc.retain)
			}
		})
	}
}
