package slacksim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

func TestAuthTest(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	got, err := api.AuthTest()
	if err != nil {
		t.Fatalf("AuthTest() error = %v", err)
	}
	if got.UserID != slacksim.BotUserID || got.BotID != slacksim.BotID || got.TeamID != slacksim.TeamID || got.User != "countersign" {
		t.Errorf("AuthTest() = %+v, want bot %s/%s in %s", got, slacksim.BotUserID, slacksim.BotID, slacksim.TeamID)
	}
	if got.URL != ws.BaseURL()+"/" {
		t.Errorf("AuthTest().URL = %q, want %q", got.URL, ws.BaseURL()+"/")
	}
}

func TestTokens(t *testing.T) {
	ws, _ := mustWorkspace(t, slacksim.Options{})
	tests := []struct {
		name  string
		token string
		call  func(*slack.Client) error
		want  string
	}{
		{"wrong bot token", "xoxb-nope", func(c *slack.Client) error { _, err := c.AuthTest(); return err }, "invalid_auth"},
		{"app token on bot method", "xapp-sim", func(c *slack.Client) error { _, err := c.AuthTest(); return err }, "not_allowed_token_type"},
		{"bot token on views.open", "xoxb-nope", func(c *slack.Client) error {
			_, err := c.OpenView("t", slack.ModalViewRequest{Type: slack.VTModal})
			return err
		}, "invalid_auth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := slack.New(tt.token, slack.OptionAPIURL(ws.APIURL()))
			if err := tt.call(c); err == nil || err.Error() != tt.want {
				t.Errorf("call with %q = %v, want %s", tt.token, err, tt.want)
			}
		})
	}
}

func TestUnknownMethod(t *testing.T) {
	ws, _ := mustWorkspace(t, slacksim.Options{})
	resp, err := http.PostForm(ws.APIURL()+"chat.nonsense", url.Values{"token": {"xoxb-sim"}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.OK || body.Error != "unknown_method" {
		t.Errorf("chat.nonsense = %+v, want unknown_method", body)
	}
}

func TestPostMessageMembership(t *testing.T) {
	_, api := mustWorkspace(t, slacksim.Options{})
	tests := []struct {
		channel string
		want    string
	}{
		{tasks, ""},
		{approvals, ""},
		{random, "not_in_channel"},
		{"C0NOPE", "channel_not_found"},
		{"#tasks", ""},
	}
	for _, tt := range tests {
		_, _, err := api.PostMessage(tt.channel, slack.MsgOptionText("hello", false))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("PostMessage(%q) error = %q, want %q", tt.channel, got, tt.want)
		}
	}
}

func TestPostMessageStoresBlocksThreadsAndMetadata(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	parent, err := ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> refund order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	blocks := slack.MsgOptionBlocks(
		slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, "Refund", false, false)),
		slack.NewActionBlock("decide",
			slack.NewButtonBlockElement("approve", "req-1", slack.NewTextBlockObject(slack.PlainTextType, "Approve", false, false)).WithStyle(slack.StylePrimary)),
	)
	meta := slack.MsgOptionMetadata(slack.SlackMetadata{EventType: "approval", EventPayload: map[string]any{"id": "req-1"}})
	_, ts, err := api.PostMessage(tasks, slack.MsgOptionText("waiting for approval", false), slack.MsgOptionTS(parent), blocks, meta)
	if err != nil {
		t.Fatalf("PostMessage(thread) error = %v", err)
	}
	replies := ws.Replies(tasks, parent)
	if len(replies) != 1 || replies[0].TS != ts || replies[0].BotID != slacksim.BotID {
		t.Fatalf("Replies() = %+v, want the bot reply %s", replies, ts)
	}
	if !strings.Contains(string(replies[0].Blocks), `"action_id":"approve"`) || !strings.Contains(string(replies[0].Metadata), "approval") {
		t.Errorf("reply blocks/metadata = %s / %s", replies[0].Blocks, replies[0].Metadata)
	}
	if top := ws.Messages(tasks); len(top) != 1 || top[0].ReplyCount != 1 {
		t.Errorf("Messages() = %+v, want the parent with 1 reply", top)
	}

	msgs, _, _, err := api.GetConversationReplies(&slack.GetConversationRepliesParameters{ChannelID: tasks, Timestamp: parent})
	if err != nil {
		t.Fatalf("GetConversationReplies() error = %v", err)
	}
	if len(msgs) != 2 || msgs[1].Timestamp != ts || len(msgs[1].Blocks.BlockSet) != 2 {
		t.Errorf("GetConversationReplies() = %d messages, want parent + reply with 2 blocks", len(msgs))
	}

	if _, _, _, err := api.UpdateMessage(tasks, ts, slack.MsgOptionText("approved", false)); err != nil {
		t.Fatalf("UpdateMessage() error = %v", err)
	}
	if m, _ := ws.Message(tasks, ts); m.Text != "approved" {
		t.Errorf("after update text = %q, want approved", m.Text)
	}
	if _, _, _, err := api.UpdateMessage(tasks, parent, slack.MsgOptionText("hijack", false)); err == nil || err.Error() != "cant_update_message" {
		t.Errorf("UpdateMessage(someone else's) error = %v, want cant_update_message", err)
	}
	link, err := api.GetPermalink(&slack.PermalinkParameters{Channel: tasks, Ts: ts})
	if err != nil || !strings.Contains(link, "/archives/"+tasks+"/p") {
		t.Errorf("GetPermalink() = %q, %v", link, err)
	}
}

