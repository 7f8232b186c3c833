package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestGrants: a grant lets its scope (tool, requester, task thread) through
// until it expires on the store's clock, and no other scope; a newer grant
// replaces it; revoking stops it, is recorded on the request, and never
// ends a newer grant of the same scope.
func TestGrants(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	thread := approval.Origin{Team: "T1", Channel: "C_TASKS", ThreadTS: "1700000000.000100"}
	r := f.mustCreate(t, func(r *approval.Request) { r.Origin = thread })
	g := &approval.Grant{ID: "grant_1", Tool: "refund", Requester: "U_REQ", Origin: thread, GrantedBy: "U_BOB",
		RequestID: r.ID, Created: f.clock.Now(), Expires: f.clock.Now().Add(time.Hour)}
	if err := f.s.PutGrant(ctx, g); err != nil {
		t.Fatalf("PutGrant = %v", err)
	}
	active := func(tool, requester string, o approval.Origin) *approval.Grant {
		t.Helper()
		got, err := f.s.ActiveGrant(ctx, tool, requester, o)
		if err != nil {
			t.Fatalf("ActiveGrant = %v", err)
		}
		return got
	}
	if got := active("refund", "U_REQ", thread); got == nil || got.ID != "grant_1" || got.GrantedBy != "U_BOB" {
		t.Fatalf("ActiveGrant = %+v, want grant_1", got)
	}
	other := thread
	other.ThreadTS = "1700000000.000200"
	for name, got := range map[string]*approval.Grant{
		"other tool":      active("email", "U_REQ", thread),
		"other requester": active("refund", "U_ALICE", thread),
		"other thread":    active("refund", "U_REQ", other),
	} {
		if got != nil {
			t.Errorf("%s: ActiveGrant = %+v, want none", name, got)
		}
	}
	if rec, _ := f.s.Request(ctx, r.ID); rec.Grant == nil || rec.Grant.ID != "grant_1" {
		t.Errorf("request's grant = %+v, want grant_1 recorded", rec.Grant)
	}
	listed := func() []string {
		t.Helper()
		gs, err := f.s.ActiveGrants(ctx)
		if err != nil {
			t.Fatalf("ActiveGrants = %v", err)
		}
		var ids []string
		for _, g := range gs {
			ids = append(ids, g.ID)
		}
		return ids
	}
	if got := listed(); !slices.Equal(got, []string{"grant_1"}) {
		t.Errorf("ActiveGrants = %v, want [grant_1]", got)
	}

	f.clock.Advance(time.Hour)
	if got := active("refund", "U_REQ", thread); got != nil {
		t.Errorf("ActiveGrant at expiry = %+v, want none", got)
	}
	if got := listed(); len(got) != 0 {
		t.Errorf("ActiveGrants at expiry = %v, want none", got)
	}

	// A newer grant of the same scope replaces the old; revoking the old
	// one leaves the newer in force.
	r2 := f.mustCreate(t, func(r *approval.Request) { r.Origin = thread })
	g2 := *g
	g2.ID, g2.RequestID, g2.Expires = "grant_2", r2.ID, f.clock.Now().Add(time.Hour)
	if err := f.s.PutGrant(ctx, &g2); err != nil {
		t.Fatalf("PutGrant(grant_2) = %v", err)
	}
	// A third request's grant of another scope, then grant_2 replaced by
	// nothing: the list shows each grant in force once.
	other2 := f.mustCreate(t, func(r *approval.Request) { r.Origin = other })
	g4 := g2
	g4.ID, g4.RequestID, g4.Origin = "grant_4", other2.ID, other
	if err := f.s.PutGrant(ctx, &g4); err != nil {
		t.Fatalf("PutGrant(grant_4) = %v", err)
	}
	if got := listed(); !slices.Equal(got, []string{"grant_2", "grant_4"}) && !slices.Equal(got, []string{"grant_4", "grant_2"}) {
		t.Errorf("ActiveGrants = %v, want grant_2 and grant_4", got)
	}
	if _, err := f.s.RevokeGrant(ctx, r.ID, "grant_1", "U_CAROL"); err != nil {
		t.Fatalf("RevokeGrant(grant_1) = %v", err)
	}
	if got := active("refund", "U_REQ", thread); got == nil || got.ID != "grant_2" {
		t.Fatalf("after revoking the old grant, ActiveGrant = %+v, want grant_2", got)
	}
	revoked, err := f.s.RevokeGrant(ctx, r2.ID, "grant_2", "U_CAROL")
	if err != nil || revoked.RevokedBy != "U_CAROL" || !revoked.RevokedAt.Equal(f.clock.Now()) {
		t.Fatalf("RevokeGrant(grant_2) = %+v, %v", revoked, err)
	}
	if got := active("refund", "U_REQ", thread); got != nil {
		t.Errorf("after revoking, ActiveGrant = %+v, want none", got)
	}
	if got := listed(); !slices.Equal(got, []string{"grant_4"}) {
		t.Errorf("ActiveGrants after revoking grant_2 = %v, want [grant_4]", got)
	}
	if rec, _ := f.s.Request(ctx, r2.ID); rec.Grant == nil || rec.Grant.RevokedBy != "U_CAROL" {
		t.Errorf("request's grant = %+v, want revoked by U_CAROL", rec.Grant)
	}
	if again, err := f.s.RevokeGrant(ctx, r2.ID, "grant_2", "U_DAVE"); err != nil || again.RevokedBy != "U_CAROL" {
		t.Errorf("second revoke = %+v, %v; want the first revocation kept", again, err)
	}
	if _, err := f.s.RevokeGrant(ctx, r2.ID, "grant_9", "U_CAROL"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("revoke unknown grant = %v, want ErrNotFound", err)
	}

	// A grant for a request that is gone is withdrawn.
	g3 := g2
	g3.ID, g3.RequestID = "grant_3", "req_missing"
	if err := f.s.PutGrant(ctx, &g3); !errors.Is(err, approval.ErrNotFound) {
		t.Fatalf("PutGrant on a missing request = %v, want ErrNotFound", err)
	}
	if got := active("refund", "U_REQ", thread); got != nil {
		t.Errorf("grant of a missing request left active: %+v", got)
	}
}

