package slacksim_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// callRaw posts one Web API call with the bot token and decodes Slack's
// answer as JSON, so fields slack-go drops (needed, provided) are seen.
func callRaw(t *testing.T, ws *slacksim.Workspace, method string, form url.Values) map[string]any {
	t.Helper()
	form.Set("token", "xoxb-sim")
	resp, err := http.PostForm(ws.APIURL()+method, form)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: decode: %v", method, err)
	}
	return out
}

// TestMissingScope: a method whose scope the manifest does not grant
// answers Slack's missing_scope, naming the scope needed for the kind of
// conversation used and the scopes provided; with the scope it works.
func TestMissingScope(t *testing.T) {
	grants := []string{"chat:write", "channels:read"}
	ws, _ := mustWorkspace(t, slacksim.Options{Manifest: &slacksim.Manifest{Scopes: grants}})
	dm := ws.DM(alice)
	cases := []struct {
		name, method string
		form         url.Values
		needed       string // "" when the call goes through
	}{
		{"history of a private channel", "conversations.history", url.Values{"channel": {approvals}}, "groups:history"},
		{"history of a public channel", "conversations.history", url.Values{"channel": {tasks}}, "channels:history"},
		{"history of a DM", "conversations.history", url.Values{"channel": {dm}}, "im:history"},
		{"members of a private channel", "conversations.members", url.Values{"channel": {approvals}}, "groups:read"},
		{"members of a public channel", "conversations.members", url.Values{"channel": {tasks}}, ""},
		{"info of a DM", "conversations.info", url.Values{"channel": {dm}}, "im:read"},
		{"user group members", "usergroups.users.list", url.Values{"usergroup": {approvers}}, "usergroups:read"},
		{"user groups", "usergroups.list", url.Values{}, "usergroups:read"},
		{"user info", "users.info", url.Values{"user": {bob}}, "users:read"},
		{"users", "users.list", url.Values{}, "users:read"},
		{"public channels", "conversations.list", url.Values{}, ""},
		{"private channels too", "conversations.list", url.Values{"types": {"public_channel,private_channel"}}, "groups:read"},
		{"post", "chat.postMessage", url.Values{"channel": {tasks}, "text": {"hi"}}, ""},
		{"permalink (no scope)", "chat.getPermalink", url.Values{"channel": {tasks}, "message_ts": {"1.000001"}}, ""},
		{"auth.test (no scope)", "auth.test", url.Values{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := callRaw(t, ws, c.method, c.form)
			if c.needed == "" {
				if got["error"] == "missing_scope" {
					t.Errorf("%s = %v, want no missing_scope", c.method, got)
				}
				return
			}
			want := map[string]any{"ok": false, "error": "missing_scope", "needed": c.needed, "provided": strings.Join(grants, ",")}
			if len(got) != len(want) || got["ok"] != false || got["error"] != want["error"] || got["needed"] != want["needed"] || got["provided"] != want["provided"] {
				t.Errorf("%s = %v, want %v", c.method, got, want)
			}
		})
	}
	if n := len(ws.Messages(tasks)); n != 1 {
		t.Errorf("messages in #tasks = %d, want the one post that had its scope", n)
	}
}

// TestManifestRefusesEventWithoutScope: as Slack does when an app is
// created, a bot event whose scope the manifest does not grant is refused.
func TestManifestRefusesEventWithoutScope(t *testing.T) {
	_, err := slacksim.ParseManifest([]byte(`
oauth_config: {scopes: {bot: [chat:write]}}
settings: {event_subscriptions: {bot_events: [member_left_channel]}}
`))
	if !errors.Is(err, slacksim.ErrManifest) {
		t.Errorf("ParseManifest(member_left_channel without channels:read or groups:read) = %v, want ErrManifest", err)
	}
	m, err := slacksim.ParseManifest([]byte(`
oauth_config: {scopes: {bot: [groups:read, usergroups:read]}}
settings: {event_subscriptions: {bot_events: [member_left_channel, subteam_members_changed]}}
`))
	if err != nil || !slices.Equal(m.Scopes, []string{"groups:read", "usergroups:read"}) || !slices.Equal(m.Events, []string{"member_left_channel", "subteam_members_changed"}) {
		t.Errorf("ParseManifest() = %+v, %v", m, err)
	}
}

// membershipChanges removes bob from the approvals channel and from the
// approvers group, then adds him back to the channel.
func membershipChanges(t *testing.T, ws *slacksim.Workspace) {
	t.Helper()
	ws.LeaveChannel(approvals, bob)
	if err := ws.SetUsergroupUsers(approvers, []string{carol, alice}); err != nil {
		t.Fatal(err)
	}
	if err := ws.JoinChannel(approvals, bob); err != nil {
		t.Fatal(err)
	}
	ws.LeaveChannel(random, alice) // the bot is not in #random: no event
}

