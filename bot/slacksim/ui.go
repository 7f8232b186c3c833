package slacksim

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

//go:embed ui
var uiFiles embed.FS

// Handler serves the Web API under /api/, Socket Mode at /ws, response_urls
// under /response/, and the browser UI at / with its JSON and Server-Sent
// Events endpoints under /ui/.
func (w *Workspace) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/", w.serveAPI)
	mux.HandleFunc("/ws", w.serveSocket)
	mux.HandleFunc("/response/", w.serveResponseURL)
	mux.HandleFunc("GET /ui/state", w.uiState)
	mux.HandleFunc("GET /ui/events", w.uiEvents)
	mux.HandleFunc("POST /ui/post", w.uiPost)
	mux.HandleFunc("POST /ui/click", w.uiClick)
	mux.HandleFunc("POST /ui/submit", w.uiSubmit)
	mux.HandleFunc("POST /ui/close", w.uiClose)
	mux.HandleFunc("POST /ui/home", w.uiHome)
	mux.HandleFunc("GET /archives/{channel}/{ts}", w.uiPermalink)
	static, _ := fs.Sub(uiFiles, "ui")
	mux.Handle("/", http.FileServerFS(static))
	return mux
}

// uiUser is a user as the page sees it.
type uiUser struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	RealName string `json:"real_name"`
	IsBot    bool   `json:"is_bot"`
}

// uiChannel is a sidebar entry.
type uiChannel struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	IsPrivate bool   `json:"is_private"`
	IsIM      bool   `json:"is_im"`
}

// uiMessage is a message as the page renders it.
type uiMessage struct {
	TS          string          `json:"ts"`
	ThreadTS    string          `json:"thread_ts,omitempty"`
	User        string          `json:"user"`
	IsBot       bool            `json:"is_bot"`
	Text        string          `json:"text"`
	Blocks      json.RawMessage `json:"blocks,omitempty"`
	ReplyCount  int             `json:"reply_count"`
	LatestReply string          `json:"latest_reply,omitempty"`
	Ephemeral   bool            `json:"ephemeral"`
}

// uiView is a modal or home view as the page renders it.
type uiView struct {
	ID       string            `json:"id"`
	Hash     string            `json:"hash"`
	Title    string            `json:"title"`
	Submit   string            `json:"submit"`
	Close    string            `json:"close"`
	Blocks   json.RawMessage   `json:"blocks"`
	Errors   map[string]string `json:"errors"`
	Depth    int               `json:"depth"`
	Previous string            `json:"previous,omitempty"`
}

type uiGroup struct {
	ID     string `json:"id"`
	Handle string `json:"handle"`
}

type uiThread struct {
	Parent  uiMessage   `json:"parent"`
	Replies []uiMessage `json:"replies"`
}

type uiStateResponse struct {
	Team     string      `json:"team"`
	BotID    string      `json:"bot_id"`
	BotName  string      `json:"bot_name"`
	Me       string      `json:"me"`
	Users    []uiUser    `json:"users"`
	Groups   []uiGroup   `json:"groups"` // user groups, so <!subteam^ID> reads as @handle
	Channels []uiChannel `json:"channels"`
	Channel  *uiChannel  `json:"channel"`
	Messages []uiMessage `json:"messages"`
	Thread   *uiThread   `json:"thread"`
	Modal    *uiView     `json:"modal"`
	Home     *uiView     `json:"home"`
	Version  int64       `json:"version"`
}

func toUIMessage(m *Message, isBot bool) uiMessage {
	return uiMessage{
		TS: m.TS, ThreadTS: m.ThreadTS, User: m.User, IsBot: isBot || m.BotID != "", Text: m.Text,
		Blocks: m.Blocks, ReplyCount: m.ReplyCount, Ephemeral: m.VisibleTo != "",
	}
}

func toUIView(v *viewState, depth int) *uiView {
	e := v.export()
	return &uiView{
		ID: e.ID, Hash: e.Hash, Title: e.Title, Submit: e.Submit, Close: e.Close,
		Blocks: e.Blocks, Errors: e.Errors, Depth: depth, Previous: e.PreviousViewID,
	}
}

