// Package slacksimtest wires a slacksim workspace into a Go test: served on
// an httptest server for the life of the test, with a real slack-go client
// pointed at it.
package slacksimtest

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
)

// New serves a new workspace on an httptest server and closes both when
// the test ends. Unless opts.Manifest is set, the app is installed from the
// checkout's manifest.yml (Manifest): its scopes and bot events, as a real
// workspace would have them.
func New(tb testing.TB, opts slacksim.Options) *slacksim.Workspace {
	tb.Helper()
	if opts.Manifest == nil {
		opts.Manifest = Manifest(tb)
	}
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

// Manifest is the checkout's manifest.yml (found beside go.mod, above the
// test's directory), parsed: the scopes and bot events the app really has.
func Manifest(tb testing.TB) *slacksim.Manifest {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("manifest: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("manifest: no go.mod above the test's directory")
		}
		dir = parent
	}
	m, err := slacksim.ReadManifest(filepath.Join(dir, "manifest.yml"))
	if err != nil {
		tb.Fatalf("manifest: %v", err)
	}
	return m
}
