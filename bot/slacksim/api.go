package slacksim

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
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
	"users.list":              {handle: usersList},
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
	w.calls.add(call)
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
