package bot

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// decisionMemberAge is the oldest member list a decision trusts. Slack
// promises no order between a membership event and a click, and delivers
// each event to one replica only: a decision re-reads a list older than
// this, so a removed approver's vote counts at most this long after the
// removal on any replica, event or not. Clicks in a burst share one read.
const decisionMemberAge = 2 * time.Second

// authorize checks, at click time, whether user may decide r, asking Slack
// for usergroup and approvals-channel membership only when needed (lists
// up to the cache's ttl old: what App Home and the pending list show). A
// decision itself is judged by the lifecycle (approval.Lifecycle.MayDecide)
// over the bot's Directory methods, which trust lists at most
// decisionMemberAge old. A bot never decides, whatever the approver lists
// say: not the installation's own bot user (a member of the approvals
// channel, so an approver under channel_members) and no bot id (B…), so
// no bot counts toward a quorum.
func (b *Bot) authorize(ctx context.Context, r *approval.Request, user string) error {
	if b.isBot(user) {
		return fmt.Errorf("authorize %s on %s: a bot: %w", clip.Runes(user, 40), r.ID, approval.ErrNotApprover)
	}
	ttl := b.members.ttl
	return approval.Authorize(r, user,
		func(id string) (bool, error) { return b.inUsergroup(ctx, id, user, ttl) },
		func() (bool, error) { return b.inApprovalsChannel(ctx, user, ttl) })
}

var _ approval.Directory = (*Bot)(nil)

// InUsergroup reports whether user is a member of Slack usergroup id, from
// a member list at most decisionMemberAge old (approval.Directory: asked
// when a person decides); never for a bot.
func (b *Bot) InUsergroup(ctx context.Context, id, user string) (bool, error) {
	if b.isBot(user) {
		return false, nil
	}
	return b.inUsergroup(ctx, id, user, decisionMemberAge)
}

// InApprovalsChannel reports whether user is a member of the approvals
// channel, as InUsergroup; never for a bot.
func (b *Bot) InApprovalsChannel(ctx context.Context, user string) (bool, error) {
	if b.isBot(user) {
		return false, nil
	}
	return b.inApprovalsChannel(ctx, user, decisionMemberAge)
}

// isBot reports whether user is the installation's own bot user or any
// bot id (B…).
func (b *Bot) isBot(user string) bool {
	self := b.identity()
	return user != "" && (user == self.UserID || user == self.BotID || strings.HasPrefix(user, "B"))
}

// inUsergroup is InUsergroup trusting a list at most maxAge old.
func (b *Bot) inUsergroup(ctx context.Context, id, user string, maxAge time.Duration) (bool, error) {
	m, err := b.members.get(ctx, groupKey(id), maxAge, func(ctx context.Context) ([]string, error) {
		var users []string
		err := b.retry(ctx, "usergroups.users.list", func(ctx context.Context) error {
			var err error
			users, err = b.directory.GetUserGroupMembersContext(ctx, id)
			return err
		})
		return users, err
	})
	if err != nil {
		return false, fmt.Errorf("usergroups.users.list %s: %w", id, err)
	}
	return m[user], nil
}

// inApprovalsChannel is InApprovalsChannel trusting a list at most maxAge
// old.
func (b *Bot) inApprovalsChannel(ctx context.Context, user string, maxAge time.Duration) (bool, error) {
	channel := b.policy.Slack.ApprovalsChannel
	m, err := b.members.get(ctx, channelKey(channel), maxAge, func(ctx context.Context) ([]string, error) {
		return b.channelMembers(ctx, channel)
	})
	if err != nil {
		return false, fmt.Errorf("conversations.members %s: %w", channel, err)
	}
	return m[user], nil
}

// channelMembers lists every member of a conversation, following cursors.
func (b *Bot) channelMembers(ctx context.Context, channel string) ([]string, error) {
	var all []string
	cursor := ""
	for page := 0; page < 1000; page++ {
		var (
			users []string
			next  string
		)
		err := b.retry(ctx, "conversations.members", func(ctx context.Context) error {
			var err error
			users, next, err = b.directory.GetUsersInConversationContext(ctx, &slack.GetUsersInConversationParameters{
				ChannelID: channel, Cursor: cursor, Limit: 200,
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		all = append(all, users...)
		if next == "" {
			return all, nil
		}
		cursor = next
	}
	return all, nil
}

// Name is Names.Name over the bot's directory and cache.
func (b *Bot) Name(ctx context.Context, id string) string { return b.names.Name(ctx, id) }

// Email is Names.Email over the bot's directory.
func (b *Bot) Email(ctx context.Context, id string) (string, error) { return b.names.Email(ctx, id) }

// foreignTeam returns the team (or enterprise) of a payload that is not
// the installation's, "" when it is ours. Without Enterprise Grid the
// payload's team and the user's team must both be the installation's team;
// on Grid the enterprise must be ours and, when the policy lists
// slack.allowed_teams, the teams must be among them.
func (b *Bot) foreignTeam(enterprise string, teams ...string) string {
	self := b.identity()
	if self.EnterpriseID != "" {
		if enterprise != self.EnterpriseID {
			return cmp.Or(enterprise, cmp.Or(teams[0], "(none)"))
		}
		if allowed := b.policy.Slack.AllowedTeams; len(allowed) > 0 {
			for _, t := range teams {
				if t != "" && !slices.Contains(allowed, t) {
					return t
				}
			}
		}
		return ""
	}
	if self.TeamID == "" {
		return "" // before Start: nothing is handled anyway
	}
	for _, t := range teams {
		if t != "" && t != self.TeamID {
			return t
		}
	}
	if teams[0] == "" {
		return "(none)"
	}
	return ""
}
