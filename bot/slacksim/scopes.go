package slacksim

import (
	"strings"
)

// scopeRule says which bot token scope a Web API method needs for the call
// p: "" when the method needs none. Rules run with Workspace.mu held.
type scopeRule func(w *Workspace, p params) string

// scope is a rule for a method that needs the same scope on every call.
func scope(s string) scopeRule { return func(*Workspace, params) string { return s } }

// byKind is a rule for a Conversations API method whose scope depends on
// the kind of conversation named by its channel parameter: verb is "read",
// "history" or "write", giving channels:verb (public), groups:verb
// (private) or im:verb (a DM). A channel the workspace cannot resolve needs
// no scope here: the method answers channel_not_found.
func byKind(verb string) scopeRule {
	return func(w *Workspace, p params) string {
		c := w.resolveChannelLocked(p["channel"])
		if c == nil {
			return ""
		}
		return kindScope(c, verb)
	}
}

// kindScope is the scope family:verb for conversation c.
func kindScope(c *channel, verb string) string {
	switch {
	case c.IsIM:
		return "im:" + verb
	case c.IsPrivate:
		return "groups:" + verb
	}
	return "channels:" + verb
}

// byTypes is the rule of the listing methods (conversations.list,
// users.conversations): the read scope of every type listed in the types
// parameter (default public_channel); the first one missing is needed.
func byTypes(w *Workspace, p params) string {
	types := p["types"]
	if types == "" {
		types = "public_channel"
	}
	for _, t := range strings.Split(types, ",") {
		s := map[string]string{"public_channel": "channels:read", "private_channel": "groups:read", "im": "im:read", "mpim": "mpim:read"}[strings.TrimSpace(t)]
		if s != "" && !w.opts.Manifest.grants(s) {
			return s
		}
	}
	return ""
}

// methodScopes are the bot token scopes of the Web API methods the
// workspace implements, as Slack's method reference pages
// (docs.slack.dev/reference/methods/…) list them. A method missing here
// needs no scope (auth.test, chat.getPermalink, views.*: the token is
// enough). apps.connections.open takes the app-level token, whose scope
// (connections:write) is not the bot's.
var methodScopes = map[string]scopeRule{
	"chat.postMessage":        scope("chat:write"),
	"chat.update":             scope("chat:write"),
	"chat.postEphemeral":      scope("chat:write"),
	"chat.delete":             scope("chat:write"),
	"conversations.info":      byKind("read"),
	"conversations.members":   byKind("read"),
	"conversations.history":   byKind("history"),
	"conversations.replies":   byKind("history"),
	"conversations.open":      scope("im:write"), // slacksim opens 1:1 DMs only
	"conversations.join":      scope("channels:join"),
	"conversations.list":      byTypes,
	"users.conversations":     byTypes,
	"usergroups.list":         scope("usergroups:read"),
	"usergroups.users.list":   scope("usergroups:read"),
	"usergroups.users.update": scope("usergroups:write"),
	"users.info":              scope("users:read"),
	"users.list":              scope("users:read"),
	"bots.info":               scope("users:read"),
	"team.info":               scope("team:read"),
}

// missingScopeLocked returns Slack's missing_scope answer when the app's
// manifest does not grant the scope method needs for p, else nil. Without
// Options.Manifest every scope is granted.
func (w *Workspace) missingScopeLocked(method string, p params) result {
	m := w.opts.Manifest
	rule, ok := methodScopes[method]
	if m == nil || !ok {
		return nil
	}
	need := rule(w, p)
	if need == "" || m.grants(need) {
		return nil
	}
	return result{"ok": false, "error": "missing_scope", "needed": need, "provided": strings.Join(m.Scopes, ",")}
}
