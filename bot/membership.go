package bot

// This file: membership events. A person leaving or joining the approvals
// channel, or a user group changing, drops the cached member list at once,
// so a removed approver is refused on their very next click.

import (
	"encoding/json"

	"github.com/countersign/countersign/approval/clip"
)

// membershipEvent holds the fields of member_joined_channel,
// member_left_channel and subteam_members_changed the bot reads.
type membershipEvent struct {
	Type      string `json:"type"`
	Channel   string `json:"channel"`
	SubteamID string `json:"subteam_id"`
}

// onMembershipEvent drops the member list a membership event changes and
// reports whether raw was one. It runs before the event is acknowledged
// (it only touches memory), so once Slack has the ack the next check asks
// Slack. Every replica caches its own lists and Slack delivers an event to
// one of them: the others re-read within decisionMemberAge for a decision.
func (b *Bot) onMembershipEvent(raw json.RawMessage) bool {
	var ev membershipEvent
	if json.Unmarshal(raw, &ev) != nil {
		return false
	}
	switch ev.Type {
	case "member_joined_channel", "member_left_channel":
		if ev.Channel != "" {
			b.members.drop(channelKey(ev.Channel))
		}
	case "subteam_members_changed":
		if ev.SubteamID != "" {
			b.members.drop(groupKey(ev.SubteamID))
		}
	default:
		return false
	}
	b.log.Debug("membership changed; member list dropped", "type", ev.Type, "channel", clip.Runes(ev.Channel, 40), "usergroup", clip.Runes(ev.SubteamID, 40))
	return true
}
