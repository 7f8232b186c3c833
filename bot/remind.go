package bot

import (
	"context"
	"fmt"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// The bot posts what the domain's reminder loop (approval.Reminders)
// decided, recorded and audited: it decides nothing about reminders.
var _ approval.Reminder = (*Bot)(nil)

// Remind posts reminder n for pending request r in its card's thread: what
// is waiting, for whom, until when, pinging the approvers when the policy
// names them (users or usergroups; a channel-members policy pings nobody,
// the channel sees the thread). The caller (approval.Reminders) makes sure
// each reminder is sent once (Lifecycle.ClaimReminder). It returns an error when r has no card or
// Slack refuses the post.
func (b *Bot) Remind(ctx context.Context, r *approval.Request, n int) error {
	if r.Card.Channel == "" || r.Card.TS == "" {
		return fmt.Errorf("remind %s: no card posted yet", r.ID)
	}
	text := fmt.Sprintf("⏰ Still waiting: %s for %s, deadline %s",
		code(clip.Runes(r.Tool, 100)), requester(r), slackDate(r.Deadline))
	if n > 1 {
		text += fmt.Sprintf(" (reminder %d)", n)
	}
	if who := mentions(r.Approvers); who != "" {
		text += "\n" + who + " — please approve or reject."
	}
	if err := b.postThread(ctx, approval.Origin{Channel: r.Card.Channel, ThreadTS: r.Card.TS}, text); err != nil {
		return fmt.Errorf("remind %s: %w", r.ID, err)
	}
	return nil
}

// Escalate tells r's escalation target (r.Escalated.To) in the card's
// thread that r needs them, saying whether they may now decide it. Call
// it once, after Lifecycle.Escalate recorded the escalation, audited it
// and had the card redrawn to show it.
func (b *Bot) Escalate(ctx context.Context, r *approval.Request) error {
	if r.Escalated == nil {
		return fmt.Errorf("escalate %s: the request is not escalated", r.ID)
	}
	if r.Card.Channel == "" || r.Card.TS == "" {
		return fmt.Errorf("escalate %s: no card posted yet", r.ID)
	}
	who := mentions(r.Escalated.To)
	if who == "" {
		who = "Approvers"
	}
	text := fmt.Sprintf("⏫ Escalated: %s for %s has been waiting since %s, deadline %s.\n%s — please take a look.",
		code(clip.Runes(r.Tool, 100)), requester(r), slackDate(r.Created), slackDate(r.Deadline), who)
	if r.Escalated.Widened {
		text += " You may now approve or reject it."
	}
	if err := b.postThread(ctx, approval.Origin{Channel: r.Card.Channel, ThreadTS: r.Card.TS}, text); err != nil {
		return fmt.Errorf("escalate %s: %w", r.ID, err)
	}
	return nil
}
