package approval_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// TestCardDoors (issue 27, the bot's own writes): binding a card,
// reminding, escalating and revoking a grant each go through the
// lifecycle — recorded once, then audited once (card_posted, reminded,
// escalated, grant_revoked) — so no surface writes request state or
// audits it itself.
func TestCardDoors(t *testing.T) {
	ctx := context.Background()
	f := mustLifecycle(t)
	r := f.create(t, nil)
	card := approval.CardRef{Channel: "G0APPROV", TS: "1.000001"}

	if first, err := f.life.StartCardPost(ctx, r.ID); err != nil || !first {
		t.Fatalf("StartCardPost = %v, %v; want the first attempt", first, err)
	}
	if first, err := f.life.StartCardPost(ctx, r.ID); err != nil || first {
		t.Fatalf("StartCardPost again = %v, %v; want a later attempt", first, err)
	}
	// The poster and a click on the card bind the same message: one entry.
	for range 2 {
		if err := f.life.BindCard(ctx, r, card); err != nil {
			t.Fatalf("BindCard = %v", err)
		}
	}
	if err := f.life.BindCard(ctx, r, approval.CardRef{Channel: "G0APPROV", TS: "2.000002"}); !errors.Is(err, approval.ErrExists) {
		t.Errorf("BindCard(another message) = %v, want ErrExists", err)
	}
	if err := f.life.BindCard(ctx, &approval.Request{ID: "req_missing"}, card); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("BindCard(missing) = %v, want ErrNotFound", err)
	}

	for _, n := range []int{1, 1, 2} {
		if _, err := f.life.ClaimReminder(ctx, r, n); err != nil {
			t.Fatalf("ClaimReminder(%d) = %v", n, err)
		}
	}
	to := approval.Approvers{Users: []string{"U0CAROL"}}
	for i := range 2 {
		esc, ok, err := f.life.Escalate(ctx, r.ID, to, true)
		if err != nil || ok != (i == 0) {
			t.Fatalf("Escalate #%d = %v, %v; want %v", i+1, ok, err, i == 0)
		}
		if len(esc.Approvers.Users) != 1 || esc.Approvers.Users[0] != "U0CAROL" || esc.Escalated == nil {
			t.Errorf("escalated request = %+v, want carol added", esc.Approvers)
		}
	}

	cur, err := f.life.Request(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.life.Decide(ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U0BOB",
		At: f.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	g := &approval.Grant{ID: approval.NewID("grant"), Tool: r.Tool, Requester: r.Requester, GrantedBy: "U0BOB", RequestID: r.ID,
		Created: f.clock.Now(), Expires: f.clock.Now().Add(time.Hour)}
	if err := f.rec.PutGrant(ctx, g); err != nil {
		t.Fatal(err)
	}
	revoked, err := f.life.RevokeGrant(ctx, r, g.ID, "U0CAROL")
	if err != nil || revoked.RevokedBy != "U0CAROL" {
		t.Fatalf("RevokeGrant = %+v, %v; want revoked by carol", revoked, err)
	}
	if active, _ := f.rec.ActiveGrant(ctx, g.Tool, g.Requester, g.Origin); active != nil {
		t.Errorf("grant still active after revoke: %+v", active)
	}
	if _, err := f.life.RevokeGrant(ctx, r, "grant_other", "U0CAROL"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("RevokeGrant(another grant) = %v, want ErrNotFound", err)
	}

	want := []approval.Event{approval.EventRequested, approval.EventCardPosted, approval.EventReminded, approval.EventReminded,
		approval.EventEscalated, approval.EventDecided, approval.EventGrantRevoked}
	if got := f.audit.Events(r.ID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("audit events = %v, want %v", got, want)
	}
}
