// Package slacksimtest wires a slacksim workspace into a Go test: served on
// an httptest server for the life of the test, with a real slack-go client
// pointed at it.
package slacksimtest

import (
	"net/http/httptest"
	"testing"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
)

// New serves a new workspace on an httptest server and closes both when
// the test ends.
func New(tb testing.TB, opts slacksim.Options) *slacksim.Workspace {
	tb.Helper()
	ws := slacksim.New(opts)
	srv := httptest.NewServer(ws.Handler())
	ws.SetBaseURL(srv.URL)
	tb.Cleanup(func() {
		ws.Close() // drops Socket Mode connections first so srv.Close does not wait on them
		srv.Close()
	})
	return ws
}

// Client returns a slack-go client for ws with the workspace's bot token
// and app-level token (for socketmode). botToken and appToken must match
// the Options given to New; pass "" for the defaults.
func Client(ws *slacksim.Workspace, botToken, appToken string, opts ...slack.Option) *slack.Client {
	if botToken == "" {
		botToken = "xoxb-sim"
	}
	if appToken == "" {
		appToken = "xapp-sim"
	}
	all := append([]slack.Option{slack.OptionAPIURL(ws.APIURL()), slack.OptionAppLevelToken(appToken)}, opts...)
	return slack.New(botToken, all...)
}
