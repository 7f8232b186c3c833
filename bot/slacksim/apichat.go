package slacksim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// resolveChannelLocked finds a conversation by ID, by name ("#x" or "x"),
// or, for a user ID, that user's DM with the bot (as chat.postMessage does).
func (w *Workspace) resolveChannelLocked(ref string) *channel {
	if c, ok := w.channels[ref]; ok {
		return c
	}
	if _, ok := w.users[ref]; ok && ref != BotUserID {
		return w.channels[w.dmLocked(ref)]
	}
	name := strings.TrimPrefix(ref, "#")
	for _, id := range w.chanOrder {
		if c := w.channels[id]; !c.IsIM && c.Name == name {
			return c
		}
	}
	return nil
}

// botChannelLocked resolves a channel the bot wants to use and checks
// membership, answering Slack's error when it may not.
func (w *Workspace) botChannelLocked(ref string) (*channel, result) {
	if ref == "" {
		return nil, fail("channel_not_found")
	}
	c := w.resolveChannelLocked(ref)
	if c == nil || (c.IsPrivate && !c.isMember(BotUserID)) || (c.IsIM && !c.isMember(BotUserID)) {
		return nil, fail("channel_not_found")
	}
	if !c.isMember(BotUserID) {
		return nil, fail("not_in_channel")
	}
	return c, nil
}

// parseBlocks decodes and validates a message's blocks parameter.
func (w *Workspace) parseBlocksLocked(raw string) ([]any, json.RawMessage, result) {
	if raw == "" || raw == "null" {
		return nil, nil, nil
	}
	var blocks []any
	if err := json.Unmarshal([]byte(raw), &blocks); err != nil {
		return nil, nil, fail("invalid_blocks_format")
	}
	if msgs := validateMessageBlocks(blocks); len(msgs) > 0 {
		return nil, nil, fail("invalid_blocks", msgs...)
	}
	ensureIDs(blocks, func(prefix string) string { return w.newIDLocked(prefix) })
	out, _ := json.Marshal(blocks)
	return blocks, out, nil
}

func chatPostMessage(w *Workspace, p params, base string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	text := p["text"]
	if text == "" && p["blocks"] == "" && p["attachments"] == "" {
		return fail("no_text"), nil
	}
	if len(text) > maxMessageText {
		return fail("msg_too_long"), nil
	}
	_, blocks, errRes := w.parseBlocksLocked(p["blocks"])
	if errRes != nil {
		return errRes, nil
	}
	var metadata json.RawMessage
	if s := p["metadata"]; s != "" && s != "null" {
		if !json.Valid([]byte(s)) {
			return fail("invalid_metadata_format"), nil
		}
		metadata = json.RawMessage(s)
	}
	threadTS := p["thread_ts"]
	if threadTS != "" {
		parent := w.findMessageLocked(c.ID, threadTS)
		if parent == nil || parent.VisibleTo != "" {
			return fail("thread_not_found"), nil
		}
		if parent.ThreadTS != "" {
			threadTS = parent.ThreadTS
		}
	}
	m := w.storeMessageLocked(c, BotUserID, text, threadTS, blocks, metadata)
	after := w.messageEventsLocked(c, m)
	return ok(result{"channel": c.ID, "ts": m.TS, "message": w.messageJSONLocked(m)}), after
}

// storeMessageLocked appends a message to a channel.
func (w *Workspace) storeMessageLocked(c *channel, user, text, threadTS string, blocks, metadata json.RawMessage) *Message {
	m := &Message{
		Channel:  c.ID,
		TS:       w.nextTSLocked(),
		ThreadTS: threadTS,
		User:     user,
		Text:     text,
		Blocks:   blocks,
		Metadata: metadata,
	}
	if user == BotUserID {
		m.BotID = BotID
	}
	if threadTS != "" {
		if parent := w.findMessageLocked(c.ID, threadTS); parent != nil {
			parent.ReplyCount++
		}
	}
	c.add(m, false)
	return m
}

