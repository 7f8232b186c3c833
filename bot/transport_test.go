package bot_test

import (
	"testing"

	"github.com/countersign/countersign/bot"
)

// TestSlackOKParsing: the transport finds a reply's top-level "ok" in its
// head, even cut short, and nowhere else. (The calls it tells of, through
// the real slack-go client, are checked by the metrics' flow test,
// TestMetricsScrapeAfterFlow.)
func TestSlackOKParsing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body      string
		ok, found bool
	}{
		{`{"ok":true}`, true, true},
		{`{"ok":false,"error":"x"}`, false, true},
		{`{"warning":"w","response_metadata":{"ok":false},"ok":true}`, true, true},
		{`{"ok":fal`, false, false},
		{`{"channel":"C1","ok":false,"messages":[`, false, true}, // cut short after ok
		{`not json`, false, false},
	}
	for _, tt := range tests {
		ok, found := bot.SlackOK([]byte(tt.body))
		if ok != tt.ok || found != tt.found {
			t.Errorf("slackOK(%q) = %v, %v; want %v, %v", tt.body, ok, found, tt.ok, tt.found)
		}
	}
}
