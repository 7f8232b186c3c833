package bot

import (
	"cmp"
	"context"

	"github.com/slack-go/slack"
)

// tell answers the clicker privately: through the click's response_url,
// which reaches them wherever they are, or with chat.postEphemeral in the
// card's channel when there is none (it fails for non-members).
func (b *Bot) tell(ctx context.Context, who clicker, text string) {
	if who.responseURL == "" {
		channel := cmp.Or(who.channel, b.policy.Slack.ApprovalsChannel)
		b.ephemeral(ctx, channel, who.user, text)
		return
	}
	err := b.retry(ctx, "response_url", func(ctx context.Context) error {
		return slack.PostWebhookCustomHTTPContext(ctx, who.responseURL, b.http, &slack.WebhookMessage{
			Text: text, ResponseType: slack.ResponseTypeEphemeral, ReplaceOriginal: false,
		})
	})
	if err != nil {
		b.log.Error("answer click through response_url", "user", who.user, "err", err)
	}
}
