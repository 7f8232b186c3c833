package slacksim

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// params are the decoded parameters of one Web API call. JSON fields that
// are not strings hold their JSON text, so "blocks" and "view" read the
// same whichever encoding the client used.
type params map[string]string

// result is a Web API response body.
type result map[string]any

func ok(fields result) result {
	out := result{"ok": true}
	for k, v := range fields {
		out[k] = v
	}
	return out
}

func fail(code string, hints ...string) result {
	out := result{"ok": false, "error": code}
	if len(hints) > 0 {
		out["response_metadata"] = map[string]any{"messages": hints}
	}
	return out
}

// apiMethod handles one Web API method. It runs with Workspace.mu held; the
// returned after func (may be nil) runs once the lock is released and is
// where events are delivered.
type apiMethod func(w *Workspace, p params, base string) (res result, after func())

type methodSpec struct {
	handle   apiMethod
	appToken bool // needs the xapp- token instead of the bot token
}

// apiMethods are the Web API methods the workspace implements.
var apiMethods = map[string]methodSpec{
	"api.test":                {handle: apiTest},
	"auth.test":               {handle: authTest},
	"chat.postMessage":        {handle: chatPostMessage},
	"chat.update":             {handle: chatUpdate},
	"chat.postEphemeral":      {handle: chatPostEphemeral},
	"chat.delete":             {handle: chatDelete},
	"chat.getPermalink":       {handle: chatGetPermalink},
	"conversations.info":      {handle: conversationsInfo},
	"conversations.members":   {handle: conversationsMembers},
	"conversations.open":      {handle: conversationsOpen},
	"conversations.replies":   {handle: conversationsReplies},
	"conversations.history":   {handle: conversationsHistory},
	"usergroups.list":         {handle: usergroupsList},
	"usergroups.users.list":   {handle: usergroupsUsersList},
	"users.info":              {handle: usersInfo},
	"views.open":              {handle: viewsOpen},
	"views.push":              {handle: viewsPush},
	"views.update":            {handle: viewsUpdate},
	"views.publish":           {handle: viewsPublish},
	"apps.connections.open":   {handle: appsConnectionsOpen, appToken: true},
	"bots.info":               {handle: botsInfo},
	"conversations.join":      {handle: conversationsJoin},
	"team.info":               {handle: teamInfo},
	"users.conversations":     {handle: usersConversations},
	"conversations.list":      {handle: conversationsList},
	"usergroups.users.update": {handle: usergroupsUsersUpdate},
}

// serveAPI answers /api/{method}.
func (w *Workspace) serveAPI(rw http.ResponseWriter, r *http.Request) {
	method := strings.TrimPrefix(r.URL.Path, "/api/")
	p, token, err := decodeParams(r)
	if err != nil {
		writeJSON(rw, http.StatusOK, fail("invalid_form_data"))
		return
	}
	base := w.requestBase(r)

	w.mu.Lock()
	call := Call{Method: method, Params: map[string]string(p), At: w.now()}
	res, after, retryAfter := w.dispatchLocked(method, p, token, base)
	if retryAfter > 0 {
		call.Error = "ratelimited"
	} else if e, _ := res["error"].(string); e != "" {
		call.Error = e
	}
	w.calls = append(w.calls, call)
	w.bumpLocked()
	w.mu.Unlock()

	if retryAfter > 0 {
		rw.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		writeJSON(rw, http.StatusTooManyRequests, fail("ratelimited"))
		return
	}
	if after != nil {
		after()
	}
	w.holds.wait(r.Context(), method, p)
	if e, _ := res["error"].(string); e != "" {
		w.log.Debug("slacksim api error", "method", method, "error", e)
	}
	writeJSON(rw, http.StatusOK, res)
}

