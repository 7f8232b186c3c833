package bot

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

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

// CheckSettings checks a process's Slack settings before anything is
// built: the tokens are of the right kind, exactly one way of receiving
// events is chosen (Socket Mode with the app token, or signed HTTP with
// the signing secret), and the API URL is one slack-go can use. Each error
// names the environment variable the setting is read from (Slack's own
// names: SLACK_BOT_TOKEN, SLACK_APP_TOKEN, SLACK_SIGNING_SECRET,
// SLACK_API_URL).
func CheckSettings(botToken, appToken, signingSecret, apiURL string) []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if botToken == "" {
		add("SLACK_BOT_TOKEN: required (the bot token, xoxb-...)")
	} else if !strings.HasPrefix(botToken, "xoxb-") {
		add("SLACK_BOT_TOKEN: must be a bot token starting with xoxb-")
	}
	switch {
	case appToken == "" && signingSecret == "":
		add("SLACK_APP_TOKEN or SLACK_SIGNING_SECRET: set one (Socket Mode needs SLACK_APP_TOKEN, HTTP mode needs SLACK_SIGNING_SECRET)")
	case appToken != "" && !strings.HasPrefix(appToken, "xapp-"):
		add("SLACK_APP_TOKEN: must be an app-level token starting with xapp-")
	}
	if appToken != "" && signingSecret != "" {
		add("SLACK_SIGNING_SECRET: set together with SLACK_APP_TOKEN, but Socket Mode (SLACK_APP_TOKEN) never uses it: unset one (HTTP mode is SLACK_SIGNING_SECRET alone)")
	}
	// slack-go joins method names to the URL: without the slash it would
	// call https://slack.com/apichat.postMessage.
	if u, err := url.Parse(apiURL); err != nil || u.Scheme == "" || u.Host == "" {
		add("SLACK_API_URL: not a URL: %q", apiURL)
	} else if !strings.HasSuffix(apiURL, "/") {
		add("SLACK_API_URL: must end with a slash, e.g. https://slack.com/api/")
	}
	return errs
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