// TestMembershipEventsOverSocketMode: with the checkout's manifest (which
// subscribes to them), leaving and joining a channel the bot is in and a
// user group's change reach the app as Slack's events. Slack's reference
// gives subteam_members_changed's counts as strings, which slack-go's
// typed parser refuses (it wants numbers): the envelope reaches the app as
// a bad message whose raw request it can still read and ack.
func TestMembershipEventsOverSocketMode(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	got := make(chan string, 8)
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		var req socketmode.Request
		switch evt.Type {
		case socketmode.EventTypeEventsAPI:
			req = *evt.Request
		case socketmode.EventTypeErrorBadMessage:
			if json.Unmarshal(evt.Data.(*socketmode.ErrorBadMessage).Message, &req) != nil || req.Type != socketmode.RequestTypeEventsAPI {
				return
			}
		default:
			return
		}
		c.Ack(req)
		var outer struct {
			Event struct {
				Type string `json:"type"`
			} `json:"event"`
		}
		_ = json.Unmarshal(req.Payload, &outer)
		got <- outer.Event.Type
	})
	waitFor(t, ws, "socket", func() bool { return ws.Connections() > 0 })
	membershipChanges(t, ws)
	want := []string{"member_left_channel", "subteam_members_changed", "member_joined_channel"}
	for i, w := range want {
		if typ := <-got; typ != w {
			t.Errorf("event %d = %s, want %s", i, typ, w)
		}
	}
	waitFor(t, ws, "acks", func() bool {
		for _, e := range ws.Envelopes() {
			if !e.Acked {
				return false
			}
		}
		return true
	})
	evs := ws.Events()
	if len(evs) != 3 {
		t.Fatalf("events = %v, want 3 (none for #random, which the bot is not in)", evs)
	}
	if left := evs[0]; left["user"] != bob || left["channel"] != approvals || left["channel_type"] != "G" || left["team"] != slacksim.TeamID {
		t.Errorf("member_left_channel = %v, want bob leaving %s (G)", left, approvals)
	}
	changed := evs[1]
	if changed["subteam_id"] != approvers ||
		!slices.Equal(toStrings(changed["removed_users"]), []string{bob}) || !slices.Equal(toStrings(changed["added_users"]), []string{alice}) ||
		changed["removed_users_count"] != "1" || changed["added_users_count"] != "1" {
		t.Errorf("subteam_members_changed = %v, want bob removed and alice added", changed)
	}
	if joined := evs[2]; joined["user"] != bob || joined["channel"] != approvals {
		t.Errorf("member_joined_channel = %v, want bob joining %s", joined, approvals)
	}
}

// TestMembershipEventsOverHTTP: the same events as signed HTTP POSTs.
func TestMembershipEventsOverHTTP(t *testing.T) {
	app := newHTTPApp(t)
	ws, _ := mustWorkspace(t, app.options(secret))
	membershipChanges(t, ws)
	var types []string
	for range 3 {
		d := app.next(t)
		verify(t, d)
		var outer struct {
			Type  string         `json:"type"`
			Event map[string]any `json:"event"`
		}
		if err := json.Unmarshal(d.Body, &outer); err != nil || outer.Type != "event_callback" {
			t.Fatalf("delivery %s = %s, %v", d.Path, d.Body, err)
		}
		types = append(types, outer.Event["type"].(string))
	}
	// Each HTTP delivery is its own POST: like Slack's, in no set order.
	slices.Sort(types)
	want := []string{"member_joined_channel", "member_left_channel", "subteam_members_changed"}
	if !slices.Equal(types, want) {
		t.Errorf("events = %v, want %v", types, want)
	}
}

// TestMembershipEventsOnlyWhenSubscribed: an app whose manifest does not
// subscribe gets none of them.
func TestMembershipEventsOnlyWhenSubscribed(t *testing.T) {
	m := slacksimtest.Manifest(t)
	m.Events = slices.DeleteFunc(m.Events, func(e string) bool {
		return e == "member_joined_channel" || e == "member_left_channel" || e == "subteam_members_changed"
	})
	ws, _ := mustWorkspace(t, slacksim.Options{Manifest: m})
	membershipChanges(t, ws)
	if evs := ws.Events(); len(evs) != 0 {
		t.Errorf("events = %v, want none without the subscriptions", evs)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
