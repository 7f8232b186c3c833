package store_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestClaimReminderOncePerNumber: two stores on one Redis (two processes)
// race for each reminder number; exactly one wins each time, a number is
// never claimed twice, and a lower number after a higher one is refused.
func TestClaimReminderOncePerNumber(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	g := mustStoreOn(t, f.rdb, f.prefix, store.Options{})
	r := f.mustCreate(t, nil)

	for n := 1; n <= 3; n++ {
		var wins int
		var mu sync.Mutex // guards wins
		var wg sync.WaitGroup
		for _, s := range []*store.Store{f.s, g.s, f.s, g.s} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.ClaimReminder(ctx, r.ID, n, t0.Add(time.Duration(n)*time.Minute))
				if err != nil {
					t.Errorf("ClaimReminder(%d) = %v", n, err)
				}
				if ok {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Errorf("reminder %d claimed %d times, want 1", n, wins)
		}
	}
	if ok, err := g.s.ClaimReminder(ctx, r.ID, 2, t0.Add(5*time.Minute)); err != nil || ok {
		t.Errorf("ClaimReminder(2) after 3 = %v, %v; want false, nil", ok, err)
	}
}

func TestClaimReminderRefusals(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})

	tests := []struct {
		name string
		prep func(t *testing.T) string
		n    int
		now  time.Time
		want bool
		err  error
	}{
		{"pending", func(t *testing.T) string { return f.mustCreate(t, nil).ID }, 1, t0.Add(time.Minute), true, nil},
		{"missing", func(*testing.T) string { return "req_missing" }, 1, t0, false, approval.ErrNotFound},
		{"zero", func(t *testing.T) string { return f.mustCreate(t, nil).ID }, 0, t0, false, approval.ErrInvalidArgs},
		{"past deadline", func(t *testing.T) string { return f.mustCreate(t, nil).ID }, 1, t0.Add(time.Hour), false, nil},
		{"decided", func(t *testing.T) string {
			r := f.mustCreate(t, nil)
			if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U_APP")); err != nil {
				t.Fatalf("Decide: %v", err)
			}
			return r.ID
		}, 1, t0.Add(2 * time.Minute), false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.prep(t)
			got, err := f.s.ClaimReminder(ctx, id, tc.n, tc.now)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Errorf("ClaimReminder(%s, %d) = %v, %v; want %v, %v", id, tc.n, got, err, tc.want, tc.err)
			}
		})
	}
}

// TestEscalateOnce: two processes race to escalate; one wins, the record
// says so, and with widen the escalation target joins the approvers while
// the approvals channel stays admitted.
func TestEscalateOnce(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	g := mustStoreOn(t, f.rdb, f.prefix, store.Options{})
	r := f.mustCreate(t, nil) // no approvers named: approvals channel members
	to := approval.Approvers{Users: []string{"U_BOSS"}, Usergroups: []string{"S_LEADS"}}
	at := t0.Add(30 * time.Minute)

	var wins int
	var mu sync.Mutex // guards wins
	var wg sync.WaitGroup
	for _, s := range []*store.Store{f.s, g.s, f.s, g.s} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, ok, err := s.Escalate(ctx, r.ID, to, true, at)
			if err != nil {
				t.Errorf("Escalate = %v", err)
				return
			}
			if got == nil || got.Escalated == nil {
				t.Errorf("Escalate returned %+v, want an escalated request", got)
			}
			if ok {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("escalated %d times, want 1", wins)
	}
	got, err := g.s.Request(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e := got.Escalated; e == nil || !e.At.Equal(at) || !e.Widened || !slices.Equal(e.To.Users, to.Users) {
		t.Errorf("Escalated = %+v, want at %v to %v widened", got.Escalated, at, to)
	}
	ap := got.Approvers
	if !slices.Equal(ap.Users, []string{"U_BOSS"}) || !slices.Equal(ap.Usergroups, []string{"S_LEADS"}) || !ap.ChannelMembers {
		t.Errorf("Approvers = %+v, want U_BOSS, S_LEADS and the approvals channel", ap)
	}
	if string(got.Args) != testArgs || got.Digest != r.Digest || got.Status != approval.StatusPending {
		t.Errorf("escalation changed the request: args %s digest %s status %s", got.Args, got.Digest, got.Status)
	}
	// The widened approver may now decide.
	if err := approval.Authorize(got, "U_BOSS", nil, nil); err != nil {
		t.Errorf("Authorize(U_BOSS) after widening = %v", err)
	}
	if _, err := decide(ctx, f.s, decision(got, approval.VerdictApprove, "U_BOSS")); err != nil {
		t.Errorf("Decide by U_BOSS = %v", err)
	}
}

func TestEscalateRefusals(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	to := approval.Approvers{Users: []string{"U_BOSS"}}

	t.Run("without widen keeps approvers", func(t *testing.T) {
		r := f.mustCreate(t, func(r *approval.Request) { r.Approvers = approval.Approvers{Users: []string{"U_A"}} })
		got, ok, err := f.s.Escalate(ctx, r.ID, to, false, t0.Add(time.Minute))
		if err != nil || !ok {
			t.Fatalf("Escalate = %v, %v; want true, nil", ok, err)
		}
		if !slices.Equal(got.Approvers.Users, []string{"U_A"}) || got.Approvers.ChannelMembers {
			t.Errorf("Approvers = %+v, want unchanged", got.Approvers)
		}
		if got.Escalated == nil || got.Escalated.Widened {
			t.Errorf("Escalated = %+v, want set, not widened", got.Escalated)
		}
	})
	t.Run("past deadline", func(t *testing.T) {
		r := f.mustCreate(t, nil)
		got, ok, err := f.s.Escalate(ctx, r.ID, to, true, t0.Add(time.Hour))
		if err != nil || ok || got.Escalated != nil {
			t.Errorf("Escalate after deadline = %+v, %v, %v; want unchanged, false, nil", got, ok, err)
		}
	})
	t.Run("decided", func(t *testing.T) {
		r := f.mustCreate(t, nil)
		if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U_APP")); err != nil {
			t.Fatal(err)
		}
		got, ok, err := f.s.Escalate(ctx, r.ID, to, true, t0.Add(2*time.Minute))
		if err != nil || ok || got.Status != approval.StatusRejected {
			t.Errorf("Escalate on rejected = %+v, %v, %v; want it unchanged, false, nil", got, ok, err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, _, err := f.s.Escalate(ctx, "req_missing", to, true, t0); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("Escalate(missing) = %v, want ErrNotFound", err)
		}
	})
}