// dispatchLocked checks the token and rate limit and runs the method.
func (w *Workspace) dispatchLocked(method string, p params, token, base string) (result, func(), int) {
	spec, known := apiMethods[method]
	if !known {
		return fail("unknown_method"), nil, 0
	}
	switch {
	case token == "":
		return fail("not_authed"), nil, 0
	case token != w.opts.BotToken && token != w.opts.AppToken:
		return fail("invalid_auth"), nil, 0
	case spec.appToken != (token == w.opts.AppToken):
		return fail("not_allowed_token_type"), nil, 0
	}
	if ra := w.rateLimitedLocked(method, p); ra > 0 {
		return nil, nil, ra
	}
	if res := w.missingScopeLocked(method, p); res != nil {
		return res, nil, 0
	}
	res, after := spec.handle(w, p, base)
	return res, after, 0
}

// rateLimitedLocked returns a Retry-After in seconds when the call must be
// refused with 429, else 0.
func (w *Workspace) rateLimitedLocked(method string, p params) int {
	if f, ok := w.forced[method]; ok && f.n > 0 {
		f.n--
		w.forced[method] = f
		return max(f.retryAfter, 1)
	}
	lim, ok := w.opts.RateLimits[method]
	if !ok || lim.Every <= 0 {
		return 0
	}
	key := method + "\x00" + p["channel"]
	now := w.now()
	if last, seen := w.rateLast[key]; seen && now.Sub(last) < lim.Every {
		return max(lim.RetryAfter, 1)
	}
	w.rateLast[key] = now
	return 0
}

// decodeParams reads form, query or JSON parameters and the token (from
// the body or an Authorization: Bearer header).
func decodeParams(r *http.Request) (params, string, error) {
	p := params{}
	for k, v := range r.URL.Query() {
		p[k] = v[0]
	}
	ctype, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		return nil, "", err
	}
	switch ctype {
	case "application/json":
		if len(strings.TrimSpace(string(body))) > 0 {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(body, &m); err != nil {
				return nil, "", err
			}
			for k, raw := range m {
				var s string
				if json.Unmarshal(raw, &s) == nil {
					p[k] = s
				} else {
					p[k] = string(raw)
				}
			}
		}
	default:
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, "", err
		}
		for k, v := range vals {
			p[k] = v[0]
		}
	}
	token := p["token"]
	delete(p, "token")
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		token = strings.TrimPrefix(h, "Bearer ")
	}
	return p, token, nil
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json; charset=utf-8")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(v)
}

