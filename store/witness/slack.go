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

// SlackAlarmEventType is the metadata event type of a checkpoint alarm.
const SlackAlarmEventType = "countersign_audit_checkpoint_alarm"

// SlackAlarms posts the checkpointer's alarms (store.Alarms) to a channel,
// the ops channel of the Slack witness: people hear that checkpoints
// stopped, or that the checkpointer refuses to sign, from outside Redis.
type SlackAlarms struct {
	Poster  Poster
	Channel string
}

// Alarm posts what is wrong.
func (s *SlackAlarms) Alarm(ctx context.Context, stream, reason string) error {
	text := fmt.Sprintf(":rotating_light: Audit checkpoints of %s: %s\nSee docs/operations.md \"Checkpoint alarms\".", stream, reason)
	return s.Poster.PostWitness(ctx, s.Channel, text, SlackAlarmEventType, map[string]any{"stream": stream, "alarm": reason, "state": "raised"})
}

// Cleared posts that the alarm no longer holds.
func (s *SlackAlarms) Cleared(ctx context.Context, stream, reason string) error {
	text := fmt.Sprintf("Audit checkpoints of %s are back to normal (the alarm was: %s)", stream, reason)
	return s.Poster.PostWitness(ctx, s.Channel, text, SlackAlarmEventType, map[string]any{"stream": stream, "alarm": reason, "state": "cleared"})
}