func TestInvalidBlocks(t *testing.T) {
	_, api := mustWorkspace(t, slacksim.Options{})
	text := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
	}
	plain := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
	}
	many := func(n int) []slack.Block {
		var bs []slack.Block
		for range n {
			bs = append(bs, slack.NewDividerBlock())
		}
		return bs
	}
	var elevenFields []*slack.TextBlockObject
	for i := range 11 {
		elevenFields = append(elevenFields, text(fmt.Sprint(i)))
	}
	tests := []struct {
		name   string
		blocks []slack.Block
		hint   string // substring of response_metadata.messages
	}{
		{"51 blocks", many(51), "must be less than 51 items"},
		{"section text 3001", []slack.Block{slack.NewSectionBlock(text(strings.Repeat("x", 3001)), nil, nil)}, "/blocks/0/text/text"},
		{"11 fields", []slack.Block{slack.NewSectionBlock(nil, elevenFields, nil)}, "/blocks/0/fields"},
		{"header 151", []slack.Block{slack.NewHeaderBlock(plain(strings.Repeat("h", 151)))}, "must be less than 151 characters"},
		{"button text 76", []slack.Block{slack.NewActionBlock("a", slack.NewButtonBlockElement("x", "v", plain(strings.Repeat("b", 76))))}, "/blocks/0/elements/0/text/text"},
		{"button value 2001", []slack.Block{slack.NewActionBlock("a", slack.NewButtonBlockElement("x", strings.Repeat("v", 2001), plain("ok")))}, "/blocks/0/elements/0/value"},
		{"action_id 256", []slack.Block{slack.NewActionBlock("a", slack.NewButtonBlockElement(strings.Repeat("a", 256), "v", plain("ok")))}, "/blocks/0/elements/0/action_id"},
		{"block_id 256", []slack.Block{&slack.DividerBlock{Type: slack.MBTDivider, BlockID: strings.Repeat("b", 256)}}, "/blocks/0/block_id"},
		{"empty section text", []slack.Block{slack.NewSectionBlock(text(""), nil, nil)}, "must be more than 0 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := api.PostMessage(tasks, slack.MsgOptionText("fallback", false), slack.MsgOptionBlocks(tt.blocks...))
			var serr slack.SlackErrorResponse
			if !errors.As(err, &serr) || serr.Err != "invalid_blocks" {
				t.Fatalf("PostMessage() error = %v, want invalid_blocks", err)
			}
			if !slices.ContainsFunc(serr.ResponseMetadata.Messages, func(m string) bool { return strings.Contains(m, tt.hint) }) {
				t.Errorf("response_metadata.messages = %q, want one containing %q", serr.ResponseMetadata.Messages, tt.hint)
			}
		})
	}
	if _, _, err := api.PostMessage(tasks, slack.MsgOptionBlocks(many(50)...)); err != nil {
		t.Errorf("PostMessage(50 blocks) error = %v, want ok", err)
	}
	if _, _, err := api.PostMessage(tasks, slack.MsgOptionText(strings.Repeat("x", 40001), false)); err == nil || err.Error() != "msg_too_long" {
		t.Errorf("PostMessage(40001 chars) error = %v, want msg_too_long", err)
	}
}

