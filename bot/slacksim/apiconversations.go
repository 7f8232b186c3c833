package slacksim

import (
	"cmp"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
)

func (w *Workspace) channelJSONLocked(c *channel) map[string]any {
	out := map[string]any{
		"id":              c.ID,
		"created":         0,
		"is_archived":     false,
		"is_member":       c.isMember(BotUserID),
		"num_members":     len(c.Members),
		"context_team_id": TeamID,
	}
	if c.IsIM {
		out["is_im"] = true
		out["is_org_shared"] = false
		for _, m := range c.Members {
			if m != BotUserID {
				out["user"] = m
			}
		}
		return out
	}
	out["name"] = c.Name
	out["name_normalized"] = c.Name
	out["is_channel"] = !c.IsPrivate
	out["is_group"] = c.IsPrivate
	out["is_private"] = c.IsPrivate
	out["is_im"] = false
	out["is_mpim"] = false
	out["is_general"] = false
	return out
}

// visibleChannelLocked resolves a channel the bot may see (public ones,
// and private ones and DMs it is in).
func (w *Workspace) visibleChannelLocked(ref string) *channel {
	c := w.resolveChannelLocked(ref)
	if c == nil || ((c.IsPrivate || c.IsIM) && !c.isMember(BotUserID)) {
		return nil
	}
	return c
}

func conversationsInfo(w *Workspace, p params, _ string) (result, func()) {
	c := w.visibleChannelLocked(p["channel"])
	if c == nil {
		return fail("channel_not_found"), nil
	}
	return ok(result{"channel": w.channelJSONLocked(c)}), nil
}

// page applies Slack's cursor pagination to n items: limit (default
// def, max 1000) and an opaque cursor. It returns the bounds and the next
// cursor ("" at the end).
func page(p params, n, def int) (from, to int, next string, errRes result) {
	limit := def
	if s := p["limit"]; s != "" && s != "0" {
		l, err := strconv.Atoi(s)
		if err != nil || l < 0 {
			return 0, 0, "", fail("invalid_limit")
		}
		limit = min(l, 1000)
	}
	if cur := p["cursor"]; cur != "" {
		raw, err := base64.StdEncoding.DecodeString(cur)
		off, err2 := strconv.Atoi(strings.TrimPrefix(string(raw), "offset:"))
		if err != nil || err2 != nil || off < 0 || off > n {
			return 0, 0, "", fail("invalid_cursor")
		}
		from = off
	}
	to = min(from+limit, n)
	if to < n {
		next = base64.StdEncoding.EncodeToString([]byte("offset:" + strconv.Itoa(to)))
	}
	return from, to, next, nil
}

func conversationsMembers(w *Workspace, p params, _ string) (result, func()) {
	c := w.visibleChannelLocked(p["channel"])
	if c == nil {
		return fail("channel_not_found"), nil
	}
	from, to, next, errRes := page(p, len(c.Members), 100)
	if errRes != nil {
		return errRes, nil
	}
	return ok(result{
		"members":           slices.Clone(c.Members[from:to]),
		"response_metadata": map[string]any{"next_cursor": next},
	}), nil
}

func conversationsOpen(w *Workspace, p params, _ string) (result, func()) {
	if ch := p["channel"]; ch != "" {
		c := w.visibleChannelLocked(ch)
		if c == nil {
			return fail("channel_not_found"), nil
		}
		return ok(result{"channel": w.channelJSONLocked(c)}), nil
	}
	users := strings.Split(p["users"], ",")
	if p["users"] == "" {
		return fail("users_list_not_supplied"), nil
	}
	if len(users) > 1 {
		return fail("not_supported", "slacksim supports only 1:1 DMs with the bot"), nil
	}
	if _, ok := w.users[users[0]]; !ok {
		return fail("user_not_found"), nil
	}
	id := w.dmLocked(users[0])
	res := result{"channel": map[string]any{"id": id}}
	if boolParam(p["return_im"]) {
		res["channel"] = w.channelJSONLocked(w.channels[id])
	}
	return ok(res), nil
}

