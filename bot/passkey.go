package bot

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// This file: passkey enrollment from Slack (step-up votes). A person asks
// with /countersign passkey; a colleague in the approvals channel vouches
// for them with a button (four-eyes: a thief holding one Slack session
// cannot register their own passkey for it); the person then gets a
// one-time registration link, in the channel where they asked.

// vouchPasskey handles a colleague's click on an enrollment ask: a
// passkey admin other than the person asking (the domain judges it)
// makes the enrollment link, which only the person asking sees.
func (b *Bot) vouchPasskey(ctx context.Context, ic interaction) {
	who := ic.clicker()
	user, channel, ok := strings.Cut(ic.Actions[0].Value, " ")
	if !ok || !slackIDs(user, channel) || b.stepUp == nil {
		b.log.Warn("passkey vouch with malformed value", "user", who.user)
		return
	}
	// Who may vouch (the policy's passkey admins, four-eyes) is the
	// domain's judgement, made in OfferEnrollment.
	url, err := b.stepUp.OfferEnrollment(ctx, user, who.user)
	switch {
	case errors.Is(err, approval.ErrNotApprover):
		b.tell(ctx, who, "Only passkey admins (slack.passkey_admins in the policy; without it, members of the approvals channel) vouch for a passkey, so nothing changed.")
		return
	case errors.Is(err, approval.ErrSelfApproval):
		b.tell(ctx, who, "You cannot vouch for your own passkey: a colleague has to (four-eyes rule).")
		return
	case err != nil:
		b.log.Error("passkey enrollment link not made", "user", user, "by", who.user, "err", err)
		b.tell(ctx, who, "The registration link could not be made; try again in a moment.")
		return
	}
	b.ephemeral(ctx, channel, user, fmt.Sprintf("<@%s> vouched for you: <%s|register your passkey here> (the link works once, for %s, and only for you).",
		who.user, url, duration.Format(approval.StepUpLinkTTL)))
	b.tell(ctx, who, fmt.Sprintf("Thanks: <@%s> got their registration link.", user))
}

// revokePasskey handles Revoke on App Home: the viewer's own passkey only.
func (b *Bot) revokePasskey(ctx context.Context, ic interaction) {
	who := ic.clicker()
	id := ic.Actions[0].Value
	if b.stepUp == nil || id == "" {
		return
	}
	ok, err := b.stepUp.RevokePasskey(ctx, who.user, id, who.user)
	if err != nil {
		b.log.Error("revoke passkey", "user", who.user, "err", err)
	}
	if ok {
		b.log.Info("passkey revoked", "user", who.user)
	}
	b.publishHome(ctx, who.user)
}
