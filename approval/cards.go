package approval

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// CardBindings is where a request's card is recorded: which message it is,
// and whether a post of it was ever attempted (store.Store implements it,
// as part of Records). Each method is atomic across processes.
type CardBindings interface {
	// StartCardPost notes an attempt to post request id's card and reports
	// whether it is the first; a later attempt (the poster stopped between
	// posting and binding) must look for the card already posted.
	// ErrNotFound when there is no request.
	StartCardPost(ctx context.Context, id string) (first bool, err error)
	// BindCard records, once, that c is request id's card, and reports
	// whether this call bound it (false: it was bound to c already).
	// ErrExists when it is bound to another message, ErrNotFound when
	// there is no request.
	BindCard(ctx context.Context, id string, c CardRef) (first bool, err error)
}

// Upkeep is the record of what happens to a request around its
// transitions: reminders, escalations, the end of a pre-authorisation
// (store.Store implements it, as part of Records). Each method is atomic
// and happens for one caller across processes.
type Upkeep interface {
	// ClaimReminder reports whether the caller is the one to send reminder
	// n of request id; false for a final request, one past its deadline,
	// or one whose reminder n was claimed already.
	ClaimReminder(ctx context.Context, id string, n int, now time.Time) (bool, error)
	// Escalate marks pending request id escalated to "to" (once) and, with
	// widen, adds "to" to its approvers. It returns the request as stored
	// afterwards and whether this call escalated it.
	Escalate(ctx context.Context, id string, to Approvers, widen bool, now time.Time) (*Request, bool, error)
	// RevokeGrant ends grant grantID of request requestID and returns it
	// as revoked; ErrNotFound when the request has no such grant.
	RevokeGrant(ctx context.Context, requestID, grantID, by string) (*Grant, error)
}

// postCard puts r's card up: the attempt noted (a later attempt, after
// a process stopped between posting and binding, has the card writer look
// for the card already posted), the card posted by the card writer (Slack
// only), then bound here (bindPosted), and the writer told (Posted: the
// waiting note in the task thread); a card found from an earlier attempt
// is redrawn instead (it was drawn from an older copy). It returns r with its card. The card writer
// never calls back: every record write is the lifecycle's.
func (l *Lifecycle) postCard(ctx context.Context, r *Request) (*Request, error) {
	first, err := l.rec.StartCardPost(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("start card post %s: %w", r.ID, err)
	}
	ref, found, err := l.cards.Post(ctx, r, !first)
	if err != nil {
		return nil, err
	}
	if found {
		l.log.InfoContext(ctx, "approval card found unbound after a restart; binding it", "request_id", r.ID, "ts", ref.TS)
	}
	ref, bound, err := l.bindPosted(ctx, r, ref)
	if err != nil {
		return nil, err
	}
	cur := *r
	cur.Card, cur.Rev = ref, 0 // r with its card: no stored revision
	switch {
	case found:
		l.refresh(&cur) // bring what it shows up to date
	case bound != nil && bound.Card == ref:
		l.cards.Posted(ctx, bound) // the record as bound, at its revision
	default:
		l.cards.Posted(ctx, &cur)
	}
	return &cur, nil
}

// bindAttempts bounds the tries to record a posted card's binding through
// a store blip (about 3 s of back-off in all).
const bindAttempts = 5

// bindPosted binds ref, just posted (or found) as r's card, retrying a
// short store blip, and returns where r's card is. A card that cannot be
// bound could never be decided nor redrawn: the card writer deletes it and
// an error is returned (the caller fails closed) — unless r has a card
// already (a click bound one an earlier attempt posted): then ref, a
// second card, is deleted and r's card returned — or unless r's record is
// gone (Redis lost its data between the post and the binding, whether the
// binding saw it or the caller's context ended with the same loss): then
// ref is kept, and an error wrapping ErrNotFound returned. ref is then the
// only card of a request nobody can decide any more, and the run waiting
// on r draws the loss on it (Lose); deleting it would leave the approvers
// a vanished card and nobody told that nothing ran.
//
// bound is the record as read once this call bound it (nil when it did
// not, or could not read it).
func (l *Lifecycle) bindPosted(ctx context.Context, r *Request, ref CardRef) (_ CardRef, bound *Request, _ error) {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		bound, err := l.bindCard(ctx, r, ref)
		if err == nil {
			return ref, bound, nil
		}
		if errors.Is(err, ErrExists) {
			if cur, rerr := l.rec.Request(ctx, r.ID); rerr == nil && cur.Card.Bound() {
				l.log.WarnContext(ctx, "request already has its card; deleting the second one", "request_id", r.ID, "ts", ref.TS, "card_ts", cur.Card.TS)
				l.cards.Delete(context.WithoutCancel(ctx), r, ref)
				return cur.Card, nil, nil
			}
		}
		if ctx.Err() == nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrExists) && attempt < bindAttempts {
			l.log.WarnContext(ctx, "bind approval card; retrying", "request_id", r.ID, "attempt", attempt, "err", err)
			if l.sleep(ctx, backoff) == nil {
				backoff *= 2
				continue
			}
			err = fmt.Errorf("bind card of %s: %w", r.ID, ctx.Err())
		}
		if errors.Is(err, ErrNotFound) || l.vanished(ctx, r.ID) {
			l.log.ErrorContext(ctx, "request gone from the store before its card was bound (Redis lost its data); the card stays to show the loss",
				"request_id", r.ID, "ts", ref.TS, "err", err)
			return CardRef{}, nil, fmt.Errorf("bind card of %s: %w", r.ID, ErrNotFound)
		}
		l.log.ErrorContext(ctx, "approval card not bound; deleting it", "request_id", r.ID, "ts", ref.TS, "attempts", attempt, "err", err)
		l.cards.Delete(context.WithoutCancel(ctx), r, ref)
		return CardRef{}, nil, err
	}
}

