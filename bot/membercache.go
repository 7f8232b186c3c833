package bot

// This file: the cache of member lists (usergroups, the approvals channel)
// the directory reads (access.go) and membership events drop
// (membership.go).

import (
	"context"
	"sync"
	"time"
)

// memberCache remembers usergroup and channel member lists briefly, so a
// burst of clicks costs one Slack call. A membership event
// (member_left_channel, member_joined_channel, subteam_members_changed)
// drops the list it changes at once (drop); a decision trusts a list at
// most decisionMemberAge old, whether or not the event has come.
type memberCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex // guards entries and drops
	entries map[string]memberEntry
	drops   map[string]uint64 // key → membership events seen for it
}

type memberEntry struct {
	members map[string]bool
	at      time.Time
}

// channelKey and groupKey are the cache keys of a conversation's and a
// user group's members.
func channelKey(id string) string { return "channel:" + id }

func groupKey(id string) string { return "usergroup:" + id }

// get returns the cached members under key, calling load when missing or
// older than maxAge (at most the cache's ttl). Concurrent misses may load
// twice; that is harmless.
func (c *memberCache) get(ctx context.Context, key string, maxAge time.Duration, load func(context.Context) ([]string, error)) (map[string]bool, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	drops := c.drops[key]
	c.mu.Unlock()
	if ok && now.Sub(e.at) < min(maxAge, c.ttl) && !now.Before(e.at) {
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
	if c.drops[key] == drops { // no event came meanwhile: the list is not older than one
		c.entries[key] = memberEntry{members: m, at: now}
	}
	c.mu.Unlock()
	return m, nil
}

// drop forgets the list under key: the next check asks Slack. A list
// being loaded meanwhile (it may have been read before the change) is
// used by the check that asked for it but not kept.
func (c *memberCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
	c.drops[key]++
}
