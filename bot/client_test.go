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