// messageJSONLocked renders a message as Slack's API and events do.
func (w *Workspace) messageJSONLocked(m *Message) map[string]any {
	out := map[string]any{
		"type": "message",
		"ts":   m.TS,
		"text": m.Text,
		"team": TeamID,
	}
	if m.User != "" {
		out["user"] = m.User
		if team := w.teamOfLocked(m.User); team != TeamID {
			// An external member's message carries their organisation.
			out["team"], out["user_team"] = team, team
		}
	}
	if m.BotID != "" {
		out["bot_id"] = m.BotID
		out["app_id"] = AppID
		out["bot_profile"] = map[string]any{"id": BotID, "app_id": AppID, "name": w.opts.BotName, "team_id": TeamID, "deleted": false}
	}
	if m.ThreadTS != "" {
		out["thread_ts"] = m.ThreadTS
		out["parent_user_id"] = w.parentUserLocked(m)
	} else if m.ReplyCount > 0 {
		out["thread_ts"] = m.TS
		out["reply_count"] = m.ReplyCount
		out["reply_users"], out["latest_reply"] = w.threadInfoLocked(m)
		out["reply_users_count"] = len(out["reply_users"].([]string))
	}
	if m.Blocks != nil {
		out["blocks"] = json.RawMessage(m.Blocks)
	}
	if m.Metadata != nil {
		out["metadata"] = json.RawMessage(m.Metadata)
	}
	return out
}

func (w *Workspace) parentUserLocked(m *Message) string {
	if p := w.findMessageLocked(m.Channel, m.ThreadTS); p != nil {
		return p.User
	}
	return ""
}

func (w *Workspace) threadInfoLocked(parent *Message) ([]string, string) {
	users := []string{}
	latest := ""
	for _, r := range w.channels[parent.Channel].replies[parent.TS] {
		if !slices.Contains(users, r.User) {
			users = append(users, r.User)
		}
		latest = r.TS
	}
	return users, latest
}

func chatUpdate(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	m := w.findMessageLocked(c.ID, p["ts"])
	if m == nil || m.VisibleTo != "" {
		return fail("message_not_found"), nil
	}
	if m.User != BotUserID {
		return fail("cant_update_message"), nil
	}
	if len(p["text"]) > maxMessageText {
		return fail("msg_too_long"), nil
	}
	previous := w.messageJSONLocked(m)
	if _, has := p["blocks"]; has {
		_, blocks, errRes := w.parseBlocksLocked(p["blocks"])
		if errRes != nil {
			return errRes, nil
		}
		m.Blocks = blocks
	}
	if _, has := p["text"]; has {
		m.Text = p["text"]
	}
	if s := p["metadata"]; s != "" && s != "null" && json.Valid([]byte(s)) {
		m.Metadata = json.RawMessage(s)
	}
	after := w.messageChangedLocked(c, m, previous)
	return ok(result{"channel": c.ID, "ts": m.TS, "text": m.Text, "message": w.messageJSONLocked(m)}), after
}

func chatPostEphemeral(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	user := p["user"]
	if _, ok := w.users[user]; !ok {
		return fail("user_not_found"), nil
	}
	if !c.isMember(user) {
		return fail("user_not_in_channel"), nil
	}
	if p["text"] == "" && p["blocks"] == "" && p["attachments"] == "" {
		return fail("no_text"), nil
	}
	_, blocks, errRes := w.parseBlocksLocked(p["blocks"])
	if errRes != nil {
		return errRes, nil
	}
	m := &Message{
		Channel:   c.ID,
		TS:        w.nextTSLocked(),
		ThreadTS:  p["thread_ts"],
		User:      BotUserID,
		BotID:     BotID,
		Text:      p["text"],
		Blocks:    blocks,
		VisibleTo: user,
	}
	c.add(m, true)
	return ok(result{"message_ts": m.TS}), nil
}

func chatDelete(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	m := c.byTS[p["ts"]]
	if m == nil {
		return fail("message_not_found"), nil
	}
	if m.User != BotUserID {
		return fail("cant_delete_message"), nil
	}
	c.remove(m)
	if m.ThreadTS != "" {
		if parent := w.findMessageLocked(c.ID, m.ThreadTS); parent != nil {
			parent.ReplyCount--
		}
	}
	return ok(result{"channel": c.ID, "ts": m.TS}), nil
}

func chatGetPermalink(w *Workspace, p params, base string) (result, func()) {
	c := w.resolveChannelLocked(p["channel"])
	if c == nil {
		return fail("channel_not_found"), nil
	}
	m := w.findMessageLocked(c.ID, p["message_ts"])
	if m == nil || m.VisibleTo != "" {
		return fail("message_not_found"), nil
	}
	link := fmt.Sprintf("%s/archives/%s/p%s", base, c.ID, strings.ReplaceAll(m.TS, ".", ""))
	if m.ThreadTS != "" {
		link += "?thread_ts=" + m.ThreadTS + "&cid=" + c.ID
	}
	return ok(result{"channel": c.ID, "permalink": link}), nil
}
