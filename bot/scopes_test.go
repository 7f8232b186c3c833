package bot_test

import (
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// slackCalls is every Slack Web API method the bot calls, by the slack-go
// method of bot.Slack (the roles Messages, Views and Directory, and
// auth.test) that calls it, with the bot token scopes it needs as Slack's
// method pages (docs.slack.dev/reference/methods/…) list them. Where the
// scope depends on the kind of conversation, the kinds the bot uses: the
// approvals channel is public or private (channels:… or groups:…).
var slackCalls = map[string]struct {
	method string
	scopes []string
}{
	"PostMessageContext":            {"chat.postMessage", []string{"chat:write"}},
	"UpdateMessageContext":          {"chat.update", []string{"chat:write"}},
	"PostEphemeralContext":          {"chat.postEphemeral", []string{"chat:write"}},
	"DeleteMessageContext":          {"chat.delete", []string{"chat:write"}},
	"GetPermalinkContext":           {"chat.getPermalink", nil},
	"GetConversationHistoryContext": {"conversations.history", []string{"channels:history", "groups:history"}},
	"OpenViewContext":               {"views.open", nil},
	"PublishViewContext":            {"views.publish", nil},
	"GetUsersInConversationContext": {"conversations.members", []string{"channels:read", "groups:read"}},
	"GetConversationInfoContext":    {"conversations.info", []string{"channels:read", "groups:read"}},
	"GetUserGroupMembersContext":    {"usergroups.users.list", []string{"usergroups:read"}},
	"GetUserGroupsContext":          {"usergroups.list", []string{"usergroups:read"}},
	// users:read.email: the profile email a login at the identity provider
	// must match (step-up votes with oidc).
	"GetUserInfoContext": {"users.info", []string{"users:read", "users:read.email"}},
	"AuthTestContext":    {"auth.test", nil},
	// bot.Lookups, countersign check --slack: public and private channels.
	"GetUsersContext":         {"users.list", []string{"users:read"}},
	"GetConversationsContext": {"conversations.list", []string{"channels:read", "groups:read"}},
}

// slackEvents are the bot events the bot handles, with the scope each
// needs (Slack's event pages), and what else the app needs a scope for.
var slackEvents = map[string][]string{
	"app_mention":             {"app_mentions:read"},
	"message.im":              {"im:history"},
	"app_home_opened":         nil,
	"member_joined_channel":   {"channels:read", "groups:read"},
	"member_left_channel":     {"channels:read", "groups:read"},
	"subteam_members_changed": {"usergroups:read"},
}

// otherScopes are scopes for what is neither a Web API call nor an event:
// the /countersign slash command. (Socket Mode's apps.connections.open
// uses the app-level token's connections:write, not a bot scope; a click's
// response_url needs no token.)
var otherScopes = []string{"commands"}

// TestManifestGrantsExactlyWhatTheBotCalls: every slack-go method the bot's
// Slack roles (and countersign check --slack's bot.Lookups) hold is listed with its scopes (a new one fails here until it
// is), and manifest.yml grants exactly the scopes of those calls, of the
// events it subscribes to and of the slash command: none missing (Slack
// would answer missing_scope), none more.
func TestManifestGrantsExactlyWhatTheBotCalls(t *testing.T) {
	need := map[string]bool{}
	held := map[string]bool{}
	for _, roles := range []reflect.Type{reflect.TypeFor[bot.Slack](), reflect.TypeFor[bot.Lookups]()} {
		for i := range roles.NumMethod() {
			name := roles.Method(i).Name
			held[name] = true
			call, ok := slackCalls[name]
			if !ok {
				t.Errorf("%s has %s, which slackCalls does not list: add the Slack method it calls and its scopes (docs.slack.dev/reference/methods), then grant them in manifest.yml and justify them in docs/slack.md", roles, name)
				continue
			}
			for _, s := range call.scopes {
				need[s] = true
			}
		}
	}
	for name := range slackCalls {
		if !held[name] {
			t.Errorf("slackCalls lists %s, which neither bot.Slack nor bot.Lookups has", name)
		}
	}
	m := slacksimtest.Manifest(t)
	events := slices.Clone(m.Events)
	sort.Strings(events)
	var wantEvents []string
	for ev, scopes := range slackEvents {
		wantEvents = append(wantEvents, ev)
		for _, s := range scopes {
			need[s] = true
		}
	}
	sort.Strings(wantEvents)
	if !slices.Equal(events, wantEvents) {
		t.Errorf("manifest bot_events = %v, want %v", events, wantEvents)
	}
	for _, s := range otherScopes {
		need[s] = true
	}
	var want []string
	for s := range need {
		want = append(want, s)
	}
	sort.Strings(want)
	got := slices.Clone(m.Scopes)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("manifest.yml bot scopes = %v, want exactly %v", got, want)
	}
}
