package bot

import (
	"context"
	"net/http"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"
)

// ClientOptions configures the Slack Web API client.
type ClientOptions struct {
	// APIURL is the Web API base URL with a trailing slash
	// (https://slack.com/api/; the local workspace's in the demo and tests).
	APIURL string
	// BotToken (xoxb-) signs every Web API call.
	BotToken string
	// AppToken (xapp-), when set, lets the client open Socket Mode.
	AppToken string
	// HTTPClient carries the calls (main passes the instrumented one).
	HTTPClient *http.Client
}

// NewClient builds the slack-go client the bot is given in Options.Slack.
// It is the one place a Slack client is made outside tests.
func NewClient(opts ClientOptions) *slack.Client {
	o := []slack.Option{slack.OptionAPIURL(opts.APIURL)}
	if opts.HTTPClient != nil {
		o = append(o, slack.OptionHTTPClient(opts.HTTPClient))
	}
	if opts.AppToken != "" {
		o = append(o, slack.OptionAppLevelToken(opts.AppToken))
	}
	return slack.New(opts.BotToken, o...)
}

// NewSocketMode is the Socket Mode connection of c, for RunSocketMode.
func NewSocketMode(c *slack.Client) *socketmode.Client { return socketmode.New(c) }

// Ready is a readiness check of c: auth.test (the token still works and
// Slack answers). Callers cache a passing result (metrics.Cached), as
// store.Ready is the check of Redis.
func Ready(c *slack.Client) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.AuthTestContext(ctx)
		return err
	}
}
