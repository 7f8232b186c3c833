package bot

// This file: the pieces of a card that use nothing else of it (card.go
// composes them): lines about the request (who asked, its risk, quorum,
// approvers, a grant, its ids), a contact request's question, what a
// button carries, and the block constructors.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/policyfile"
)

// refValue is what a button carries: the request id and the digest of the
// arguments the card showed. Nothing else.
func refValue(id, digest string) string { return id + "|" + digest }

// parseRef splits a button value or private_metadata into request id,
// digest and (for modals) the card location.
func parseRef(v string) (id, digest string, card approval.CardRef, ok bool) {
	parts := strings.Split(v, "|")
	if len(parts) != 2 && len(parts) != 4 {
		return "", "", card, false
	}
	if parts[0] == "" || parts[1] == "" {
		return "", "", card, false
	}
	if len(parts) == 4 {
		card = approval.CardRef{Channel: parts[2], TS: parts[3]}
	}
	return parts[0], parts[1], card, true
}

// cardFallback is the notification text of a card.
func cardFallback(r *approval.Request) string {
	tool := lit(clip.Runes(r.Tool, 100))
	if r.Kind == approval.KindContact {
		if r.Status.Decided() {
			return "Question: " + statusWord(r.Status)
		}
		return fmt.Sprintf("Question asked %s: %s", callerText(r), litFit(questionOf(r).Msg, 200))
	}
	if r.Mode == approval.ModeSampled {
		return fmt.Sprintf("%s ran without a human (%s): was this right?", tool, lit(string(r.Status)))
	}
	if r.Status.Decided() {
		return fmt.Sprintf("%s: %s", tool, lit(string(r.Status)))
	}
	if r.Mode == approval.ModeAfter {
		return fmt.Sprintf("%s runs %s unless cancelled (requested %s)", tool, slackDate(r.Deadline), requestedBy(r))
	}
	// mention is already safe mrkdwn; escaping it again would show the
	// requester as a literal "<@U…>" in the notification.
	return fmt.Sprintf("Approval needed: %s (%s risk) requested %s", tool, lit(riskOf(r)), requestedBy(r))
}

// callerText says who asked for a request made from outside the agent
// loop: the MCP upstream a call came from through the MCP gateway, else
// the API (or its HumanLayer endpoints); the API key's name; and the Slack
// user it acts for when mapped. Such a request has no task thread to link
// to.
func callerText(r *approval.Request) string {
	key := code(clip.Runes(r.Caller.Name, 80))
	var s string
	switch {
	case r.Caller.Gateway == approval.GatewayExtAuthz:
		s = "through the gateway (Envoy ext_authz"
		if r.Caller.Route != "" {
			s += ", route " + code(clip.Runes(r.Caller.Route, 80))
		}
		if r.Caller.Upstream != "" {
			s += ", MCP server " + code(clip.Runes(r.Caller.Upstream, 80))
		}
		s += ", key " + key + ")"
	case r.Caller.Upstream != "":
		s = "through MCP upstream " + code(clip.Runes(r.Caller.Upstream, 80)) + " (the MCP gateway, key " + key + ")"
	case r.Caller.Kind == approval.CallerHumanLayer:
		s = "through the HumanLayer API by key " + key
	default:
		s = "through the API by key " + key
	}
	if slackIDRe.MatchString(r.Requester) {
		s += " on behalf of " + mention(r.Requester)
	}
	return s
}

// noEditText says why a request checked by an ext_authz gateway has no
// Edit button, whatever its tool's decisions: the gateway holds the
// caller's request and can only let it through or deny it.
const noEditText = "✋ No edit: the gateway (Envoy ext_authz) can only let this call through as sent or deny it, not change its arguments. Approve or reject it; to change it, reject it with the change in your reason."

