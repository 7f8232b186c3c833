package witness

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/countersign/countersign/approval"
)

// SlackEventType is the metadata event type of a checkpoint message.
const SlackEventType = "countersign_audit_checkpoint"

// Poster posts one message with metadata to a channel; *bot.Bot
// implements it. An error means the message may not have been posted.
type Poster interface {
	PostWitness(ctx context.Context, channel, text, eventType string, payload map[string]any) error
}

// Slack posts each checkpoint to a channel (an ops channel): Slack's
// history is outside Redis, and a message cannot be edited without the
// edit showing. The text holds the signed checkpoint as JSON (without its
// short hashes: a checkpoint verifies without them) and the metadata its
// fields.
type Slack struct {
	Poster  Poster
	Channel string
}

// Name says which witness it is.
func (s *Slack) Name() string { return "slack " + s.Channel }

// Publish posts c.
func (s *Slack) Publish(ctx context.Context, c approval.Checkpoint) error {
	c.Hashes = nil
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	var payload map[string]any
	if err := json.Unmarshal(b, &payload); err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	text := fmt.Sprintf("Audit checkpoint: %s, entries %d to %d, head %s\n```%s```", c.Stream, c.From, c.Seq, approval.ShortHash(c.Head), b)
	return s.Poster.PostWitness(ctx, s.Channel, text, SlackEventType, payload)
}
