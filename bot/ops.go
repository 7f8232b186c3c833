package bot

import (
	"context"
	"fmt"

	"github.com/slack-go/slack"
)

// OpsPoster posts the weekly approval load to the ops channel
// (weekly.Poster). It needs only the Web API client.
type OpsPoster struct {
	Messages Messages
	// Channel is the ops channel's id (COUNTERSIGN_OPS_CHANNEL).
	Channel string
}

// PostSummary posts text, Slack mrkdwn, as one message of the channel.
func (p OpsPoster) PostSummary(ctx context.Context, text string) error {
	if _, _, err := p.Messages.PostMessageContext(ctx, p.Channel, slack.MsgOptionText(text, false)); err != nil {
		return fmt.Errorf("chat.postMessage %s: %w", p.Channel, err)
	}
	return nil
}

// CheckChannelID checks that id, the value of the environment variable
// name, is a channel id (C… or G…, upper-case letters and digits) and not
// a channel's name: Slack posts to an id, and a name would fail only at
// the first post, a week after the start.
func CheckChannelID(name, id string) error {
	ok := len(id) >= 2 && (id[0] == 'C' || id[0] == 'G')
	for i := 0; ok && i < len(id); i++ {
		ok = 'A' <= id[i] && id[i] <= 'Z' || '0' <= id[i] && id[i] <= '9'
	}
	if !ok {
		return fmt.Errorf("%s: a channel id (C…, as the channel's details show it), not a name or anything else: %q", name, id)
	}
	return nil
}
