package approval

import (
	"context"
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

// StartCardPost notes an attempt to post r's card (the card writer calls
// it before posting) and reports whether it is the first. Nothing is
// audited: the attempt is not an event, its binding is (BindCard).
func (l *Lifecycle) StartCardPost(ctx context.Context, id string) (bool, error) {
	first, err := l.rec.StartCardPost(ctx, id)
	if err != nil {
		return false, fmt.Errorf("start card post %s: %w", id, err)
	}
	return first, nil
}

// BindCard records that c is r's card (atomic and once: the first message
// bound stays the card, and from then on only a click on it decides r),
// audits card_posted the first time, and has the card redrawn when the
// record moved on since r (the copy the card was drawn from). Whoever
// learns first where the card is binds it: the card writer when Slack
// answers its post, or a click on the card itself when it comes sooner.
// Refusals: ErrExists (bound to another message), ErrNotFound.
func (l *Lifecycle) BindCard(ctx context.Context, r *Request, c CardRef) error {
	first, err := l.rec.BindCard(ctx, r.ID, c)
	if err != nil {
		return fmt.Errorf("bind card of %s: %w", r.ID, err)
	}
	if !first {
		return nil // bound already, and audited by whoever bound it
	}
	l.append(ctx, r, Record{Event: EventCardPosted, RequestID: r.ID, RunID: r.RunID, Actor: "bot", Tool: r.Tool,
		Data: CardPostedEvent{Channel: c.Channel, TS: c.TS}})
	if cur, err := l.rec.Request(ctx, r.ID); err == nil && cur.Status != r.Status {
		l.refresh(cur) // it changed while the card was being posted
	}
	return nil
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