// undeclaredText warns that r's tool is not one the policy declares (it
// was judged by the policy's external rule). Where the call came from
// (the MCP upstream, the API key) is said once, on the line above it.
func undeclaredText(r *approval.Request) string {
	return "⚠️ " + code(clip.Runes(r.Tool, 64)) + " is not declared in the policy: judged by its external rule"
}

// requestedBy says who asked for r after "requested": "by @alice" (or
// "by @alice and @bob" when both posted in the task thread), or
// "through the API by key `billing-agent`" for a caller we did not write
// (whose requester is an internal name, not a person).
func requestedBy(r *approval.Request) string {
	if r.Caller.External() {
		return callerText(r)
	}
	if who := askerNames(r, "and", false); who != "" {
		return "by " + who
	}
	return "by " + mention(r.Requester)
}

// requester names who asked for r in a line about it: mentions of
// everyone who asked, or "MCP upstream `github`" or "API key
// `billing-agent`" for a caller with no Slack user.
func requester(r *approval.Request) string {
	if r.Caller.External() && !slackIDRe.MatchString(r.Requester) {
		if r.Caller.Upstream != "" {
			return "MCP upstream " + code(clip.Runes(r.Caller.Upstream, 80))
		}
		return "API key " + code(clip.Runes(r.Caller.Name, 80))
	}
	if who := askerNames(r, "and", false); who != "" {
		return who
	}
	return mention(r.Requester)
}

func riskOf(r *approval.Request) string {
	if r.Risk == "" {
		return "unspecified"
	}
	return string(r.Risk)
}

// cardTool is what the policy says of a card's tool: its description and
// the order of its schema's properties (both empty for a tool the policy
// does not declare).
type cardTool struct {
	description string
	order       []string
}

// propOrder is the names of schema's properties in the order the schema
// declares them; nil when it declares none.
func propOrder(schema json.RawMessage) []string {
	if len(schema) == 0 {
		return nil
	}
	props, err := policyfile.ReadProps(schema)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(props.List))
	for _, p := range props.List {
		names = append(names, p.Name)
	}
	return names
}

// idsLine is the card's footer: the request id and the digest of the
// arguments it shows (what an operator looks up in the audit), in small
// print, said nowhere else on the card.
func idsLine(r *approval.Request) string {
	s := "Request " + code(clip.Runes(r.ID, 80))
	if len(r.Digest) >= 12 {
		s += " · arguments sha256 " + code(r.Digest[:12])
	}
	return s
}

func contextBlock(text string) *slack.ContextBlock {
	return slack.NewContextBlock("", mrkdwn(plainFit(text, maxContextText)))
}

func mrkdwnSection(text string) *slack.SectionBlock {
	return slack.NewSectionBlock(mrkdwn(text), nil, nil)
}

// mrkdwn is a mrkdwn text object of text, which is already safe (lit,
// code, codeBlock). It is verbatim: Slack turns no bare URL, channel name
// or @word in it into a link or a mention; only the markup the bot wrote
// (<@U…>, <#C…>, <url|text>, <!date…>) is one.
func mrkdwn(text string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.MarkdownType, text, false, true)
}

// quote renders safe mrkdwn (lit) as a block quote.
func quote(s string) string { return "> " + strings.ReplaceAll(s, "\n", "\n> ") }

// fitSection renders label (mrkdwn) followed by body, untrusted text, as
// a code block, within the section limit.
func fitSection(label, body string) string {
	return fit(body, maxSectionText, func(s string) string { return label + codeBlock(s) })
}

func quorumText(r *approval.Request) string {
	q := max(r.Quorum, 1)
	names := make([]string, 0, len(r.Approvals))
	for _, a := range r.Approvals {
		names = append(names, mention(a.Approver))
	}
	s := fmt.Sprintf("%d of %d approvals", len(r.Approvals), q)
	if len(names) > 0 {
		s += ": " + strings.Join(names, ", ")
	}
	return s
}