// TestUseGrantLimitsUnderRace: 50 goroutines (each its own call) race to
// use one grant; its limits hold exactly: a budget of $100 lets ten $10
// calls through and no more, a limit of three uses three. A call counted
// again (a retried command, a resumed run) is not counted twice. A revoked
// grant lets nothing through.
func TestUseGrantLimitsUnderRace(t *testing.T) {
	for _, tt := range []struct {
		name   string
		limits approval.GrantLimits
		want   int
	}{
		{"budget", approval.GrantLimits{Argument: "amount", MaxTotal: 100}, 10},
		{"uses", approval.GrantLimits{MaxUses: 3}, 3},
		{"both", approval.GrantLimits{MaxUses: 5, Argument: "amount", MaxTotal: 35}, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := mustStore(t, store.Options{})
			thread := approval.Origin{Team: "T1", Channel: "C_TASKS", ThreadTS: "1700000000.000100"}
			r := f.mustCreate(t, func(r *approval.Request) { r.Origin = thread })
			g := &approval.Grant{ID: "grant_" + tt.name, Tool: "refund", Requester: "U_REQ", Origin: thread, GrantedBy: "U_BOB",
				RequestID: r.ID, Created: f.clock.Now(), Expires: f.clock.Now().Add(time.Hour), Limits: tt.limits}
			if err := f.s.PutGrant(ctx, g); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var passed atomic.Int32
			start := make(chan struct{})
			for i := range 50 {
				wg.Add(1)
				go func() { // exits after one UseGrant
					defer wg.Done()
					<-start
					_, ok, err := f.s.UseGrant(ctx, g, fmt.Sprintf("req_%02d", i), 10)
					if err != nil {
						t.Errorf("UseGrant = %v", err)
					}
					if ok {
						passed.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if got := int(passed.Load()); got != tt.want {
				t.Fatalf("calls let through = %d, want %d", got, tt.want)
			}
			cur, err := f.s.ActiveGrant(ctx, "refund", "U_REQ", thread)
			if err != nil || cur == nil {
				t.Fatalf("ActiveGrant = %v, %v", cur, err)
			}
			if len(cur.Uses) != tt.want || cur.Spent != float64(10*tt.want) {
				t.Errorf("grant used %d times for %v, want %d and %d", len(cur.Uses), cur.Spent, tt.want, 10*tt.want)
			}
			// The same call again: answered as counted, not counted twice.
			again, ok, err := f.s.UseGrant(ctx, g, cur.Uses[0], 10)
			if err != nil || !ok || len(again.Uses) != tt.want {
				t.Errorf("UseGrant(same call again) = %+v, %v, %v; want counted once", again, ok, err)
			}
			if rec, _ := f.s.Request(ctx, r.ID); rec.Grant == nil || len(rec.Grant.Uses) != tt.want {
				t.Errorf("granting request's copy = %+v, want the uses shown", rec.Grant)
			}
			if _, err := f.s.RevokeGrant(ctx, r.ID, g.ID, "U_BOB"); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := f.s.UseGrant(ctx, &approval.Grant{ID: g.ID, Tool: "refund", Requester: "U_REQ", Origin: thread}, "req_new", 0); ok || err != nil {
				t.Errorf("UseGrant after revoke = %v, %v; want refused", ok, err)
			}
		})
	}
}
