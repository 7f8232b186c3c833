package bot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// times with exponential backoff; anything else is returned at once. key
// names the rate limit the call is under (limitKey).
func (b *Bot) retry(ctx context.Context, key string, call func(ctx context.Context) error) error {
	return b.retryLimited(ctx, key, 0, call)
}

// errRateLimited is returned by retryLimited when a call stayed rate
// limited for all the waits it was allowed.
var errRateLimited = errors.New("bot: still rate limited")

// retryLimited is retry with at most maxWaits rate-limit waits (0: no
// limit). Before every attempt it waits out the Retry-After that any
// goroutine of this process was given for key, so a 429 holds back every
// caller of that method, not only the one that got it.
func (b *Bot) retryLimited(ctx context.Context, key string, maxWaits int, call func(ctx context.Context) error) error {
	backoff := firstBackoff
	transient, waits := 0, 0
	for {
		if d := b.limits.delay(key, b.now()); d > 0 {
			if err := b.sleep(ctx, d); err != nil {
				return err
			}
			continue // another goroutine may have extended the hold meanwhile
		}
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
			b.limits.hold(key, b.now().Add(wait))
			waits++
			if maxWaits > 0 && waits >= maxWaits {
				return fmt.Errorf("%s: %w after %d waits: %w", key, errRateLimited, waits, err)
			}
			b.log.Warn("slack rate limited; waiting", "method", key, "retry_after", wait)
			continue // the hold above is waited out before the next attempt
		} else if isTransient(err) {
			transient++
			if transient >= transientAttempts {
				return err
			}
			wait = backoff
			backoff *= 2
			b.log.Warn("slack call failed; retrying", "method", key, "attempt", transient, "err", err)
		} else {
			return err
		}
		if serr := b.sleep(ctx, wait); serr != nil {
			return err
		}
	}
}

// limitKey names the rate limit a call is under: its Web API method, and
// for chat.postMessage the channel too (Slack limits posting per channel).
func limitKey(method, channel string) string {
	if method == "chat.postMessage" && channel != "" {
		return method + ":" + channel
	}
	return method
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

// failureLog is how a failed Slack call is logged: at error level with a
// hint for the operator, except a call cancelled because the process is
// stopping (its context was cancelled), which is a warning that says so.
// The hint explains Slack's error code, or, without one (a timeout
// included), says Slack did not answer.
func failureLog(err error, channel string) (slog.Level, string) {
	code := slackCode(err)
	switch {
	case code == "" && errors.Is(err, context.Canceled):
		return slog.LevelWarn, "the call was cut short: the process is stopping"
	case code == "":
		return slog.LevelError, "Slack did not answer (a network error, a timeout or an HTTP error), after retries"
	}
	return slog.LevelError, operatorHint(code, channel)
}

// operatorHint explains a Slack error code to whoever reads the logs.
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