// newFacts is facts without those whose value only repeats an argument's
// (a hook's "Command" fact beside the command argument): the arguments
// show it already.
func newFacts(facts []approval.Fact, args json.RawMessage) []approval.Fact {
	values := argValues(args)
	var out []approval.Fact
	for _, f := range facts {
		repeats := false
		for _, v := range values {
			if s, ok := v.(string); ok && strings.TrimSpace(s) != "" && strings.TrimSpace(s) == strings.TrimSpace(f.Value) {
				repeats = true
				break
			}
		}
		if !repeats {
			out = append(out, f)
		}
	}
	return out
}

// formatted is an argument's value as people read it ("  = $64.00"),
// after its exact value, when the policy gives it a format.
func formatted(it argItem, formats map[string]approval.ValueFormat) string {
	f, ok := formats[it.key]
	if !ok || f.Kind == "" {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(it.raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	s := f.Apply(v)
	if s == it.value || s == strings.Trim(it.value, `"`) {
		return ""
	}
	return "   = " + s
}

// argumentsTitle heads the arguments: what they are at r's stage.
func argumentsTitle(r *approval.Request) string {
	switch r.Status {
	case approval.StatusPending:
		return "*Arguments* (exactly as they will be used)\n"
	case approval.StatusApproved, approval.StatusExecuting, approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
		return "*Arguments* (as approved)\n"
	default:
		return "*Arguments* (as proposed; not run)\n"
	}
}

// approversLine says who may decide r and how many of them are needed, so
// nobody else is left to find out by clicking.
func approversLine(r *approval.Request) string {
	a := r.Approvers
	who := mentionList(a)
	if a.ChannelMembers {
		who = append(who, "members of this channel")
	}
	if len(who) == 0 {
		return ""
	}
	s := "Approvers: " + strings.Join(who, ", ")
	if q := max(r.Quorum, 1); q > 1 {
		s += fmt.Sprintf(" · %d of them needed", q)
	}
	if askers := askerNames(r, "or", true); !a.AllowSelf && askers != "" {
		s += " · not " + askers + " (who asked)"
	}
	return s
}

// approveConfirm is the "are you sure?" dialog on r's Approve buttons, nil
// when r's tool does not ask for one.
func approveConfirm(r *approval.Request) *slack.ConfirmationBlockObject {
	if !r.Confirm {
		return nil
	}
	what := "It runs " + r.Tool + " with the arguments on the card"
	if r.Preview.Summary != "" {
		what += ": " + r.Preview.Summary
	}
	c := slack.NewConfirmationBlockObject(
		slack.NewTextBlockObject(slack.PlainTextType, plainFit("Run "+r.Tool+"?", 100), false, false),
		slack.NewTextBlockObject(slack.PlainTextType, plainFit(what+".", 300), false, false),
		slack.NewTextBlockObject(slack.PlainTextType, "Approve", false, false),
		slack.NewTextBlockObject(slack.PlainTextType, "Go back", false, false))
	c.WithStyle(slack.StylePrimary)
	return c
}

// argItem is one top-level argument, rendered as text (not yet made safe
// for mrkdwn: codeBlock does that).
type argItem struct {
	key   string // the property name as written
	name  string
	value string
	raw   json.RawMessage // the value's JSON
	long  bool            // multi-line or long: shown in its own section
}

var plainArgName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,200}$`)

// argName is how an argument's name is shown on a card. Plain names are
// shown as they are; anything else (newlines, colons, quotes, spaces,
// invisible or direction-changing characters, the empty name) is shown
// Go-quoted, so a name can never pass for another argument's line.
func argName(k string) string {
	if plainArgName.MatchString(k) {
		return k
	}
	return strconv.Quote(k)
}

// grantLine says what pre-authorisation came with r's approval, if any.
func grantLine(r *approval.Request) string {
	g := r.Grant
	if g == nil {
		return ""
	}
	if g.RevokedBy != "" {
		return fmt.Sprintf("🔒 Pre-authorisation revoked by %s · %s", mention(g.RevokedBy), slackDate(g.RevokedAt))
	}
	line := fmt.Sprintf("🔓 %s allowed further %s calls by %s in the same task thread without asking, %suntil %s",
		mention(g.GrantedBy), code(clip.Runes(g.Tool, 100)), mention(g.Requester), lit(limitsText(g.Limits, r.Formats)), slackDate(g.Expires))
	if used := usageText(g, r.Formats); used != "" {
		line += " · " + lit(used)
	}
	return line
}

// limitsText is a pre-authorisation's limits in words, with a trailing
// space ("up to $100 in all, 3 calls "), "" when it has none.
func limitsText(l approval.GrantLimits, formats map[string]approval.ValueFormat) string {
	var parts []string
	if l.Budgeted() {
		if f := formats[l.Argument]; f.Kind != "" {
			parts = append(parts, "up to "+f.Apply(l.MaxTotal)+" in all")
		} else {
			parts = append(parts, "up to "+approval.ValueFormat{}.Apply(l.MaxTotal)+" "+l.Argument+" in all")
		}
	}
	if l.MaxUses > 0 {
		parts = append(parts, fmt.Sprintf("%d more %s", l.MaxUses, plural(l.MaxUses, "call")))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ", ") + " "
}

// usageText is what a pre-authorisation used ("$70 of $100 used, 1 call
// left"), "" before its first use.
func usageText(g *approval.Grant, formats map[string]approval.ValueFormat) string {
	if len(g.Uses) == 0 {
		return ""
	}
	var parts []string
	if g.Limits.Budgeted() {
		f := formats[g.Limits.Argument]
		parts = append(parts, f.Apply(g.Spent)+" of "+f.Apply(g.Limits.MaxTotal)+" used")
	}
	if left := g.UsesLeft(); left >= 0 {
		parts = append(parts, fmt.Sprintf("%d %s left", left, plural(left, "call")))
	}
	if len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("used %d %s", len(g.Uses), plural(len(g.Uses), "time")))
	}
	return strings.Join(parts, ", ")
}

// grantValue is the Revoke button's value: request id and grant id.
func grantValue(requestID, grantID string) string { return requestID + "|" + grantID }

// plumbingKey matches result fields that are plumbing, not what happened:
// the idempotency key Countersign sent with the call.
var plumbingKey = regexp.MustCompile(`(?i)^idempotency[-_]?key$`)

func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

// escalationLine is the card's note on an escalation, empty when r was
// not escalated.
func escalationLine(r *approval.Request) string {
	e := r.Escalated
	if e == nil {
		return ""
	}
	who := mentions(e.To)
	if who == "" {
		who = "the approvers"
	}
	s := "⏫ Escalated to " + who + " · " + slackDate(e.At)
	if e.Widened {
		s += " · they may decide too"
	}
	return s
}

// contactQuestion is a contact request's question, as its Args hold it.
type contactQuestion struct {
	Msg     string `json:"msg"`
	Subject string `json:"subject"`
}

func questionOf(r *approval.Request) contactQuestion {
	var q contactQuestion
	if json.Unmarshal(r.Args, &q) != nil || strings.TrimSpace(q.Msg) == "" {
		q.Msg = string(r.Args) // never hide what was asked
	}
	return q
}

// choiceList lists the caller's choices for a card.
func choiceList(cs []approval.Choice) string {
	var sb strings.Builder
	for i, c := range cs {
		if i > 0 {
			sb.WriteString("\n")
		}
		sb.WriteString("• " + lit(clip.Runes(c.Label(), maxOptionText)))
		if c.Description != "" {
			sb.WriteString(" — " + lit(clip.Runes(c.Description, 200)))
		}
	}
	return sb.String()
}

// choiceNamed returns r's choice called name.
func choiceNamed(r *approval.Request, name string) (approval.Choice, bool) {
	for _, c := range r.Choices {
		if name != "" && c.Name == name {
			return c, true
		}
	}
	return approval.Choice{}, false
}
