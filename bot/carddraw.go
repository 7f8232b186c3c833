package bot

// This file: drawing one card from its record (Bot.drawCard), which the
// card writer (cardwriter.go) serialises, coalesces and retries, and the
// card of a request lost from the store (lostCard, orphanCard).

import (
	"context"
	"errors"
	"reflect"

	"github.com/countersign/countersign/approval"
)

// CardsIdle returns a channel closed once no approval card redraw is asked
// for or in flight (at the time of the call or later). Tests and shutdown
// wait on it.
func (b *Bot) CardsIdle() <-chan struct{} {
	w := b.cards
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idle
}

// Refresh asks for r's card to show the latest durable state of r. It
// returns at once.
func (b *Bot) Refresh(r *approval.Request) { b.cards.refresh(r) }

var _ approval.Cards = (*Bot)(nil)

// drawCard renders request id's card from its durable record (or, when the
// record is gone, from hint as lost: lostCard) and sends it, then tells the task
// thread the first time a request no run owns is final (a run's requests
// are told by the run: Decided). A request with no card bound
// yet has nothing to redraw: Post draws it once bound.
func (b *Bot) drawCard(ctx context.Context, id string, hint *approval.Request) error {
	r, err := b.records.Request(ctx, id)
	switch {
	case errors.Is(err, approval.ErrNotFound):
		if r, err = b.lostCard(ctx, id, hint); err != nil || r == nil {
			return err
		}
	case err != nil:
		return err
	}
	if !r.Card.Bound() {
		if r, err = b.orphanCard(ctx, r); err != nil || !r.Card.Bound() {
			return err
		}
	}
	var read *approval.Request // the record as read, for stillDrawn
	if r.Status != approval.StatusLost {
		c := *r
		read = &c
	}
	if r.Origin.Permalink == "" && r.Origin.Channel != "" && r.Origin.ThreadTS != "" {
		// The record keeps no link to the task thread: every redraw keeps
		// the one the card was posted with (or asks Slack once more).
		if last := b.cards.lastDrawn(id); last != nil && last.Origin.Permalink != "" {
			r.Origin.Permalink = last.Origin.Permalink
		} else {
			r.Origin.Permalink = b.permalink(ctx, r.Origin.Channel, r.Origin.ThreadTS)
		}
	}
	if err := b.updateCard(ctx, r); err != nil {
		return err
	}
	b.cards.drew(r)
	if read != nil && !b.stillDrawn(ctx, read) {
		b.cards.again(id)
	}
	if r.RunID != "" {
		// A run's request is told by the run itself (Decided), before the
		// run goes on: the card writer's pace must not put the decision
		// line after the answer that follows from it.
		return nil
	}
	if line, key := threadLine(r); line != "" && b.firstNote(r.ID, key) {
		if perr := b.tellThread(ctx, r, line); perr != nil {
			b.log.Error("post decision in task thread", "request_id", r.ID, "err", perr)
		}
	}
	return nil
}

// lostCard is what request id's card shows once its record is gone
// (Redis lost its data): the last full copy this process drew, else hint,
// as lost. A lost request's card may never have been bound — the loss came
// between Slack showing the card and its binding, or cut its post short —
// so when the card is not known (hint's, or the one this process posted:
// Post draws it) it is looked for in the approvals channel (its metadata
// names the request, findCard). Nil when no card of it was ever posted, or
// hint is nil (a redraw asked by someone who had no copy: nothing to
// show).
func (b *Bot) lostCard(ctx context.Context, id string, hint *approval.Request) (*approval.Request, error) {
	if hint == nil {
		return nil, nil
	}
	lost := *hint
	if last := b.cards.lastDrawn(id); last != nil {
		lost = *last
		if !lost.Card.Bound() {
			lost.Card = hint.Card
		}
	}
	lost.Status = approval.StatusLost
	if hint.Status != approval.StatusLost && !lost.Card.Bound() {
		return nil, nil // a redraw of a card not yet bound: Post draws it once bound
	}
	if !lost.Card.Bound() {
		ref, found, err := b.findCard(ctx, &lost, "")
		if err != nil || !found {
			return nil, err
		}
		lost.Card = ref
	}
	return &lost, nil
}

// stillDrawn reports whether the card just sent, drawn from read, still
// shows the record. Each process's card writer reads the record right
// before sending, but the sends of two processes (replicas, or a click
// handled by one and the run on another) land at Slack in any order: an
// older state sent last would stay on the card. So a writer reads the
// record again once its send landed, and draws again when the record
// changed since its read. The last send to land is then the latest state,
// or its writer draws again. A read that fails says still drawn: the next
// change redraws the card anyway.
func (b *Bot) stillDrawn(ctx context.Context, read *approval.Request) bool {
	now, err := b.records.Request(ctx, read.ID)
	if err != nil {
		return true
	}
	return reflect.DeepEqual(read, now)
}

// orphanCard finds the card of r, a request that ended (cancelled,
// expired…) while its card was up but not yet bound — its poster stopped
// between chat.postMessage and the bind — and binds it through the
// lifecycle, so the card says how the request ended instead of keeping
// live buttons. It returns r unchanged (unbound) when r is pending, never
// has a card, or none is found in the approvals channel.
func (b *Bot) orphanCard(ctx context.Context, r *approval.Request) (*approval.Request, error) {
	if !r.Status.Decided() || r.Mode == approval.ModeSettled {
		return r, nil
	}
	ref, found, err := b.findCard(ctx, r, "")
	if err != nil || !found {
		return r, err
	}
	if err := b.lifecycle.BindCard(ctx, r, ref); err != nil {
		return r, err
	}
	cur := *r
	cur.Card = ref
	return &cur, nil
}
