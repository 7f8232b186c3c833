package bot

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
)

// memberCache remembers usergroup and channel member lists briefly, so a
// burst of clicks costs one Slack call, while a removed approver loses
// their rights within ttl.
type memberCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex // guards entries
	entries map[string]memberEntry
}

type memberEntry struct {
	members map[string]bool
	at      time.Time
}

// get returns the cached members under key, calling load when missing or
// stale. Concurrent misses may load twice; that is harmless.
func (c *memberCache) get(ctx context.Context, key string, load func(context.Context) ([]string, error)) (map[string]bool, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < c.ttl && !now.Before(e.at) {
		return e.members, nil
	}
	list, err := load(ctx)
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(list))
	for _, u := range list {
		m[u] = true
	}
	c.mu.Lock()
	c.entries[key] = memberEntry{members: m, at: now}
	c.mu.Unlock()
	return m, nil
}

// authorize checks, at click time, whether user may decide r, asking Slack
// for usergroup and approvals-channel membership only when needed. A bot
// never decides, whatever the approver lists say: not the installation's
// own bot user (a member of the approvals channel, so an approver under
// channel_members) and no bot id (B…), so no bot counts toward a quorum.
func (b *Bot) authorize(ctx context.Context, r *approval.Request, user string) error {
	if self := b.identity(); user != "" && (user == self.UserID || user == self.BotID || strings.HasPrefix(user, "B")) {
		return fmt.Errorf("authorize %s on %s: a bot: %w", cutRunes(user, 40), r.ID, approval.ErrNotApprover)
	}
	inGroup := func(id string) (bool, error) {
		m, err := b.members.get(ctx, "usergroup:"+id, func(ctx context.Context) ([]string, error) {
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
	channel := b.policy.Slack.ApprovalsChannel
	inChannel := func() (bool, error) {
		m, err := b.members.get(ctx, "channel:"+channel, func(ctx context.Context) ([]string, error) {
			return b.channelMembers(ctx, channel)
		})
		if err != nil {
			return false, fmt.Errorf("conversations.members %s: %w", channel, err)
		}
		return m[user], nil
	}
	return approval.Authorize(r, user, inGroup, inChannel)
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
