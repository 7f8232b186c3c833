package approval_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
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

// TestCardPosting (issue 27, the walks): the lifecycle puts every card up
// itself — notes the attempt, has the card writer post (Slack only, no
// record written there), binds the card (card_posted once) and only then
// has the task thread told — so the card writer never calls back into
// approval. A second card (a click bound an earlier one meanwhile) is
// taken down and the bound card kept; a card found after a restart is
// bound, not posted again, and redrawn; a card that cannot be posted
// cancels the request.
func TestCardPosting(t *testing.T) {
	ctx := context.Background()
	newWorld := func(t *testing.T) (lifeFixture, *approvaltest.Cards) {
		t.Helper()
		f := mustLifecycle(t)
		cards := approvaltest.NewCards()
		f.life.SetCards(cards)
		return f, cards
	}
	posted := func(f lifeFixture, id string) int {
		n := 0
		for _, ev := range f.audit.Events(id) {
			if ev == approval.EventCardPosted {
				n++
			}
		}
		return n
	}
	t.Run("posted", func(t *testing.T) {
		f, cards := newWorld(t)
		r := f.create(t, nil)
		up := cards.Up(r.ID)
		stored, err := f.rec.Request(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(up) != 1 || r.Card != up[0] || stored.Card != up[0] {
			t.Fatalf("card = %v, stored %v, up %v; want the one card posted, bound", r.Card, stored.Card, up)
		}
		if n, told := posted(f, r.ID), cards.Told(r.ID); n != 1 || told != 1 {
			t.Errorf("card_posted = %d, waiting notes = %d; want 1 and 1", n, told)
		}
	})
	t.Run("a click bound an earlier card", func(t *testing.T) {
		f, cards := newWorld(t)
		earlier := approval.CardRef{Channel: "G0APPROV", TS: "1600000000.000001"}
		cards.OnPost = func(r *approval.Request, _ approval.CardRef) error {
			return f.life.BindCard(ctx, r, earlier) // the click, while this post is answered
		}
		r := f.create(t, nil)
		if r.Card != earlier || r.Status != approval.StatusPending {
			t.Fatalf("request %s on %v, want pending on the card the click bound %v", r.Status, r.Card, earlier)
		}
		if del := cards.Deleted(); len(del) != 1 || del[0] == earlier {
			t.Errorf("deleted %v, want the second card only", del)
		}
		if n := posted(f, r.ID); n != 1 {
			t.Errorf("card_posted = %d, want 1", n)
		}
	})
	t.Run("not posted, then found after a restart", func(t *testing.T) {
		f, cards := newWorld(t)
		stopped := approvaltest.NewCards()
		stopped.OnPost = func(*approval.Request, approval.CardRef) error { return errors.New("process stopped") }
		f.life.SetCards(stopped)
		r := f.create(t, nil)
		if r.Status != approval.StatusCancelled {
			t.Fatalf("a card that cannot be posted left the request %s, want cancelled", r.Status)
		}
		f.life.SetCards(cards) // (SetCards before any transition in production; here between requests)
		r = &approval.Request{ID: approval.NewID("req"), Requester: "U0ALICE", Tool: "issue_refund", Args: []byte(`{}`),
			Decisions: []approval.Verdict{approval.VerdictApprove}, Quorum: 1, Created: f.clock.Now(), Deadline: f.clock.Now().Add(time.Hour)}
		if err := f.rec.CreateRequest(ctx, r); err != nil {
			t.Fatal(err)
		}
		if _, err := f.rec.StartCardPost(ctx, r.ID); err != nil { // the first process noted its attempt,
			t.Fatal(err)
		}
		ref, _, err := cards.Post(ctx, r, false) // posted, and stopped before binding
		if err != nil {
			t.Fatal(err)
		}
		cur := f.life.EnsureCard(ctx, r) // the next process
		if cur.Card != ref || len(cards.Up(r.ID)) != 1 {
			t.Fatalf("bound to %v with %d cards up, want the card already posted %v", cur.Card, len(cards.Up(r.ID)), ref)
		}
		if n, redrawn := posted(f, r.ID), cards.Refreshed(r.ID); n != 1 || redrawn == 0 {
			t.Errorf("card_posted = %d, redraws = %d; want 1 and at least 1", n, redrawn)
		}
	})
}

// ctxRecords is the records with a binding that honours its
// context as the store's does: a poster whose context ended (a run whose
// lease went) gets the context's error, not an answer.
type ctxRecords struct{ *approvaltest.Ledger }

func (c ctxRecords) BindCard(ctx context.Context, id string, ref approval.CardRef) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("bind card %s: %w", id, err)
	}
	return c.Ledger.BindCard(ctx, id, ref)
}

// TestCardOfAVanishedRequestStays (issue 46, point 5): when the store
// loses a request while its card goes up (Redis restarted without its
// data), the card already on screen is kept — it is the only card of a
// request nobody can decide any more, and the run waiting on it draws the
// loss there (Lose) — whether the binding itself finds the record gone or
// the poster's context ended with the same loss; nothing is cancelled
// (there is nothing left to cancel). A card that cannot be bound while its
// request is still stored is still taken down (a poster stopping at
// shutdown: the request stays pending for a later process).
func TestCardOfAVanishedRequestStays(t *testing.T) {
	tests := []struct {
		name string
		// lose runs inside Post, once the card is up and before the
		// binding; nil: the request is lost before the post starts.
		lose    func(f lifeFixture, stop context.CancelFunc, id string)
		up      int // cards left on screen
		deleted int
	}{
		{"lost before the post", nil, 0, 0},
		{"lost between Slack's answer and the binding", func(f lifeFixture, _ context.CancelFunc, id string) { f.rec.Forget(id) }, 1, 0},
		{"lost, and the poster stopped with it", func(f lifeFixture, stop context.CancelFunc, id string) { f.rec.Forget(id); stop() }, 1, 0},
		{"poster stopped, request still stored", func(_ lifeFixture, stop context.CancelFunc, _ string) { stop() }, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustLifecycle(t)
			r := f.create(t, nil) // no card writer yet: pending, no card
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: ctxRecords{approvaltest.NewLedger(f.rec, f.audit)}, Now: f.clock.Now,
				Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
			if err != nil {
				t.Fatal(err)
			}
			cards := approvaltest.NewCards()
			life.SetCards(cards)
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			if tt.lose == nil {
				f.rec.Forget(r.ID)
			} else {
				cards.OnPost = func(*approval.Request, approval.CardRef) error { tt.lose(f, stop, r.ID); return nil }
			}
			got := life.EnsureCard(ctx, r)
			if n := len(cards.Up(r.ID)); n != tt.up {
				t.Errorf("cards up = %d, want %d", n, tt.up)
			}
			if n := len(cards.Deleted()); n != tt.deleted {
				t.Errorf("cards deleted = %d, want %d", n, tt.deleted)
			}
			if got.Status != approval.StatusPending || got.Card.Bound() {
				t.Errorf("EnsureCard = %s bound to %v, want the request as given (pending, no card)", got.Status, got.Card)
			}
			for _, ev := range f.audit.Events(r.ID) {
				if ev == approval.EventCancelled {
					t.Errorf("audit has %s: nothing was there to cancel", ev)
				}
			}
		})
	}
}