// uiState answers GET /ui/state?user=&channel=&thread=: everything the page
// shows for one person.
func (w *Workspace) uiState(rw http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	w.mu.Lock()
	defer w.mu.Unlock()
	me := q.Get("user")
	if u, ok := w.users[me]; !ok || u.IsBot {
		me = ""
		for _, id := range w.userOrder {
			if !w.users[id].IsBot {
				me = id
				break
			}
		}
	}
	st := uiStateResponse{Team: w.opts.TeamName, BotID: BotUserID, BotName: w.opts.BotName, Me: me, Version: w.version}
	for _, id := range w.userOrder {
		u := w.users[id]
		st.Users = append(st.Users, uiUser{ID: u.ID, Name: u.Name, RealName: u.RealName, IsBot: u.IsBot})
	}
	for _, g := range w.groups {
		st.Groups = append(st.Groups, uiGroup{ID: g.ID, Handle: g.Handle})
	}
	slices.SortFunc(st.Groups, func(a, b uiGroup) int { return strings.Compare(a.ID, b.ID) })
	if me == "" {
		writeJSON(rw, http.StatusOK, st)
		return
	}
	dm := w.dmLocked(me)
	for _, id := range w.chanOrder {
		c := w.channels[id]
		if !c.isMember(me) || (c.IsIM && id != dm) {
			continue
		}
		name := c.Name
		if c.IsIM {
			name = w.opts.BotName
		}
		st.Channels = append(st.Channels, uiChannel{ID: c.ID, Name: name, IsPrivate: c.IsPrivate, IsIM: c.IsIM})
	}
	if c, ok := w.channels[q.Get("channel")]; ok && c.isMember(me) {
		idx := slices.IndexFunc(st.Channels, func(x uiChannel) bool { return x.ID == c.ID })
		if idx >= 0 {
			st.Channel = &st.Channels[idx]
		}
		st.Messages, st.Thread = w.uiMessagesLocked(c, me, q.Get("thread"))
	}
	for i, id := range w.stacks[me] {
		if i == len(w.stacks[me])-1 {
			st.Modal = toUIView(w.views[id], i+1)
		}
	}
	if id, ok := w.homes[me]; ok {
		st.Home = toUIView(w.views[id], 0)
	}
	writeJSON(rw, http.StatusOK, st)
}

// uiMessagesLocked returns the top-level messages of c that me sees
// (ephemerals for me included) and the thread under threadTS.
func (w *Workspace) uiMessagesLocked(c *channel, me, threadTS string) ([]uiMessage, *uiThread) {
	all := slices.Clone(c.messages)
	for _, e := range c.ephemerals {
		if e.VisibleTo == me {
			all = append(all, e)
		}
	}
	slices.SortStableFunc(all, func(a, b *Message) int { return strings.Compare(a.TS, b.TS) })
	var top []uiMessage
	var thread *uiThread
	for _, m := range all {
		isBot := w.users[m.User] != nil && w.users[m.User].IsBot
		um := toUIMessage(m, isBot)
		if m.ThreadTS == "" {
			if m.ReplyCount > 0 {
				_, um.LatestReply = w.threadInfoLocked(m)
			}
			top = append(top, um)
			if m.TS == threadTS {
				thread = &uiThread{Parent: um, Replies: []uiMessage{}}
			}
		}
	}
	if thread != nil {
		for _, m := range all {
			if m.ThreadTS == threadTS {
				isBot := w.users[m.User] != nil && w.users[m.User].IsBot
				thread.Replies = append(thread.Replies, toUIMessage(m, isBot))
			}
		}
	}
	if top == nil {
		top = []uiMessage{}
	}
	return top, thread
}

// uiEvents streams a Server-Sent Event whenever the workspace changes. It
// returns when the client goes away or the workspace closes.
func (w *Workspace) uiEvents(rw http.ResponseWriter, r *http.Request) {
	flusher, ok := rw.(http.Flusher)
	if !ok {
		http.Error(rw, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	rw.Header().Set("Cache-Control", "no-cache")
	rw.WriteHeader(http.StatusOK)
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		ch, version := w.Changed()
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return
		}
		fmt.Fprintf(rw, "data: {\"version\":%d}\n\n", version)
		flusher.Flush()
		select {
		case <-ch:
		case <-keepalive.C:
			fmt.Fprint(rw, ": keepalive\n\n")
		case <-r.Context().Done():
			return
		}
	}
}

type uiRequest struct {
	User     string                    `json:"user"`
	Channel  string                    `json:"channel"`
	Text     string                    `json:"text"`
	ThreadTS string                    `json:"thread_ts"`
	TS       string                    `json:"ts"`
	ViewID   string                    `json:"view_id"`
	ActionID string                    `json:"action_id"`
	Value    string                    `json:"value"`
	Values   map[string]map[string]any `json:"values"`
}

