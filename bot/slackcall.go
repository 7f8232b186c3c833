package bot

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/slack-go/slack"
)

// Retry policy for Slack Web API calls.
const (
	// transientAttempts bounds attempts for transient failures (5xx,
	// network errors, Slack's internal_error and friends).
	transientAttempts = 4
	// firstBackoff doubles after each transient failure.
	firstBackoff = 500 * time.Millisecond
	// minRateLimitWait is used when a 429 names no usable Retry-After, so a
	// rate limit never turns into a hot loop.
	minRateLimitWait = time.Second
)

// retry runs call until it succeeds, fails permanently, or ctx ends. A 429
// waits Retry-After and tries again without limit (a card is never dropped
// for a rate limit); transient failures are retried a bounded number of
// times with exponential backoff; anything else is returned at once.
func (b *Bot) retry(ctx context.Context, method string, call func(ctx context.Context) error) error {
	backoff := firstBackoff
	transient := 0
	for {
		err := call(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		var wait time.Duration
		if rl, ok := errors.AsType[*slack.RateLimitedError](err); ok {
			wait = max(rl.RetryAfter, minRateLimitWait)
			b.log.Warn("slack rate limited; waiting", "method", method, "retry_after", wait)
		} else if isTransient(err) {
			transient++
			if transient >= transientAttempts {
				return err
			}
			wait = backoff
			backoff *= 2
			b.log.Warn("slack call failed; retrying", "method", method, "attempt", transient, "err", err)
		} else {
			return err
		}
		if serr := b.sleep(ctx, wait); serr != nil {
			return err
		}
	}
}

// transientCodes are Slack error codes worth trying again.
var transientCodes = map[string]bool{
	"internal_error":      true,
	"fatal_error":         true,
	"service_unavailable": true,
	"request_timeout":     true,
	"ratelimited":         true,
}

// permanentCodes are Slack error codes that no retry will fix and that an
// operator must act on.
var permanentCodes = map[string]bool{
	"channel_not_found": true,
	"not_in_channel":    true,
	"is_archived":       true,
	"invalid_auth":      true,
	"not_authed":        true,
	"account_inactive":  true,
	"token_revoked":     true,
	"token_expired":     true,
	"missing_scope":     true,
	"no_permission":     true,
	"restricted_action": true,
	"invalid_blocks":    true,
	"msg_too_long":      true,
}

func isTransient(err error) bool {
	if sc, ok := errors.AsType[slack.StatusCodeError](err); ok {
		return sc.Code >= 500
	}
	if se, ok := errors.AsType[slack.SlackErrorResponse](err); ok {
		return transientCodes[se.Err]
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return false
}

// slackCode returns Slack's error code for err ("channel_not_found"), or "".
func slackCode(err error) string {
	if se, ok := errors.AsType[slack.SlackErrorResponse](err); ok {
		return se.Err
	}
	return ""
}

// isPermanent reports whether err is a Slack refusal an operator must fix.
func isPermanent(err error) bool { return permanentCodes[slackCode(err)] }

// operatorHint explains a permanent Slack error to whoever reads the logs.
func operatorHint(code, channel string) string {
	switch code {
	case "channel_not_found":
		return "channel " + channel + " does not exist or the bot cannot see it; check slack.approvals_channel in the policy file"
	case "not_in_channel":
		return "the bot is not a member of " + channel + "; invite it with /invite @countersign"
	case "is_archived":
		return "channel " + channel + " is archived"
	case "invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive":
		return "the bot token is not valid; check SLACK_BOT_TOKEN"
	case "missing_scope", "no_permission":
		return "the app lacks a scope; reinstall it from manifest.yml"
	}
	return "Slack refused the call (" + code + ")"
}
