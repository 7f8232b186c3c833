package bot

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/countersign/countersign/approval"
)

// errNotOnCard refuses a click that did not come from the request's card
// in the approvals channel (another channel, another message, a button
// whose value names a different request).
var errNotOnCard = errors.New("bot: click not on the request's approval card")

// refusal is one known refusal of a click.
type refusal struct {
	err  error  // the sentinel
	code string // recorded in the audit
	text string // told to the person who clicked
}

// refusals is every known refusal of a click: its sentinel, the stable
// code the audit records (refusalCode) and what the person who clicked
// reads (userText). The first whose sentinel err wraps wins, so a more
// specific sentinel comes before one it may also wrap (ErrExpired before
// ErrAlreadyDecided).
var refusals = []refusal{
	{approval.ErrSelfGrant, "self_grant",
		"You asked for this, so you cannot pre-authorise more of your own calls. Use Approve."},
	{approval.ErrGrantNotOffered, "grant_not_offered",
		"This request cannot pre-authorise further calls, so nothing changed. Use Approve."},
	{errUnknownChoice, "unknown_choice",
		"That option is not one this request offers, so nothing changed. Open the form again from the card."},
	{errNotOnCard, "not_on_card",
		"That button is not on this request's approval card, so nothing changed. Decide on the card in the approvals channel."},
	{approval.ErrSelfApproval, "self_approval",
		"You asked for this, so someone else has to decide it (four-eyes rule)."},
	{approval.ErrNotApprover, "not_approver",
		"You are not one of the approvers for this request, so nothing changed."},
	{approval.ErrAlreadyVoted, "already_voted",
		"You have already approved this; it needs another approver."},
	{approval.ErrVerdictNotAllowed, "verdict_not_allowed",
		"That decision is not allowed for this tool."},
	{approval.ErrStepUpRequired, "step_up_required",
		"Your vote needs a passkey confirmation, which this deployment cannot offer yet (COUNTERSIGN_PUBLIC_URL is not set): nothing was counted. Tell whoever runs Countersign."},
	{approval.ErrStepUpInvalid, "step_up_invalid",
		"The confirmation did not match this vote, so nothing was counted."},
	{approval.ErrMoved, "moved",
		"This request kept changing while you decided, so nothing was recorded. Look at the card and decide again."},
	{approval.ErrStaleArgs, "stale_args",
		"The arguments changed since you opened this. Look at the updated card and decide again."},
	{approval.ErrAlreadyMarked, "already_marked",
		"Someone already judged this request, so nothing changed (a mark as wrong stands; see the card)."},
	{approval.ErrNotFinal, "not_final",
		"This request is not settled yet (or nobody decided it), so it cannot be marked wrong."},
	{approval.ErrExpired, "expired",
		"This request has expired; nothing will run."},
	{approval.ErrAlreadyDecided, "already_decided",
		"This request has already been decided."},
	{approval.ErrNotFound, "not_found",
		"This request no longer exists."},
	{approval.ErrInvalidArgs, "invalid_args",
		"Those arguments are not valid."},
	{approval.ErrDenied, "denied",
		"The policy refuses those arguments, so nothing changed."},
	{approval.ErrUnknownTool, "unknown_tool",
		"This tool is no longer in the policy, so its call cannot be edited."},
	{approval.ErrConfusableTool, "confusable_tool",
		"This tool's name now reads like a tool the policy declares, so its call cannot be edited."},
}

// userText turns an error from a click into a short message for the person
// who clicked. Internal detail stays in the logs: anything not a known
// refusal is "Internal error.".
func userText(err error) string {
	if err == nil {
		return ""
	}
	if de, ok := errors.AsType[*approval.DecidedError](err); ok {
		if de.Status == approval.StatusExpired {
			return fmt.Sprintf("This request expired %s; nothing will run.", slackDate(de.At))
		}
		if de.By == "system" && statusWord(de.Status) == "approved" {
			// The clock's decision: a cancel window ended.
			return fmt.Sprintf("Too late: the cancel window ended %s, so the call went ahead; nothing changed.", slackDate(de.At))
		}
		who := "someone"
		if de.By != "" {
			who = mention(de.By)
		}
		return fmt.Sprintf("Already %s by %s %s.", statusWord(de.Status), who, slackDate(de.At))
	}
	if de, ok := errors.AsType[*approval.DenialError](err); ok {
		return "The policy refuses those arguments, so nothing changed: " + lit(de.Denial.Reason)
	}
	if rf, ok := refusalOf(err); ok {
		return rf.text
	}
	if storeNotAnswering(err) {
		return storeNotAnsweringText
	}
	return "Internal error."
}

// storeNotAnsweringText tells a person that Redis did not answer within
// the time Slack gives an answer; nothing was recorded.
const storeNotAnsweringText = "Countersign's store is not answering just now, so nothing was saved. Please try again in a moment."

// storeNotAnswering reports whether err is a store call that ran out of
// time (the budget of a Slack answer, or the connection's own deadline)
// rather than a refusal or a broken request.
func storeNotAnswering(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// refusalCode is the stable reason recorded in the audit for a refused click.
func refusalCode(err error) string {
	if rf, ok := refusalOf(err); ok {
		return rf.code
	}
	return "internal_error"
}

// refusalOf finds the known refusal err wraps, if any.
func refusalOf(err error) (refusal, bool) {
	for _, rf := range refusals {
		if errors.Is(err, rf.err) {
			return rf, true
		}
	}
	return refusal{}, false
}

// isRefusal reports whether err is a known domain refusal (as opposed to a
// system failure).
func isRefusal(err error) bool { return refusalCode(err) != "internal_error" }

func statusWord(s approval.Status) string {
	switch s {
	case approval.StatusApproved, approval.StatusExecuting, approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
		return "approved"
	case approval.StatusRejected:
		return "rejected"
	case approval.StatusResponded:
		return "answered"
	case approval.StatusCancelled:
		return "cancelled"
	case approval.StatusExpired:
		return "expired"
	case approval.StatusAbandoned:
		return "approved, but abandoned by its caller"
	case approval.StatusRefused:
		return "approved, but refused when it was to run"
	}
	return string(s)
}

var errBadPayload = errors.New("bot: malformed payload")