func conversationsJoin(w *Workspace, p params, _ string) (result, func()) {
	c := w.resolveChannelLocked(p["channel"])
	if c == nil || c.IsPrivate || c.IsIM {
		return fail("channel_not_found"), nil
	}
	if !c.isMember(BotUserID) {
		c.Members = append(c.Members, BotUserID)
	}
	return ok(result{"channel": w.channelJSONLocked(c)}), nil
}

func conversationsReplies(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	parent := w.findMessageLocked(c.ID, p["ts"])
	if parent == nil || parent.VisibleTo != "" {
		return fail("thread_not_found"), nil
	}
	if parent.ThreadTS != "" {
		parent = w.findMessageLocked(c.ID, parent.ThreadTS)
	}
	all := []*Message{parent}
	for _, m := range c.messages {
		if m.ThreadTS == parent.TS {
			all = append(all, m)
		}
	}
	return w.messagePageLocked(p, all, 1000), nil
}

func conversationsHistory(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	var top []*Message
	oldest := p["oldest"]
	for i := len(c.messages) - 1; i >= 0; i-- { // newest first, as Slack
		if m := c.messages[i]; m.ThreadTS == "" && (oldest == "" || tsAfter(m.TS, oldest)) {
			top = append(top, m)
		}
	}
	res := w.messagePageLocked(p, top, 100)
	if !boolParam(p["include_all_metadata"]) {
		// Slack returns message metadata only when asked.
		if msgs, ok := res["messages"].([]any); ok {
			for _, m := range msgs {
				delete(m.(map[string]any), "metadata")
			}
		}
	}
	return res, nil
}

// messagePageLocked answers one cursor page of msgs (limit and cursor from
// p, at most max per page) the way conversations.history and .replies do.
func (w *Workspace) messagePageLocked(p params, msgs []*Message, max int) result {
	from, to, next, errRes := page(p, len(msgs), max)
	if errRes != nil {
		return errRes
	}
	out := []any{}
	for _, m := range msgs[from:to] {
		out = append(out, w.messageJSONLocked(m))
	}
	return ok(result{
		"messages":          out,
		"has_more":          next != "",
		"response_metadata": map[string]any{"next_cursor": next},
	})
}

// conversationsList lists the conversations of the kinds types names
// (default public_channel, as Slack's): every public channel, the private
// channels and DMs the bot is in.
func conversationsList(w *Workspace, p params, _ string) (result, func()) {
	kinds := map[string]bool{}
	for _, t := range strings.Split(cmp.Or(p["types"], "public_channel"), ",") {
		switch t = strings.TrimSpace(t); t {
		case "public_channel", "private_channel", "im", "mpim":
			kinds[t] = true
		default:
			return fail("invalid_types"), nil
		}
	}
	var list []*channel
	for _, id := range w.chanOrder {
		c := w.channels[id]
		kind := "public_channel"
		switch {
		case c.IsIM:
			kind = "im"
		case c.IsPrivate:
			kind = "private_channel"
		}
		if !kinds[kind] || (c.IsPrivate || c.IsIM) && !c.isMember(BotUserID) {
			continue
		}
		list = append(list, c)
	}
	from, to, next, errRes := page(p, len(list), 100)
	if errRes != nil {
		return errRes, nil
	}
	out := []any{}
	for _, c := range list[from:to] {
		out = append(out, w.channelJSONLocked(c))
	}
	return ok(result{"channels": out, "response_metadata": map[string]any{"next_cursor": next}}), nil
}

func usersConversations(w *Workspace, p params, _ string) (result, func()) {
	user := p["user"]
	if user == "" {
		user = BotUserID
	}
	out := []any{}
	for _, id := range w.chanOrder {
		if c := w.channels[id]; c.isMember(user) && c.isMember(BotUserID) {
			out = append(out, w.channelJSONLocked(c))
		}
	}
	return ok(result{"channels": out, "response_metadata": map[string]any{"next_cursor": ""}}), nil
}
