package bot_test

import (
	"strings"
	"testing"

	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// TestOpsPoster: the weekly summary is one message of the ops channel,
// posted by the real slack-go client; a channel the bot is not in is
// Slack's refusal, named.
func TestOpsPoster(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.AddChannel(slacksim.Channel{ID: "C0OPS", Name: "ops", Members: []string{slacksim.BotUserID}})
	ws.AddChannel(slacksim.Channel{ID: "C0SECRET", Name: "secret", IsPrivate: true})
	client := bot.NewClient(bot.ClientOptions{APIURL: ws.APIURL(), BotToken: "xoxb-sim"})
	const text = "*Approval load, week of Mon 23 Nov to Sun 29 Nov 2026 (UTC)*: 33 requests, 33 decided by a person\n• send_email: 30 requests"
	if err := (bot.OpsPoster{Messages: client, Channel: "C0OPS"}).PostSummary(t.Context(), text); err != nil {
		t.Fatalf("PostSummary: %v", err)
	}
	msgs := ws.Messages("C0OPS")
	if len(msgs) != 1 || msgs[0].Text != text || msgs[0].User != slacksim.BotUserID {
		t.Errorf("#ops holds %+v; want one message by the bot with the summary", msgs)
	}
	err := (bot.OpsPoster{Messages: client, Channel: "C0SECRET"}).PostSummary(t.Context(), text)
	if err == nil || !strings.Contains(err.Error(), "C0SECRET") {
		t.Errorf("PostSummary to a channel the bot is not in = %v; want Slack's refusal naming the channel", err)
	}
}

// TestCheckChannelID: a channel id passes; a name, a user id or a URL is
// an error naming the variable.
func TestCheckChannelID(t *testing.T) {
	for _, tt := range []struct {
		id string
		ok bool
	}{
		{"C0123ABCD", true},
		{"G0PRIVATE1", true},
		{"#ops", false},
		{"ops", false},
		{"U0ANN", false},
		{"c0123abcd", false},
		{"https://acme.slack.com/archives/C0123ABCD", false},
	} {
		err := bot.CheckChannelID("COUNTERSIGN_OPS_CHANNEL", tt.id)
		if tt.ok && err != nil || !tt.ok && (err == nil || !strings.HasPrefix(err.Error(), "COUNTERSIGN_OPS_CHANNEL: ")) {
			t.Errorf("CheckChannelID(%q) = %v, want ok=%v (an error naming the variable)", tt.id, err, tt.ok)
		}
	}
}
