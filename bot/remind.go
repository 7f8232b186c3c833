package bot

import (
	"context"
	"fmt"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// The bot posts what the domain's reminder loop (approval.Reminders)
// decided, recorded and audited: it decides nothing about reminders.
var _ approval.Reminder = (*Bot)(nil)

// maxMentions bounds how many people and groups one reminder pings.
const maxMentions = 20

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

// escalationLine is the card's note on an escalation, empty when r was
// not escalated.
func escalationLine(r *approval.Request) string {
	e := r.Escalated
	if e == nil {
		return ""
	}
	who := mentions(e.To)
	if who == "" {
		who = "the approvers"
	}
	s := "⏫ Escalated to " + who + " · " + slackDate(e.At)
	if e.Widened {
		s += " · they may decide too"
	}
	return s
}

// mentions pings the users and usergroups a. Ids that are not plain Slack
// ids are shown escaped (never as a broadcast); the list is bounded.
func mentions(a approval.Approvers) string {
	return strings.Join(mentionList(a), " ")
}

// mentionList is mentions, one entry per user or usergroup.
func mentionList(a approval.Approvers) []string {
	var parts []string
	for _, u := range a.Users {
		parts = append(parts, mention(u))
	}
	for _, g := range a.Usergroups {
		if slackIDRe.MatchString(g) {
			parts = append(parts, "<!subteam^"+g+">")
		} else {
			parts = append(parts, lit(g))
		}
	}
	if len(parts) > maxMentions {
		parts = append(parts[:maxMentions], fmt.Sprintf("and %d more", len(parts)-maxMentions))
	}
	return parts
}