// vanished reports whether request id's record is certainly gone from the
// store (ErrNotFound), read on a context that outlives the caller's: a
// caller stopped by the same loss (a run whose lease went with Redis's
// data) must still learn it. Any other answer, an error included, is
// false.
func (l *Lifecycle) vanished(ctx context.Context, id string) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := l.rec.Request(rctx, id)
	return errors.Is(err, ErrNotFound)
}

// BindCard records that c is r's card (atomic and once: the first message
// bound stays the card, and from then on only a click on it decides r),
// audits card_posted the first time, and has the card redrawn when the
// record moved on since r (the copy the card was drawn from). Whoever
// learns first where the card is binds it: the lifecycle when the card
// writer's post is answered (postCard), or a click on the card itself
// when it comes sooner (the bot's bindClicked).
// Refusals: ErrExists (bound to another message), ErrNotFound.
func (l *Lifecycle) BindCard(ctx context.Context, r *Request, c CardRef) error {
	_, err := l.bindCard(ctx, r, c)
	return err
}

// bindCard is BindCard, also returning the record as read once this call
// bound it (nil when it was bound already, or the read failed).
func (l *Lifecycle) bindCard(ctx context.Context, r *Request, c CardRef) (*Request, error) {
	first, err := l.rec.BindCard(ctx, r.ID, c)
	if err != nil {
		return nil, fmt.Errorf("bind card of %s: %w", r.ID, err)
	}
	if !first {
		return nil, nil // bound already, and audited by whoever bound it
	}
	l.append(ctx, r, Record{Event: EventCardPosted, RequestID: r.ID, RunID: r.RunID, Actor: "bot", Tool: r.Tool,
		Data: CardPostedEvent{Channel: c.Channel, TS: c.TS}})
	cur, err := l.rec.Request(ctx, r.ID)
	if err != nil {
		return nil, nil // bound; only the copy for the card writer is missing
	}
	if cur.Status != r.Status {
		l.refresh(cur) // it changed while the card was being posted
	}
	return cur, nil
}

// ClaimReminder claims reminder n of pending request r (once across
// processes) and audits it (reminded). It reports false, having changed
// nothing, when another process sent it or the request moved on. The
// caller posts the reminder in the card's thread after a true.
func (l *Lifecycle) ClaimReminder(ctx context.Context, r *Request, n int) (bool, error) {
	ok, err := l.rec.ClaimReminder(ctx, r.ID, n, l.now())
	if err != nil || !ok {
		return false, err
	}
	l.append(ctx, r, Record{Event: EventReminded, RequestID: r.ID, RunID: r.RunID, Actor: "system", Tool: r.Tool,
		Data: RemindedEvent{N: n, WaitingSince: r.Created, Deadline: r.Deadline}})
	return true, nil
}

// Escalate escalates pending request id to "to" (once across processes;
// with widen they may decide it from then on), audits it (escalated) and
// redraws the card to show it. It returns the request as stored and
// whether this call escalated it; false changed nothing. The caller then
// tells the escalation target in the card's thread.
func (l *Lifecycle) Escalate(ctx context.Context, id string, to Approvers, widen bool) (*Request, bool, error) {
	r, ok, err := l.rec.Escalate(ctx, id, to, widen, l.now())
	if err != nil || !ok {
		return r, false, err
	}
	l.append(ctx, r, Record{Event: EventEscalated, RequestID: r.ID, RunID: r.RunID, Actor: "system", Tool: r.Tool,
		Data: EscalatedEvent{To: r.Escalated.To, Widened: r.Escalated.Widened, Approvers: r.Approvers}})
	l.refresh(r)
	return r, true, nil
}

// RevokeGrant ends r's pre-authorisation grantID early, by whom (the
// caller checked they may), audits it (grant_revoked) and redraws the card
// that granted it. It returns the grant as revoked; ErrNotFound when r has
// no such grant.
func (l *Lifecycle) RevokeGrant(ctx context.Context, r *Request, grantID, by string) (*Grant, error) {
	g, err := l.rec.RevokeGrant(ctx, r.ID, grantID, by)
	if err != nil {
		return nil, err
	}
	l.append(ctx, r, Record{Event: EventGrantRevoked, RequestID: r.ID, RunID: r.RunID, Actor: by, Tool: r.Tool,
		Data: GrantRevokedEvent{GrantID: g.ID, GrantedBy: g.GrantedBy, RevokedBy: g.RevokedBy}})
	cur := *r
	if stored, err := l.rec.Request(ctx, r.ID); err == nil {
		cur = *stored
	}
	cur.Grant = g
	l.refresh(&cur)
	return g, nil
}
