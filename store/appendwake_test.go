package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestAppendWake: the wake-up of a final request rides in the same round
// trip as the audit entry it must follow (Audit.AppendWake), and is pushed
// only once that entry is in the stream: when another process's entry
// moved the chain head first, nothing is woken before the entry is
// written on the retry. Where it cannot ride (no store to wake, a WAIT to
// follow, a Cluster: the stream and the request are in different slots),
// it is left to the caller.
func TestAppendWake(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		opts     store.Options
		noWakes  bool // the audit is given no store to wake
		other    bool // another process appends before the first attempt
		wantWoke bool
	}{
		{name: "alone", wantWoke: true},
		{name: "another entry first", other: true, wantWoke: true},
		{name: "no store to wake", noWakes: true},
		{name: "a WAIT must follow", opts: store.Options{WaitReplicas: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustStore(t, tc.opts)
			stream := f.prefix + ":{audit}"
			opts := store.AuditOptions{Stream: stream, Wakes: f.s}
			if tc.noWakes {
				opts.Wakes = nil
			}
			a := store.NewAudit(f.rdb, opts)
			if _, cluster := f.rdb.(*redis.ClusterClient); cluster {
				tc.wantWoke = false
			}
			// A first one loads the scripts: in a pipeline they go by
			// their SHA only, and the first after a (test) Redis started
			// falls back to two round trips.
			warm := f.mustCreate(t, nil)
			if _, err := f.s.RecordDecision(ctx, decision(warm, approval.VerdictReject, "U_APP")); err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.AppendWake(ctx, approval.Record{Event: approval.EventDecided, RequestID: warm.ID}, warm.ID, approval.StatusRejected); err != nil {
				t.Fatal(err)
			}
			r := f.mustCreate(t, nil)
			got, err := f.s.RecordDecision(ctx, decision(r, approval.VerdictApprove, "U_APP"))
			if err != nil || got.Status != approval.StatusApproved {
				t.Fatalf("RecordDecision = %v, %v; want approved", got, err)
			}
			wake := store.WakeKey(f.s, r.ID)
			if tc.other {
				other := store.NewAudit(f.rdb, store.AuditOptions{Stream: stream})
				attempts := 0
				store.SetAppendHook(a, func(attempt int) {
					attempts = attempt
					if attempt == 1 {
						if _, err := other.Append(ctx, approval.Record{Event: approval.EventExecuted, Actor: "other"}); err != nil {
							t.Errorf("the other process's Append = %v", err)
						}
						return
					}
					if n, err := f.rdb.Exists(ctx, wake).Result(); err != nil || n != 0 {
						t.Errorf("before attempt %d: wake list exists = %d, %v; want none before the entry is written", attempt, n, err)
					}
				})
				defer func() {
					if attempts < 2 {
						t.Errorf("AppendWake made %d attempts, want a retry after the other process's entry", attempts)
					}
				}()
			}
			rec := approval.Record{Event: approval.EventDecided, RequestID: r.ID, RunID: r.RunID, Actor: "U_APP", Tool: r.Tool}
			e, woke, err := a.AppendWake(ctx, rec, r.ID, got.Status)
			if err != nil || woke != tc.wantWoke {
				t.Fatalf("AppendWake = %v, %v; want woke %v, no error", woke, err, tc.wantWoke)
			}
			n, err := f.rdb.Exists(ctx, wake).Result()
			if err != nil || (n == 1) != tc.wantWoke {
				t.Errorf("wake list exists = %d, %v; want %v", n, err, tc.wantWoke)
			}
			es, err := a.Range(ctx, "", 100)
			if err != nil || len(es) == 0 || es[len(es)-1].Seq != e.Seq || es[len(es)-1].Event != approval.EventDecided {
				t.Fatalf("stream = %d entries, %v; want the decided entry (seq %d) last", len(es), err, e.Seq)
			}
			if _, err := a.Verify(ctx); err != nil {
				t.Errorf("Verify = %v", err)
			}
			if !tc.wantWoke {
				return
			}
			// Woken: a waiter finds the decision at once.
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if w, err := f.s.Wait(wctx, r.ID); err != nil || w.Status != approval.StatusApproved {
				t.Errorf("Wait = %v, %v; want approved", w, err)
			}
		})
	}
}
