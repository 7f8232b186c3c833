package bot_test

import (
	"context"
	"testing"
	"time"

	"github.com/countersign/countersign/bot/slacksim"
)

// TestName: the bot names Slack ids for pages outside Slack through the
// real slack-go client (users.info, conversations.info, usergroups.list),
// never looks up what is not a Slack id, and caches answers (a miss for a
// minute).
func TestName(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, noSocket: true})
	h.ws.AddUser(slacksim.User{ID: "U0DANA001", Name: "dana", RealName: "Dana Whitfield"})
	h.ws.AddUsergroup(slacksim.Usergroup{ID: "S0LEADS01", Handle: "leads", Name: "Leads", Users: []string{bob}})
	ctx := context.Background()
	tests := []struct {
		name, id, want string
		method         string // the Slack method it needs, "" for none
	}{
		{"real name", "U0DANA001", "Dana Whitfield", "users.info"},
		{"handle when no real name", alice, "alice", "users.info"},
		{"private channel", approvals, "#approvals", "conversations.info"},
		{"user group", "S0LEADS01", "@leads", "usergroups.list"},
		{"unknown user", "U0NOBODY1", "", "users.info"},
		{"not a Slack id", "system", "", ""},
		{"process name", "host/agent_abc", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := func() int {
				if tc.method == "" {
					return h.ws.Calls("users.info") + h.ws.Calls("conversations.info") + h.ws.Calls("usergroups.list")
				}
				return h.ws.Calls(tc.method)
			}
			before := calls()
			for i := range 2 {
				if got := h.bot.Name(ctx, tc.id); got != tc.want {
					t.Errorf("Name(%q) #%d = %q, want %q", tc.id, i+1, got, tc.want)
				}
			}
			want := 1
			if tc.method == "" {
				want = 0
			}
			if got := calls() - before; got != want {
				t.Errorf("Slack calls for two Name(%q) = %d, want %d (cached)", tc.id, got, want)
			}
		})
	}
	t.Run("a miss is asked again after a minute", func(t *testing.T) {
		const id = "U0LATER01"
		if got := h.bot.Name(ctx, id); got != "" {
			t.Fatalf("Name(%q) = %q before the user exists", id, got)
		}
		h.ws.AddUser(slacksim.User{ID: id, Name: "later", RealName: "Lee Later"})
		if got := h.bot.Name(ctx, id); got != "" {
			t.Errorf("Name(%q) = %q within the miss TTL, want the cached miss", id, got)
		}
		h.clock.Advance(time.Minute)
		if got := h.bot.Name(ctx, id); got != "Lee Later" {
			t.Errorf("Name(%q) after a minute = %q, want Lee Later", id, got)
		}
	})
}
