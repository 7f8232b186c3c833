package bot_test

import (
	"context"
	"strings"
	"testing"

	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// TestReady: the readiness check passes with a token the workspace
// accepts and names Slack's refusal of one it does not.
func TestReady(t *testing.T) {
	ws := slacksimtest.New(t, slacksim.Options{})
	for _, tt := range []struct {
		name, token, wantErr string
	}{
		{"valid token", "xoxb-sim", ""},
		{"revoked token", "xoxb-revoked", "invalid_auth"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := bot.Ready(bot.NewClient(bot.ClientOptions{APIURL: ws.APIURL(), BotToken: tt.token}))(context.Background())
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Ready() with %s = %v, want error containing %q", tt.token, err, tt.wantErr)
			}
		})
	}
}

// TestCheckSettings: each missing, malformed or contradictory Slack
// setting is one error naming its variable; a valid set is none.
func TestCheckSettings(t *testing.T) {
	const api = "https://slack.com/api/"
	for _, tt := range []struct {
		name                     string
		bot, app, secret, apiURL string
		want                     []string
	}{
		{"socket mode", "xoxb-1", "xapp-1", "", api, nil},
		{"http mode", "xoxb-1", "", "s3cret", api, nil},
		{"nothing", "", "", "", api, []string{"SLACK_BOT_TOKEN: required", "SLACK_APP_TOKEN or SLACK_SIGNING_SECRET: set one"}},
		{"swapped tokens", "xapp-1", "xoxb-1", "", api, []string{"SLACK_BOT_TOKEN: must be a bot token", "SLACK_APP_TOKEN: must be an app-level token"}},
		{"both modes", "xoxb-1", "xapp-1", "s3cret", api, []string{"SLACK_SIGNING_SECRET: set together with SLACK_APP_TOKEN"}},
		{"no slash", "xoxb-1", "xapp-1", "", "https://slack.com/api", []string{"SLACK_API_URL: must end with a slash"}},
		{"not a URL", "xoxb-1", "xapp-1", "", "slack.com", []string{`SLACK_API_URL: not a URL: "slack.com"`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			errs := bot.CheckSettings(tt.bot, tt.app, tt.secret, tt.apiURL)
			if len(errs) != len(tt.want) {
				t.Fatalf("CheckSettings = %q, want %d errors: %q", errs, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("CheckSettings error %d = %q, want it to contain %q", i, errs[i], w)
				}
			}
		})
	}
}
