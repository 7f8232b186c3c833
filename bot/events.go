package bot

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// eventEnvelope is the outer Events API payload (HTTP body, or the payload
// of a Socket Mode events_api envelope).
type eventEnvelope struct {
	Type      string `json:"type"`
	Challenge string `json:"challenge"`
	TeamID    string `json:"team_id"`
	// EnterpriseID is set on Enterprise Grid.
	EnterpriseID string          `json:"enterprise_id"`
	EventID      string          `json:"event_id"`
	Event        json.RawMessage `json:"event"`
}

// slackEvent holds the fields of the inner events the bot reads.
type slackEvent struct {
	Type        string `json:"type"`
	Subtype     string `json:"subtype"`
	User        string `json:"user"`
	BotID       string `json:"bot_id"`
	Text        string `json:"text"`
	Channel     string `json:"channel"`
	ChannelType string `json:"channel_type"`
	TS          string `json:"ts"`
	ThreadTS    string `json:"thread_ts"`
	Tab         string `json:"tab"`
	// UserTeam is the author's own team: another organisation's for a
	// Slack Connect member of a shared channel.
	UserTeam string `json:"user_team"`
}

// onEvent answers an Events API payload at once and queues the work.
func (b *Bot) onEvent(ctx context.Context, body []byte) (any, error) {
	var env eventEnvelope
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, errBadPayload
	}
	if !slackIDs(env.TeamID, env.EnterpriseID, env.EventID) {
		return nil, errBadPayload // ids of no Slack shape: refused, never stored
	}
	switch env.Type {
	case "url_verification":
		return map[string]string{"challenge": env.Challenge}, nil
	case "event_callback":
		if b.onMembershipEvent(env.Event) {
			return nil, nil
		}
		return nil, b.submit(ctx, func(ctx context.Context) { b.handleEvent(ctx, env) })
	}
	return nil, nil
}

// handleEvent runs in the worker pool.
func (b *Bot) handleEvent(ctx context.Context, env eventEnvelope) {
	var ev slackEvent
	if err := json.Unmarshal(env.Event, &ev); err != nil {
		b.log.Warn("malformed slack event", "event_id", env.EventID, "err", err)
		return
	}
	if foreign := b.foreignTeam(env.EnterpriseID, env.TeamID, ev.UserTeam); foreign != "" {
		b.log.Warn("event from another workspace ignored", "event_id", clip.Runes(env.EventID, 64), "type", clip.Runes(ev.Type, 40), "team", clip.Runes(foreign, 40))
		return
	}
	self := b.identity()
	switch ev.Type {
	case "app_home_opened":
		if ev.Tab != "" && ev.Tab != "home" {
			return
		}
		if first, _ := b.firstSeen(ctx, env.EventID); !first {
			return
		}
		b.publishHome(ctx, ev.User)
	case "app_mention", "message":
		// Never act on bots (ourselves included) or on edits, joins and other
		// subtypes: only a person's plain message can start work.
		if ev.BotID != "" || ev.Subtype != "" || ev.User == "" || ev.User == self.UserID {
			return
		}
		if env.EventID == "" || !slackID(ev.Channel) || ev.TS == "" || !slackID(ev.User) {
			// Without an event id retries cannot be told apart (a run per
			// retry); without a channel or ts there is no thread to work in.
			b.log.Warn("incomplete slack event dropped", "type", ev.Type, "event_id", env.EventID,
				"channel", clip.Bytes(ev.Channel, approval.MaxField), "ts", clip.Bytes(ev.TS, approval.MaxField))
			return
		}
		isDM := ev.ChannelType == "im" || (ev.ChannelType == "" && strings.HasPrefix(ev.Channel, "D"))
		if ev.Type == "message" && !isDM {
			return // channel messages need a mention (app_mention)
		}
		if ev.Type == "app_mention" && isDM {
			return // the message.im event covers it
		}
		first, err := b.firstSeen(ctx, env.EventID)
		if err != nil {
			// Slack has the ack and will not retry: say so rather than
			// drop the task silently.
			b.ephemeral(ctx, ev.Channel, ev.User, taskNotTakenText)
			return
		}
		if !first {
			return
		}
		b.startTask(ctx, env, ev, isDM)
	}
}

// firstSeen de-duplicates events across retries and replicas. When the
// store cannot say, the event is dropped (fail closed), logged, and the error
// returned so a task's author can be told.
func (b *Bot) firstSeen(ctx context.Context, eventID string) (bool, error) {
	if eventID == "" {
		return true, nil
	}
	first, err := b.dedupe.FirstSeen(ctx, eventID, dedupeTTL)
	if err != nil {
		b.log.Error("event de-duplication failed; dropping event", "event_id", eventID, "err", err)
		return false, err
	}
	return first, nil
}

// taskNotTakenText tells a person their task was dropped because the bot
// could not check it against retries (Redis unreachable).
const taskNotTakenText = "Sorry, I couldn't take this task just now (internal error). Please try again in a minute."

var leadingMention = regexp.MustCompile(`<@[A-Z0-9]+(\|[^>]*)?>`)

func (b *Bot) startTask(ctx context.Context, env eventEnvelope, ev slackEvent, isDM bool) {
	thread := ev.ThreadTS
	if thread == "" {
		thread = ev.TS
	}
	origin := approval.Origin{Team: env.TeamID, Channel: ev.Channel, ThreadTS: thread}
	log := b.log.With("event_id", env.EventID, "channel", ev.Channel, "user", ev.User)

	if ev.Channel == b.policy.Slack.ApprovalsChannel {
		b.ephemeral(ctx, ev.Channel, ev.User, "I don't take tasks in the approvals channel. Mention me in a task channel or send me a DM.")
		return
	}
	if !isDM && len(b.policy.Slack.TaskChannels) > 0 && !slices.Contains(b.policy.Slack.TaskChannels, ev.Channel) {
		where := make([]string, 0, len(b.policy.Slack.TaskChannels))
		for _, c := range b.policy.Slack.TaskChannels {
			where = append(where, channelRef(c))
		}
		b.ephemeral(ctx, ev.Channel, ev.User, "I only take tasks in "+strings.Join(where, ", ")+" or in a DM.")
		return
	}
	self := b.identity()
	text := ev.Text
	if self.UserID != "" {
		text = strings.ReplaceAll(text, "<@"+self.UserID+">", "")
	}
	if ev.Type == "app_mention" {
		text = leadingMention.ReplaceAllStringFunc(text, func(m string) string {
			if strings.HasPrefix(m, "<@"+self.UserID) {
				return ""
			}
			return m
		})
	}
	text = strings.TrimSpace(text)
	if text == "" {
		_ = b.postThread(ctx, origin, "Tell me what to do, e.g. “refund order 1234, it arrived broken”.")
		return
	}
	task := approval.Task{EventID: env.EventID, Requester: ev.User, Origin: origin, Text: text}
	if err := b.runner.Handle(ctx, task); err != nil {
		log.Error("runner refused task", "err", err)
		_ = b.postThread(ctx, origin, "Sorry, I couldn't start on that (internal error). Nothing was run.")
	}
}