// requestBase is the workspace base URL, or one derived from r.
func (w *Workspace) requestBase(r *http.Request) string {
	if b := w.BaseURL(); b != "" {
		return b
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func boolParam(s string) bool { return s == "true" || s == "1" }

// tsAfter reports whether message timestamp ts is later than oldest.
func tsAfter(ts, oldest string) bool {
	a, err1 := strconv.ParseFloat(ts, 64)
	b, err2 := strconv.ParseFloat(oldest, 64)
	return err1 != nil || err2 != nil || a > b
}

// ---- auth, team, bots ----

func apiTest(w *Workspace, p params, _ string) (result, func()) {
	return ok(result{"args": p}), nil
}

func authTest(w *Workspace, _ params, base string) (result, func()) {
	return ok(result{
		"url":                   base + "/",
		"team":                  w.opts.TeamName,
		"user":                  w.opts.BotName,
		"team_id":               TeamID,
		"user_id":               BotUserID,
		"bot_id":                BotID,
		"is_enterprise_install": false,
	}), nil
}

func teamInfo(w *Workspace, _ params, base string) (result, func()) {
	return ok(result{"team": map[string]any{"id": TeamID, "name": w.opts.TeamName, "domain": "countersign-sim", "url": base + "/"}}), nil
}

func botsInfo(w *Workspace, p params, _ string) (result, func()) {
	if p["bot"] != "" && p["bot"] != BotID {
		return fail("bot_not_found"), nil
	}
	return ok(result{"bot": map[string]any{"id": BotID, "name": w.opts.BotName, "app_id": AppID, "user_id": BotUserID, "deleted": false}}), nil
}

// ---- chat ----

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
	c.messages = append(c.messages, m)
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
	for _, r := range w.channels[parent.Channel].messages {
		if r.ThreadTS == parent.TS {
			if !slices.Contains(users, r.User) {
				users = append(users, r.User)
			}
			latest = r.TS
		}
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
	c.ephemerals = append(c.ephemerals, m)
	return ok(result{"message_ts": m.TS}), nil
}

func chatDelete(w *Workspace, p params, _ string) (result, func()) {
	c, errRes := w.botChannelLocked(p["channel"])
	if errRes != nil {
		return errRes, nil
	}
	i := slices.IndexFunc(c.messages, func(m *Message) bool { return m.TS == p["ts"] })
	if i < 0 {
		return fail("message_not_found"), nil
	}
	m := c.messages[i]
	if m.User != BotUserID {
		return fail("cant_delete_message"), nil
	}
	c.messages = slices.Delete(c.messages, i, i+1)
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

// ---- conversations ----

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

func conversationsList(w *Workspace, p params, _ string) (result, func()) {
	var list []*channel
	for _, id := range w.chanOrder {
		c := w.channels[id]
		if c.IsIM || (c.IsPrivate && !c.isMember(BotUserID)) {
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

// ---- users and groups ----

func (w *Workspace) userJSONLocked(u *User) map[string]any {
	return map[string]any{
		"id":        u.ID,
		"team_id":   TeamID,
		"name":      u.Name,
		"real_name": u.RealName,
		"deleted":   false,
		"is_bot":    u.IsBot,
		"is_admin":  false,
		"tz":        "UTC",
		"tz_offset": 0,
		"profile": map[string]any{
			"real_name":    u.RealName,
			"display_name": u.Name,
			"team":         TeamID,
		},
	}
}

func usersInfo(w *Workspace, p params, _ string) (result, func()) {
	u, ok2 := w.users[p["user"]]
	if !ok2 {
		return fail("user_not_found"), nil
	}
	return ok(result{"user": w.userJSONLocked(u)}), nil
}

func usergroupsUsersList(w *Workspace, p params, _ string) (result, func()) {
	g, found := w.groups[p["usergroup"]]
	if !found {
		return fail("no_such_subteam"), nil
	}
	return ok(result{"users": slices.Clone(g.Users)}), nil
}

func usergroupsUsersUpdate(w *Workspace, p params, _ string) (result, func()) {
	g, found := w.groups[p["usergroup"]]
	if !found {
		return fail("no_such_subteam"), nil
	}
	after := w.setGroupUsersLocked(g, strings.Split(p["users"], ","))
	return ok(result{"usergroup": groupJSON(g)}), after
}

func groupJSON(g *Usergroup) map[string]any {
	return map[string]any{
		"id": g.ID, "team_id": TeamID, "handle": g.Handle, "name": g.Name,
		"is_usergroup": true, "users": slices.Clone(g.Users), "user_count": len(g.Users),
	}
}

func usergroupsList(w *Workspace, _ params, _ string) (result, func()) {
	out := []any{}
	ids := make([]string, 0, len(w.groups))
	for id := range w.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out = append(out, groupJSON(w.groups[id]))
	}
	return ok(result{"usergroups": out}), nil
}

// ---- views ----

// parseViewLocked decodes and validates the view parameter.
func (w *Workspace) parseViewLocked(raw string) (map[string]any, result) {
	var def map[string]any
	if raw == "" {
		return nil, fail("invalid_arguments", "[ERROR] missing required field: view")
	}
	if err := json.Unmarshal([]byte(raw), &def); err != nil || def == nil {
		return nil, fail("invalid_arguments", "[ERROR] view must be a JSON object")
	}
	if msgs := validateView(def); len(msgs) > 0 {
		return nil, fail("invalid_arguments", msgs...)
	}
	blocks, _ := def["blocks"].([]any)
	ensureIDs(blocks, func(prefix string) string { return w.newIDLocked(prefix) })
	return def, nil
}

// useTriggerLocked consumes a trigger_id, answering Slack's error if it is
// unknown, already used or older than 3 seconds.
func (w *Workspace) useTriggerLocked(id string) (string, result) {
	t, found := w.triggers[id]
	switch {
	case id == "" || !found:
		return "", fail("invalid_trigger_id")
	case t.used:
		return "", fail("exchanged_trigger_id")
	case w.now().Sub(t.issued) > triggerTTL:
		return "", fail("expired_trigger_id")
	}
	t.used = true
	return t.user, nil
}

// triggerTTL is how long a trigger_id may be exchanged after issue.
const triggerTTL = 3 * time.Second

// newTriggerLocked issues a trigger_id for user.
func (w *Workspace) newTriggerLocked(user string) string {
	w.seq++
	id := fmt.Sprintf("%d.%s.%012x", w.seq, TeamID, uint64(w.seq)*0x9E3779B97F4A7C15>>16)
	w.triggers[id] = &trigger{user: user, issued: w.now()}
	return id
}

func viewsOpen(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	if def["type"] != "modal" {
		return fail("invalid_arguments", "[ERROR] views.open requires a modal [json-pointer:/view/type]"), nil
	}
	user, errRes := w.useTriggerLocked(p["trigger_id"])
	if errRes != nil {
		return errRes, nil
	}
	if len(w.stacks[user]) > 0 { // a new modal replaces whatever was open
		delete(w.stacks, user)
	}
	v := w.newViewLocked(user, def)
	v.rootID = v.id
	w.stacks[user] = []string{v.id}
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func viewsPush(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	user, errRes := w.useTriggerLocked(p["trigger_id"])
	if errRes != nil {
		return errRes, nil
	}
	stack := w.stacks[user]
	if len(stack) == 0 {
		return fail("not_found", "[ERROR] no modal is open to push onto"), nil
	}
	if len(stack) >= 3 {
		return fail("push_limit_reached"), nil
	}
	v := w.newViewLocked(user, def)
	v.rootID = stack[0]
	v.prevID = stack[len(stack)-1]
	w.stacks[user] = append(stack, v.id)
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func viewsUpdate(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	v := w.findViewLocked(p["view_id"], p["external_id"])
	if v == nil || !w.isOpenLocked(v) {
		return fail("not_found"), nil
	}
	if h := p["hash"]; h != "" && h != v.hash {
		return fail("hash_conflict"), nil
	}
	if t, _ := def["type"].(string); t != v.kind {
		return fail("invalid_arguments", "[ERROR] view type cannot change [json-pointer:/view/type]"), nil
	}
	w.replaceViewLocked(v, def)
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func (w *Workspace) replaceViewLocked(v *viewState, def map[string]any) {
	v.def = def
	if ext, _ := def["external_id"].(string); ext != "" {
		v.externalID = ext
	}
	v.hash = w.newHashLocked()
	v.errors = nil
}

func viewsPublish(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	if def["type"] != "home" {
		return fail("invalid_arguments", "[ERROR] views.publish requires a home view [json-pointer:/view/type]"), nil
	}
	user := p["user_id"]
	if _, found := w.users[user]; !found {
		return fail("user_not_found"), nil
	}
	if id, found := w.homes[user]; found {
		v := w.views[id]
		if h := p["hash"]; h != "" && h != v.hash {
			return fail("hash_conflict"), nil
		}
		w.replaceViewLocked(v, def)
		return ok(result{"view": v.json(nil)}), nil
	}
	v := w.newViewLocked(user, def)
	v.rootID = v.id
	w.homes[user] = v.id
	return ok(result{"view": v.json(nil)}), nil
}

// ---- socket mode ----

func appsConnectionsOpen(w *Workspace, _ params, base string) (result, func()) {
	if w.hub.count() >= maxConnections {
		return fail("too_many_websockets"), nil
	}
	ticket := w.newIDLocked("tk")
	w.hub.addTicket(ticket)
	wsBase := "ws" + strings.TrimPrefix(base, "http")
	return ok(result{"url": wsBase + "/ws?ticket=" + ticket}), nil
}
