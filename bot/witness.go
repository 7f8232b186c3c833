package bot

import (
	"context"
	"fmt"

	"github.com/slack-go/slack"
)

// WitnessPoster posts the audit stream's checkpoints to a Slack channel
// (the witness package's Poster): one message, the checkpoint as text and
// as message metadata. It needs only the Web API client, so `countersign
// audit checkpoint` posts without a running bot.
type WitnessPoster struct {
	Messages Messages
}

// PostWitness posts text with metadata of eventType to channel.
func (p WitnessPoster) PostWitness(ctx context.Context, channel, text, eventType string, payload map[string]any) error {
	_, _, err := p.Messages.PostMessageContext(ctx, channel,
		slack.MsgOptionText(text, false),
		slack.MsgOptionMetadata(slack.SlackMetadata{EventType: eventType, EventPayload: payload}))
	if err != nil {
		return fmt.Errorf("chat.postMessage %s: %w", channel, err)
	}
	return nil
}
