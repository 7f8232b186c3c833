package slacksim

import (
	"fmt"
	"slices"
	"strconv"
)

// JoinChannel makes user a member of channel. It reports ErrNotFound for
// an unknown channel or user. When the app subscribes to
// member_joined_channel, is in the channel and holds the channel kind's
// read scope, the event is delivered.
func (w *Workspace) JoinChannel(channelID, user string) error {
	w.mu.Lock()
	c, ok := w.channels[channelID]
	if !ok {
		w.mu.Unlock()
		return fmt.Errorf("join channel %s: %w", channelID, ErrNotFound)
	}
	if _, ok := w.users[user]; !ok {
		w.mu.Unlock()
		return fmt.Errorf("join channel %s: user %s: %w", channelID, user, ErrNotFound)
	}
	var after func()
	if !c.isMember(user) {
		c.Members = append(c.Members, user)
		after = w.memberEventLocked("member_joined_channel", c, user)
	}
	w.bumpLocked()
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return nil
}

// LeaveChannel removes user from channel, delivering member_left_channel
// as JoinChannel delivers member_joined_channel.
func (w *Workspace) LeaveChannel(channelID, user string) {
	w.mu.Lock()
	c, ok := w.channels[channelID]
	if !ok || !c.isMember(user) {
		w.mu.Unlock()
		return
	}
	c.Members = slices.DeleteFunc(c.Members, func(m string) bool { return m == user })
	after := w.memberEventLocked("member_left_channel", c, user)
	w.bumpLocked()
	w.mu.Unlock()
	if after != nil {
		after()
	}
}

// memberEventLocked builds a member_joined_channel or member_left_channel
// event and returns a func that delivers it, or nil when Slack would not
// send it to the app: not subscribed, the bot not in the channel, a DM, or
// no read scope for the channel's kind (channels:read for public channels,
// groups:read for private ones).
func (w *Workspace) memberEventLocked(typ string, c *channel, user string) func() {
	if c.IsIM || !w.subscribed(typ) || !c.isMember(BotUserID) || !w.opts.Manifest.grants(kindScope(c, "read")) {
		return nil
	}
	channelType := "C"
	if c.IsPrivate {
		channelType = "G"
	}
	ev := map[string]any{
		"type":         typ,
		"user":         user,
		"channel":      c.ID,
		"channel_type": channelType,
		"team":         w.teamOfLocked(user),
		"event_ts":     w.nextTSLocked(),
	}
	b, id := w.eventCallbackLocked(ev)
	return func() { w.deliver(kindEvents, id, b, false, nil) }
}

// SetUsergroupUsers replaces the members of user group id, as an admin
// editing the group does, and delivers subteam_members_changed (the users
// added and removed) when the app subscribes to it. It reports ErrNotFound
// for an unknown group.
func (w *Workspace) SetUsergroupUsers(id string, users []string) error {
	w.mu.Lock()
	g, ok := w.groups[id]
	if !ok {
		w.mu.Unlock()
		return fmt.Errorf("set members of user group %s: %w", id, ErrNotFound)
	}
	after := w.setGroupUsersLocked(g, users)
	w.bumpLocked()
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return nil
}

// setGroupUsersLocked replaces g's members and returns a func delivering
// subteam_members_changed, or nil when nothing changed or the app does not
// subscribe.
func (w *Workspace) setGroupUsersLocked(g *Usergroup, users []string) func() {
	var added, removed []string
	for _, u := range users {
		if !slices.Contains(g.Users, u) && !slices.Contains(added, u) {
			added = append(added, u)
		}
	}
	for _, u := range g.Users {
		if !slices.Contains(users, u) {
			removed = append(removed, u)
		}
	}
	g.Users = slices.Clone(users)
	if len(added)+len(removed) == 0 || !w.subscribed("subteam_members_changed") || !w.opts.Manifest.grants("usergroups:read") {
		return nil
	}
	now := w.now().Unix()
	ev := map[string]any{
		"type":                 "subteam_members_changed",
		"subteam_id":           g.ID,
		"team_id":              TeamID,
		"date_previous_update": now,
		"date_update":          now,
		"added_users":          nonNil(added),
		"added_users_count":    strconv.Itoa(len(added)),
		"removed_users":        nonNil(removed),
		"removed_users_count":  strconv.Itoa(len(removed)),
		"event_ts":             w.nextTSLocked(),
	}
	b, id := w.eventCallbackLocked(ev)
	return func() { w.deliver(kindEvents, id, b, false, nil) }
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