func decodeUI(rw http.ResponseWriter, r *http.Request) (uiRequest, bool) {
	var req uiRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(rw, http.StatusBadRequest, fail("invalid_json"))
		return req, false
	}
	return req, true
}

func uiResult(rw http.ResponseWriter, err error, fields result) {
	if err != nil {
		code := "internal_error"
		switch {
		case errors.Is(err, ErrNotFound):
			code = "not_found"
		case errors.Is(err, ErrNotInChannel):
			code = "not_in_channel"
		case errors.Is(err, ErrNoAck):
			code = "app_did_not_respond"
		}
		writeJSON(rw, http.StatusOK, fail(code, err.Error()))
		return
	}
	writeJSON(rw, http.StatusOK, ok(fields))
}

var mentionRE = regexp.MustCompile(`(^|[\s(])@([A-Za-z0-9._-]+)`)

// encodeMentions turns "@name" into "<@ID>" for known users, as Slack's
// composer does.
func (w *Workspace) encodeMentions(text string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return mentionRE.ReplaceAllStringFunc(text, func(s string) string {
		sub := mentionRE.FindStringSubmatch(s)
		for _, id := range w.userOrder {
			if u := w.users[id]; strings.EqualFold(u.Name, sub[2]) {
				return sub[1] + "<@" + u.ID + ">"
			}
		}
		return s
	})
}

// escapeText applies Slack's escaping of &, < and > to typed text, keeping
// the <@ID> mentions we just made.
func escapeText(s string) string {
	s = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
	return mentionEscRE.ReplaceAllString(s, "<@$1>")
}

var mentionEscRE = regexp.MustCompile(`&lt;@([UW][A-Z0-9]+)&gt;`)

func (w *Workspace) uiPost(rw http.ResponseWriter, r *http.Request) {
	req, ok2 := decodeUI(rw, r)
	if !ok2 {
		return
	}
	text := strings.TrimSpace(req.Text)
	if strings.HasPrefix(text, "/") && req.ThreadTS == "" {
		cmd, args, _ := strings.Cut(text, " ")
		uiResult(rw, w.SlashCommand(req.User, req.Channel, cmd, strings.TrimSpace(args)), nil)
		return
	}
	ts, err := w.PostMessage(req.User, req.Channel, escapeText(w.encodeMentions(text)), req.ThreadTS)
	uiResult(rw, err, result{"ts": ts})
}

func (w *Workspace) uiClick(rw http.ResponseWriter, r *http.Request) {
	req, ok2 := decodeUI(rw, r)
	if !ok2 {
		return
	}
	if req.ViewID != "" {
		uiResult(rw, w.ClickView(req.User, req.ViewID, req.ActionID), nil)
		return
	}
	uiResult(rw, w.Choose(req.User, req.Channel, req.TS, req.ActionID, req.Value), nil)
}

func (w *Workspace) uiSubmit(rw http.ResponseWriter, r *http.Request) {
	req, ok2 := decodeUI(rw, r)
	if !ok2 {
		return
	}
	res, err := w.SubmitView(req.User, req.ViewID, req.Values)
	uiResult(rw, err, result{"response_action": res.ResponseAction, "errors": res.Errors, "closed": res.Closed})
}

func (w *Workspace) uiClose(rw http.ResponseWriter, r *http.Request) {
	req, ok2 := decodeUI(rw, r)
	if !ok2 {
		return
	}
	uiResult(rw, w.CloseView(req.User, req.ViewID), nil)
}

func (w *Workspace) uiHome(rw http.ResponseWriter, r *http.Request) {
	req, ok2 := decodeUI(rw, r)
	if !ok2 {
		return
	}
	w.OpenHome(req.User)
	uiResult(rw, nil, nil)
}

// uiPermalink sends a chat.getPermalink link to the channel (and thread) in
// the page.
func (w *Workspace) uiPermalink(rw http.ResponseWriter, r *http.Request) {
	ch := r.PathValue("channel")
	thread := r.URL.Query().Get("thread_ts")
	if thread == "" {
		if p := strings.TrimPrefix(r.PathValue("ts"), "p"); len(p) > 6 {
			thread = p[:len(p)-6] + "." + p[len(p)-6:]
		}
	}
	http.Redirect(rw, r, "/?channel="+ch+"&thread="+thread, http.StatusFound)
}
