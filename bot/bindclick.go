package bot

import (
	"context"
	"errors"
	"fmt"

	"github.com/countersign/countersign/approval"
)

// bindClicked binds r's card to the clicked message when r has no card
// bound yet and that message is r's card: in the approvals channel,
// posted by this app, its metadata naming r. Slack may show a card (and
// deliver a click on it) before it answers the chat.postMessage that
// posted it, and a process may stop between posting a card and binding
// it; either way the click binds the card itself (Lifecycle.BindCard,
// atomic and once: the poster's binding of the same message later binds
// nothing), so a click on a real card is never refused for our own
// timing. A card found bound to r while its request is no longer pending
// (cancelled because its poster could not bind it, expired…) is redrawn
// to say so.
//
// Whether the message is r's card is read from the click (the payload is
// Slack's, signed or over Socket Mode: its message carries the metadata
// and bot_id Slack stores) or, when the payload does not include the
// message's metadata, from conversations.history. A click on anything
// else binds nothing and onCard refuses it. It returns r as it now is;
// an error means the check or the binding failed (nothing decided).
func (b *Bot) bindClicked(ctx context.Context, r *approval.Request, ic interaction) (*approval.Request, error) {
	clicked := ic.clickedMessage()
	if r.Card.Bound() || clicked.Channel != b.policy.Slack.ApprovalsChannel || clicked.TS == "" {
		return r, nil
	}
	mine, err := b.clickedCardOf(ctx, r, ic)
	if err != nil {
		return r, fmt.Errorf("check the clicked card of %s: %w", r.ID, err)
	}
	if !mine {
		return r, nil
	}
	err = b.lifecycle.BindCard(ctx, r, clicked)
	switch {
	case errors.Is(err, approval.ErrExists):
		// Bound meanwhile to another message (a second card of r): that
		// one is the card; onCard refuses this click.
	case err != nil:
		return r, err
	default:
		b.log.Info("approval card bound by a click on it before its post was answered", "request_id", r.ID, "ts", clicked.TS)
	}
	cur, err := b.records.Request(ctx, r.ID)
	if err != nil {
		return r, err
	}
	if cur.Status != approval.StatusPending && cur.Card == clicked {
		b.Refresh(cur) // it was drawn pending: show what became of it
	}
	return cur, nil
}

// clickedCardOf reports whether the clicked message is this app's card of
// r: from the click's own message when Slack included its metadata, else
// from conversations.history.
func (b *Bot) clickedCardOf(ctx context.Context, r *approval.Request, ic interaction) (bool, error) {
	clicked := ic.clickedMessage()
	if m := ic.Message; m.Metadata.EventType != "" && m.TS == clicked.TS {
		return isCardOf(m.Metadata, m.BotID, b.identity(), r.ID), nil
	}
	_, found, err := b.findCard(ctx, r, clicked.TS)
	return found, err
}