func TestConversationsMembersPagination(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	for i := range 5 {
		u := ws.AddUser(slacksim.User{Name: fmt.Sprintf("extra%d", i)})
		if err := ws.JoinChannel(tasks, u.ID); err != nil {
			t.Fatal(err)
		}
	}
	var all []string
	cursor, pages := "", 0
	for {
		ids, next, err := api.GetUsersInConversation(&slack.GetUsersInConversationParameters{ChannelID: tasks, Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatalf("GetUsersInConversation() error = %v", err)
		}
		if len(ids) > 3 {
			t.Fatalf("page of %d members, want at most 3", len(ids))
		}
		all = append(all, ids...)
		pages++
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 8 || pages != 3 {
		t.Errorf("members = %d in %d pages, want 8 in 3", len(all), pages)
	}
	if _, _, err := api.GetUsersInConversation(&slack.GetUsersInConversationParameters{ChannelID: "G0SECRET"}); err == nil || err.Error() != "channel_not_found" {
		t.Errorf("members of unknown channel error = %v, want channel_not_found", err)
	}
}

func TestConversationsInfoAndOpen(t *testing.T) {
	// The bot opens no DMs itself: conversations.open needs im:write,
	// which its manifest does not grant.
	m := slacksimtest.Manifest(t)
	m.Scopes = append(m.Scopes, "im:write")
	_, api := mustWorkspace(t, slacksim.Options{Manifest: m})
	ch, err := api.GetConversationInfo(&slack.GetConversationInfoInput{ChannelID: approvals})
	if err != nil {
		t.Fatalf("GetConversationInfo() error = %v", err)
	}
	if ch.Name != "approvals" || !ch.IsPrivate || !ch.IsMember {
		t.Errorf("GetConversationInfo() = %+v, want private approvals with the bot", ch.GroupConversation)
	}
	dm, _, _, err := api.OpenConversation(&slack.OpenConversationParameters{Users: []string{alice}})
	if err != nil || !strings.HasPrefix(dm.ID, "D") {
		t.Fatalf("OpenConversation() = %v, %v, want a D… channel", dm, err)
	}
	again, _, _, _ := api.OpenConversation(&slack.OpenConversationParameters{Users: []string{alice}})
	if again.ID != dm.ID {
		t.Errorf("second OpenConversation() = %s, want %s", again.ID, dm.ID)
	}
	u, err := api.GetUserInfo(bob)
	if err != nil || u.Name != "bob" || u.RealName != "Bob Baker" || u.IsBot {
		t.Errorf("GetUserInfo(bob) = %+v, %v", u, err)
	}
	if _, err := api.GetUserInfo("U0NOBODY"); err == nil || err.Error() != "user_not_found" {
		t.Errorf("GetUserInfo(unknown) error = %v, want user_not_found", err)
	}
}

// TestListings: users.list pages through every member; conversations.list
// lists the kinds types asks for (public channels by default, as Slack),
// a private channel only when the bot is in it, and refuses a kind Slack
// does not know.
func TestListings(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	ws.AddChannel(slacksim.Channel{ID: "G0HIDDEN1", Name: "hidden", IsPrivate: true, Members: []string{alice}})
	var names []string
	p := api.GetUsersPaginated(slack.GetUsersOptionLimit(2))
	pages := 0
	for {
		var err error
		if p, err = p.Next(t.Context()); p.Done(err) {
			break
		} else if err != nil {
			t.Fatalf("users.list: %v", err)
		}
		pages++
		for _, u := range p.Users {
			names = append(names, u.Name)
		}
	}
	if !slices.Contains(names, "alice") || !slices.Contains(names, "carol") || pages < 2 {
		t.Errorf("users.list = %v in %d pages, want every member, 2 a page", names, pages)
	}
	list := func(types ...string) []string {
		t.Helper()
		chs, _, err := api.GetConversations(&slack.GetConversationsParameters{Types: types})
		if err != nil {
			t.Fatalf("conversations.list %v: %v", types, err)
		}
		var ids []string
		for _, c := range chs {
			ids = append(ids, c.ID)
		}
		return ids
	}
	if got := list(); !slices.Contains(got, tasks) || slices.Contains(got, approvals) {
		t.Errorf("conversations.list = %v, want the public channels only", got)
	}
	if got := list("public_channel", "private_channel"); !slices.Contains(got, tasks) || !slices.Contains(got, approvals) || slices.Contains(got, "G0HIDDEN1") {
		t.Errorf("conversations.list(public, private) = %v, want #tasks and #approvals, not the private channel the bot is not in", got)
	}
	if _, _, err := api.GetConversations(&slack.GetConversationsParameters{Types: []string{"channels"}}); err == nil || err.Error() != "invalid_types" {
		t.Errorf("conversations.list(types=channels) error = %v, want invalid_types", err)
	}
}

func TestUsergroups(t *testing.T) {
	_, api := mustWorkspace(t, slacksim.Options{})
	got, err := api.GetUserGroupMembers(approvers)
	if err != nil {
		t.Fatalf("GetUserGroupMembers() error = %v", err)
	}
	if !slices.Equal(got, []string{bob, carol}) {
		t.Errorf("GetUserGroupMembers() = %v, want [bob carol]", got)
	}
	if _, err := api.GetUserGroupMembers("S0NONE"); err == nil {
		t.Error("GetUserGroupMembers(unknown) error = nil, want no_such_subteam")
	}
}

func TestEphemeralVisibility(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	ts, err := api.PostEphemeral(tasks, alice, slack.MsgOptionText("only you", false))
	if err != nil || ts == "" {
		t.Fatalf("PostEphemeral() = %q, %v", ts, err)
	}
	if got := ws.Ephemerals(alice); len(got) != 1 || got[0].Text != "only you" || got[0].VisibleTo != alice {
		t.Errorf("Ephemerals(alice) = %+v, want the one message", got)
	}
	if got := ws.Ephemerals(bob); len(got) != 0 {
		t.Errorf("Ephemerals(bob) = %+v, want none", got)
	}
	if got := ws.Messages(tasks); len(got) != 0 {
		t.Errorf("Messages(tasks) = %+v, want ephemerals excluded", got)
	}
	if _, err := api.PostEphemeral(tasks, carol, slack.MsgOptionText("x", false)); err == nil || err.Error() != "user_not_in_channel" {
		t.Errorf("PostEphemeral(non-member) error = %v, want user_not_in_channel", err)
	}
}

func TestRateLimits(t *testing.T) {
	clk := clocktest.New(clocktest.Opts{Start: time.Now()})
	ws, api := mustWorkspace(t, slacksim.Options{
		Now:        clk.Now,
		RateLimits: map[string]slacksim.RateLimit{"chat.postMessage": {Every: time.Second, RetryAfter: 2}},
	})
	if _, _, err := api.PostMessage(tasks, slack.MsgOptionText("one", false)); err != nil {
		t.Fatalf("first PostMessage() error = %v", err)
	}
	_, _, err := api.PostMessage(tasks, slack.MsgOptionText("two", false))
	var rl *slack.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Second {
		t.Fatalf("second PostMessage() error = %v, want *slack.RateLimitedError after 2s", err)
	}
	if _, _, err := api.PostMessage(approvals, slack.MsgOptionText("other channel", false)); err != nil {
		t.Errorf("PostMessage(other channel) error = %v, want ok (limit is per channel)", err)
	}
	clk.Advance(time.Second)
	if _, _, err := api.PostMessage(tasks, slack.MsgOptionText("three", false)); err != nil {
		t.Errorf("PostMessage() after 1s error = %v, want ok", err)
	}

	ws.ForceRateLimit("chat.update", 1, 7)
	_, _, _, err = api.UpdateMessage(tasks, ws.Messages(tasks)[0].TS, slack.MsgOptionText("x", false))
	if !errors.As(err, &rl) || rl.RetryAfter != 7*time.Second {
		t.Errorf("forced UpdateMessage() error = %v, want RateLimitedError 7s", err)
	}
	if _, _, _, err := api.UpdateMessage(tasks, ws.Messages(tasks)[0].TS, slack.MsgOptionText("x", false)); err != nil {
		t.Errorf("UpdateMessage() after forced limit error = %v", err)
	}
	if got := ws.Calls("chat.postMessage"); got != 4 {
		t.Errorf("Calls(chat.postMessage) = %d, want 4 (429s included)", got)
	}
}

func TestCallLogRecordsParams(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	if _, _, err := api.PostMessage(tasks, slack.MsgOptionText("hi", false)); err != nil {
		t.Fatal(err)
	}
	log := ws.CallLog()
	last := log[len(log)-1]
	if last.Method != "chat.postMessage" || last.Params["channel"] != tasks || last.Params["text"] != "hi" {
		t.Errorf("last call = %+v", last)
	}
	if _, has := last.Params["token"]; has {
		t.Error("call log records the token")
	}
}

// TestMessagesAfter: what a poller has not seen yet — the top-level
// messages after a timestamp, thread replies left out — and every one from
// the empty timestamp.
func TestMessagesAfter(t *testing.T) {
	ws, _ := mustWorkspace(t, slacksim.Options{})
	var ts []string
	for _, text := range []string{"one", "two", "three"} {
		m, err := ws.PostMessage(alice, tasks, text, "")
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, m)
	}
	if _, err := ws.PostMessage(alice, tasks, "a reply", ts[0]); err != nil {
		t.Fatal(err)
	}
	texts := func(ms []slacksim.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Text)
		}
		return out
	}
	for _, tt := range []struct {
		after string
		want  []string
	}{
		{"", []string{"one", "two", "three"}},
		{ts[0], []string{"two", "three"}},
		{ts[2], nil},
	} {
		if got := texts(ws.MessagesAfter(tasks, tt.after)); !slices.Equal(got, tt.want) {
			t.Errorf("MessagesAfter(%q) = %q, want %q", tt.after, got, tt.want)
		}
	}
}
