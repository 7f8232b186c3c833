package bot

import (
	"context"
	"fmt"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
)

// This file: what App Home and /countersign passkey show of passkey enrollment (the
// buttons' handlers are passkey.go's). Passkey enrollment from Slack (step-up votes). A person asks
// with /countersign passkey; a colleague in the approvals channel vouches
// for them with a button (four-eyes: a thief holding one Slack session
// cannot register their own passkey for it); the person then gets a
// one-time registration link, in the channel where they asked.

// actionVouchPasskey is the button that vouches for a colleague's passkey
// enrollment; its value is "<user> <channel>".
const actionVouchPasskey = "cs_passkey_vouch"

// actionRevokePasskey is the App Home's button that removes one of the
// viewer's passkeys; its value is the passkey's id.
const actionRevokePasskey = "cs_passkey_revoke"

// maxHomePasskeys bounds the passkeys App Home lists (a block each).
const maxHomePasskeys = 10

// passkeyCommand answers /countersign passkey: the ask, posted in the
// approvals channel for a colleague to vouch for.
func (b *Bot) passkeyCommand(ctx context.Context, cmd command) (any, error) {
	if b.stepUp == nil {
		return ephemeralAnswer("Passkeys are not offered here yet (whoever runs Countersign sets COUNTERSIGN_PUBLIC_URL).", nil), nil
	}
	url, err := b.stepUp.OfferOIDCEnrollment(ctx, cmd.UserID)
	if err != nil {
		b.log.Error("passkey enrollment link not made", "user", cmd.UserID, "err", err)
		return ephemeralAnswer("The registration link could not be made; try again in a moment.", nil), nil
	}
	if url != "" {
		return ephemeralAnswer(fmt.Sprintf("<%s|Register your passkey here>: you first sign in at your identity provider, whose verified email must be your Slack email (the link works once, for %s, and only for you).",
			url, duration.Format(approval.StepUpLinkTTL)), nil), nil
	}
	channel := b.policy.Slack.ApprovalsChannel
	text := fmt.Sprintf("<@%s> asks to register a passkey, which confirms their votes on requests that need one. Approve only if you know this is them asking (a colleague vouches: nobody registers a passkey for themselves).", cmd.UserID)
	button := slack.NewButtonBlockElement(actionVouchPasskey, cmd.UserID+" "+cmd.ChannelID,
		slack.NewTextBlockObject(slack.PlainTextType, "It is them: send the link", false, false)).WithStyle(slack.StylePrimary)
	err = b.retry(ctx, "chat.postMessage", func(ctx context.Context) error {
		_, _, err := b.messages.PostMessageContext(ctx, channel, slack.MsgOptionText(text, false),
			slack.MsgOptionBlocks(slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, text, false, false), nil, nil),
				slack.NewActionBlock("cs_passkey", button)))
		return err
	})
	if err != nil {
		b.log.Error("post passkey enrollment ask", "user", cmd.UserID, "err", err)
		return ephemeralAnswer("Your ask could not be posted; try again in a moment.", nil), nil
	}
	return ephemeralAnswer("Asked in the approvals channel: once a colleague vouches for you, your registration link appears here.", nil), nil
}

// passkeyBlocks is App Home's "Your passkeys": each with a Revoke button;
// nothing without a step-up page.
func (b *Bot) passkeyBlocks(ctx context.Context, user string) []slack.Block {
	if b.stepUp == nil {
		return nil
	}
	ids, err := b.stepUp.PasskeyIDs(ctx, user)
	if err != nil {
		b.log.Error("app home passkeys", "user", user, "err", err)
		return []slack.Block{mrkdwnSection("Your passkeys could not be read now.")}
	}
	blocks := []slack.Block{slack.NewHeaderBlock(plain("Your passkeys"))}
	if len(ids) == 0 {
		return append(blocks, mrkdwnSection("None: votes that need a passkey confirmation cannot count yet. Type "+code("/countersign passkey")+" to register one."))
	}
	for i, id := range ids {
		if i == maxHomePasskeys {
			blocks = append(blocks, contextBlock(fmt.Sprintf("…and %d more", len(ids)-i)))
			break
		}
		revoke := slack.NewButtonBlockElement(actionRevokePasskey, id, plain("Revoke")).WithStyle(slack.StyleDanger)
		blocks = append(blocks, slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, "Passkey "+code(clip.Runes(id, 16)), false, false), nil,
			slack.NewAccessory(revoke)))
	}
	return blocks
}
