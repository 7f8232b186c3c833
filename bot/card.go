package bot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
	"github.com/countersign/countersign/approval/policyfile"
)

// Action ids on the card's buttons and the callback ids of the modals they
// open.
const (
	actionApprove = "cs_approve"
	actionEdit    = "cs_edit"
	actionRespond = "cs_respond"
	actionReject  = "cs_reject"
	// actionApproveAllow approves and pre-authorises further calls of the
	// tool by the requester in the task thread (approval.Grant).
	actionApproveAllow = "cs_approve_allow"
	actionRevokeGrant  = "cs_revoke_grant"
	// actionCancelRun and actionRunNow are a cancel window's buttons
	// (approval.ModeAfter).
	actionCancelRun = "cs_cancel_run"
	actionRunNow    = "cs_run_now"
	// actionMarkWrong (Mark as wrong, or Wrong on a sampled call's card)
	// and actionLooksRight judge a final request after the fact.
	actionMarkWrong  = "cs_mark_wrong"
	actionLooksRight = "cs_looks_right"
	feedbackBlock    = "cs_feedback"

	cardActionsBlock  = "cs_actions"
	grantActionsBlock = "cs_grant"
)

// Card layout budgets, well inside Slack's 50 blocks per message.
const (
	maxArgBlocks     = 14   // sections showing arguments
	maxFactBlocks    = 2    // sections of up to 10 fact fields each
	longValue        = 300  // values longer than this get their own section
	diffSideLimit    = 400  // each side of an edit diff line
	reasonLimit      = 1500 // the model's reason
	resultLimit      = 300  // the Ran line's summary of a result
	resultValueLimit = 80   // each field of a result on the Ran line
	maxSignalsShown  = 15
	decisionText     = 1000 // a rejection reason or response shown on the card
	summaryTextLimit = 2500
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

// cardBlocks renders the approval card for r with what the policy says of
// its tool (renderCard).
func (b *Bot) cardBlocks(r *approval.Request) []slack.Block {
	tool, _ := b.policy.Tool(r.Tool)
	return renderCard(r, cardTool{description: tool.Description, order: propOrder(tool.Schema)})
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

// renderCard renders the approval card for r and its tool. Every piece
// of untrusted text (arguments, preview, the model's reason, results) is
// shown as data (lit, code, codeBlock) and cut to fit Block Kit limits,
// whatever its size. Each thing is said once: the arguments only in their
// block, the request id and the digest only in the footer.
func renderCard(r *approval.Request, tool cardTool) []slack.Block {
	if r.Kind == approval.KindContact {
		return contactBlocks(r)
	}
	var blocks []slack.Block
	add := func(b ...slack.Block) { blocks = append(blocks, b...) }

	icon := map[approval.Risk]string{approval.RiskHigh: "🔴", approval.RiskMedium: "🟠", approval.RiskLow: "🟢"}[r.Risk]
	if icon == "" {
		icon = "🔐"
	}
	header := plainFit(fmt.Sprintf("%s %s · %s risk", icon, r.Tool, riskOf(r)), maxHeaderText)
	add(slack.NewHeaderBlock(slack.NewTextBlockObject(slack.PlainTextType, header, false, false)))

	who := "Requested " + requestedBy(r)
	if r.Origin.Channel != "" {
		who += " in " + channelRef(r.Origin.Channel)
	}
	if r.Origin.Permalink != "" {
		who += " · " + link(r.Origin.Permalink, "task thread")
	}
	add(contextBlock(who))
	if r.Undeclared {
		add(contextBlock(undeclaredText(r)))
	}
	if r.Status == approval.StatusPending && r.Caller.Gateway == approval.GatewayExtAuthz {
		add(contextBlock(noEditText))
	}

	add(previewBlocks(r, tool.description)...)
	add(argumentBlocks(r.Args, argumentsTitle(r), r.Formats, tool.order)...)
	add(callerFactBlocks(r)...)
	if len(r.OriginalArgs) > 0 {
		if diff := diffText(r.OriginalArgs, r.Args); diff != "" {
			add(mrkdwnSection(fitSection("*Edited by the approver* (before → after)\n", diff)))
		}
		if line := editQuorumLine(r); line != "" {
			add(mrkdwnSection(plainFit(line, maxSectionText)))
		}
	}
	if signals := cardSignals(r); len(signals) > 0 {
		var sb strings.Builder
		sb.WriteString("*Why a human must look*")
		for i, s := range signals {
			if i == maxSignalsShown {
				fmt.Fprintf(&sb, "\n• …and %d more", len(signals)-i)
				break
			}
			text := s.Text
			if text == "" {
				text = s.Code
			}
			sb.WriteString("\n• " + lit(clip.Runes(text, 150)))
		}
		add(mrkdwnSection(plainFit(sb.String(), maxSectionText)))
	}
	if strings.TrimSpace(r.Reason) != "" || r.Confidence != nil {
		text := "*Model's reason (unverified):*"
		if strings.TrimSpace(r.Reason) != "" {
			text += "\n" + quote(litFit(r.Reason, reasonLimit))
		} else {
			text += " none given"
		}
		if r.Confidence != nil {
			text += fmt.Sprintf("\n_Model's self-reported confidence: %.2f_", *r.Confidence)
		}
		add(mrkdwnSection(plainFit(text, maxSectionText)))
	}

	if r.Status == approval.StatusPending {
		if line := approversLine(r); line != "" {
			add(contextBlock(line))
		}
	}
	// The deadline and the quorum, unless the status line says them.
	status := statusLine(r)
	var meta []string
	switch when := "Deadline " + slackDate(r.Deadline); {
	case r.Mode == approval.ModeSampled:
		if !strings.Contains(status, slackDate(r.Created)) {
			meta = append(meta, "Ran without a human "+slackDate(r.Created)+" (sampled for review)")
		}
	case strings.Contains(status, slackDate(r.Deadline)):
	case r.Mode == approval.ModeAfter:
		meta = append(meta, "Cancel window ends "+slackDate(r.Deadline))
	default:
		meta = append(meta, when)
	}
	if q := max(r.Quorum, 1); (q > 1 || len(r.Approvals) > 0) && !strings.Contains(status, quorumText(r)) {
		meta = append(meta, quorumText(r))
	}
	if len(meta) > 0 {
		add(contextBlock(strings.Join(meta, " · ")))
	}
	if line := escalationLine(r); line != "" {
		add(contextBlock(line))
	}

	if status != "" {
		add(mrkdwnSection(plainFit(status, maxSectionText)))
	}
	if line := executionLine(r); line != "" {
		add(mrkdwnSection(plainFit(line, maxSectionText)))
	}
	if line := grantLine(r); line != "" {
		add(contextBlock(line))
	}
	if line := feedbackLine(r); line != "" {
		add(mrkdwnSection(plainFit(line, maxSectionText)))
	}

	if r.Status == approval.StatusPending && r.Mode == approval.ModeAfter {
		value := refValue(r.ID, r.Digest)
		runNow := slack.NewButtonBlockElement(actionRunNow, value, slack.NewTextBlockObject(slack.PlainTextType, "Run now", false, false))
		runNow.Confirm = slack.NewConfirmationBlockObject(plain("Run it now?"),
			plain("The call runs at once instead of at the end of its cancel window."), plain("Run now"), plain("Back"))
		add(slack.NewActionBlock(cardActionsBlock, runNow,
			slack.NewButtonBlockElement(actionCancelRun, value, slack.NewTextBlockObject(slack.PlainTextType, "Cancel", false, false)).WithStyle(slack.StyleDanger)))
	} else if r.Status == approval.StatusPending {
		value := refValue(r.ID, r.Digest)
		buttons := []slack.BlockElement{
			slack.NewButtonBlockElement(actionApprove, value, slack.NewTextBlockObject(slack.PlainTextType, "Approve", false, false)).WithStyle(slack.StylePrimary).WithConfirm(approveConfirm(r)),
		}
		if approval.OffersGrant(r) {
			label := "Approve + allow " + duration.Format(r.Preauthorize)
			if lim := limitsText(r.PreauthorizeLimits, r.Formats); lim != "" {
				label = plainFit("Approve + allow "+lim+"for "+duration.Format(r.Preauthorize), 75)
			}
			buttons = append(buttons, slack.NewButtonBlockElement(actionApproveAllow, value, slack.NewTextBlockObject(slack.PlainTextType, label, false, false)).WithConfirm(approveConfirm(r)))
		}
		if r.Allows(approval.VerdictEdit) {
			buttons = append(buttons, slack.NewButtonBlockElement(actionEdit, value, slack.NewTextBlockObject(slack.PlainTextType, "Edit", false, false)))
		}
		if r.Allows(approval.VerdictRespond) {
			buttons = append(buttons, slack.NewButtonBlockElement(actionRespond, value, slack.NewTextBlockObject(slack.PlainTextType, "Respond", false, false)))
		}
		buttons = append(buttons, slack.NewButtonBlockElement(actionReject, value, slack.NewTextBlockObject(slack.PlainTextType, "Reject", false, false)).WithStyle(slack.StyleDanger))
		add(slack.NewActionBlock(cardActionsBlock, buttons...))
	}
	add(feedbackActions(r)...)
	if g := r.Grant; g != nil && g.RevokedBy == "" {
		add(slack.NewActionBlock(grantActionsBlock, slack.NewButtonBlockElement(actionRevokeGrant, grantValue(r.ID, g.ID),
			slack.NewTextBlockObject(slack.PlainTextType, "Revoke pre-authorisation", false, false))))
	}
	add(contextBlock(idsLine(r)))
	if len(blocks) > maxMessageBlocks { // cannot happen with the budgets above; stay safe anyway
		blocks = slices.Delete(blocks, maxMessageBlocks-2, len(blocks)-1)
	}
	return blocks
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

// previewBlocks says what will happen: the system-of-record preview's
// summary when there is one, else a plain sentence from the tool's
// description (whatWillHappen), then the preview's facts, named by the
// source the policy gives them.
func previewBlocks(r *approval.Request, description string) []slack.Block {
	p := r.Preview
	var out []slack.Block
	text := "*What will happen*"
	if p.Summary != "" {
		text += "\n" + litFit(p.Summary, summaryTextLimit)
	} else {
		text += "\n" + whatWillHappen(r, description)
	}
	if p.Error != "" {
		text += "\n:warning: *Could not read the system of record:* " + litFit(p.Error, 300)
	}
	out = append(out, mrkdwnSection(plainFit(text, maxSectionText)))
	out = append(out, factBlocks(p.Facts)...)
	if len(p.Facts) > 0 {
		source := "the system of record"
		if p.Source != "" {
			source = lit(clip.Runes(p.Source, 100))
		}
		out = append(out, contextBlock("Facts from "+source))
	}
	return out
}

// callerFactBlocks are the facts r's caller supplied that the arguments do
// not already show, told apart from the system of record's: the caller's
// agent wrote them, nobody checked them. They come after the arguments.
func callerFactBlocks(r *approval.Request) []slack.Block {
	facts := newFacts(r.Preview.CallerFacts, r.Args)
	if len(facts) == 0 {
		return nil
	}
	return append([]slack.Block{mrkdwnSection("*Supplied by the caller* _(not from a system of record; unverified)_")}, factBlocks(facts)...)
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

// factBlocks lays facts out as section fields, within Block Kit limits.
func factBlocks(facts []approval.Fact) []slack.Block {
	var out []slack.Block
	for i := 0; i < maxFactBlocks && len(facts) > 0; i++ {
		n := min(len(facts), maxSectionFields)
		fields := make([]*slack.TextBlockObject, 0, n)
		for j, f := range facts[:n] {
			if i == maxFactBlocks-1 && j == n-1 && len(facts) > n {
				fields = append(fields, mrkdwn(fmt.Sprintf("_…and %d more facts_", len(facts)-n+1)))
				break
			}
			label := lit(clip.Runes(f.Label, 200))
			fields = append(fields, mrkdwn("*"+label+"*\n"+litFit(f.Value, maxFieldText-runes(label)-4)))
		}
		out = append(out, slack.NewSectionBlock(nil, fields, nil))
		facts = facts[n:]
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

// argItems splits args into top-level properties: first those order
// names, in its order (the schema's), then the rest sorted. Strings are
// shown quoted when short and on one line, raw when long; other values as
// compact JSON. Arguments that are not an object are one item.
func argItems(args json.RawMessage, order []string) []argItem {
	canon, err := approval.Canonical(args)
	if err != nil {
		return []argItem{{name: "(unparsable arguments)", value: string(args), long: true}}
	}
	dec := json.NewDecoder(bytes.NewReader(canon))
	dec.UseNumber()
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return []argItem{{name: "(arguments)", value: string(canon), long: len(canon) > longValue}}
	}
	names := make([]string, 0, len(obj))
	for _, k := range order {
		if _, ok := obj[k]; ok && !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	rest := make([]string, 0, len(obj)-len(names))
	for k := range obj {
		if !slices.Contains(names, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	names = append(names, rest...)
	items := make([]argItem, 0, len(names))
	for _, k := range names {
		raw := obj[k]
		it := argItem{key: k, name: argName(k), value: string(raw), raw: raw}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if strings.Contains(s, "\n") || runes(s) > longValue {
				it.value, it.long = s, true
			}
		} else if runes(it.value) > longValue {
			it.long = true
		}
		items = append(items, it)
	}
	return items
}

// argumentBlocks renders the exact arguments as code blocks, in order
// (argItems) with the short ones first: short values grouped into
// sections, then each long one in its own section, each cut with a
// visible note when over the limit.
func argumentBlocks(args json.RawMessage, title string, formats map[string]approval.ValueFormat, order []string) []slack.Block {
	items := argItems(args, order)
	slices.SortStableFunc(items, func(a, b argItem) int {
		switch {
		case a.long == b.long:
			return 0
		case b.long:
			return -1
		}
		return 1
	})
	var out []slack.Block
	label := title
	var cur []string // lines of the current short-value group, raw
	flush := func() {
		if len(cur) == 0 {
			return
		}
		out = append(out, mrkdwnSection(label+codeBlock(strings.Join(cur, "\n"))))
		label, cur = "", nil
	}
	for i, it := range items {
		if len(out) >= maxArgBlocks-1 {
			flush()
			rest := make([]string, 0, len(items)-i)
			for _, r := range items[i:] {
				rest = append(rest, r.name)
			}
			out = append(out, mrkdwnSection(litFit(fmt.Sprintf("…and %d more arguments not shown: %s", len(rest), strings.Join(rest, ", ")), maxSectionText)))
			return out
		}
		if it.long {
			flush()
			head := label + code(clip.Runes(it.name, 200))
			if n := runes(it.value); n > longValue {
				head += fmt.Sprintf(" _(%d chars)_", n)
			}
			out = append(out, mrkdwnSection(fitSection(head+"\n", it.value)))
			label = ""
			continue
		}
		line := clip.Runes(it.name, 200) + ": " + it.value + formatted(it, formats)
		if runes(label+codeBlock(strings.Join(append(cur, line), "\n"))) > maxSectionText {
			flush()
		}
		cur = append(cur, line)
	}
	flush()
	if len(out) == 0 {
		out = append(out, mrkdwnSection(title+"_none_"))
	}
	return out
}

// diffText lists the top-level arguments an edit changed, before → after.
func diffText(before, after json.RawMessage) string {
	var lines []string
	for _, c := range approval.DiffArgs(before, after, 1) {
		name := "(arguments)"
		if c.Keys != nil {
			name = argName(c.Path)
		}
		bv, av := string(c.Before), string(c.After)
		if c.Before == nil {
			bv = "(absent)"
		}
		if c.After == nil {
			av = "(removed)"
		}
		lines = append(lines, fmt.Sprintf("%s: %s → %s", clip.Runes(name, 100), plainFit(bv, diffSideLimit), plainFit(av, diffSideLimit)))
	}
	return strings.Join(lines, "\n")
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

// statusLine says where the request is: pending with quorum progress, or
// who decided what and when.
func statusLine(r *approval.Request) string {
	if r.Kind == approval.KindContact {
		return contactStatusLine(r)
	}
	d := r.Decision
	by, at := "", ""
	if d != nil {
		by, at = mention(d.Approver), slackDate(d.At)
	}
	withText := func(s, label string) string {
		if d != nil && strings.TrimSpace(d.Text) != "" {
			s += "\n*" + label + ":* " + litFit(d.Text, decisionText)
		}
		return s
	}
	if r.Mode == approval.ModeSampled {
		return "🔎 *Sampled for review* · ran " + slackDate(r.Created) + " without a human — was this right?"
	}
	switch r.Status {
	case approval.StatusPending:
		if r.Mode == approval.ModeAfter {
			// The date stays outside the bold: a <!date…> inside *…* is
			// not bold in Slack, and the asterisks show.
			return "⏱ *Runs unless cancelled* · " + slackDate(r.Deadline) + " · approvers may cancel it (the agent is told why) or run it now"
		}
		s := "⏳ *Waiting for approval* · " + quorumText(r)
		if ro := r.Reopened; ro != nil {
			// Approved once, then judged at its claim under the policy in
			// force: the card asks for the rest and says why.
			s += fmt.Sprintf("\n*Approved, but not enough to run:* %s (judged %s, before it ran)", litFit(ro.Reason, decisionText), slackDate(ro.At))
		}
		return s
	case approval.StatusRefused:
		s := "⛔ *Approved, but refused when it was to run* · nothing ran and nothing will"
		if d != nil && d.Approver != "" && d.Verdict.Human() {
			s = fmt.Sprintf("⛔ *Approved* by %s · %s — *refused when it was to run* · nothing ran and nothing will", by, at)
		}
		if why := strings.TrimSpace(r.Result); why != "" {
			s += "\n*Why:* " + litFit(why, decisionText)
		}
		return s
	case approval.StatusRejected:
		if d != nil && d.Verdict == approval.VerdictCancel {
			return withText(fmt.Sprintf("🚫 *Cancelled* by %s · %s · in its cancel window, so nothing ran", by, at), "Reason")
		}
		return withText(fmt.Sprintf("❌ *Rejected* by %s · %s", by, at), "Reason")
	case approval.StatusResponded:
		return withText(fmt.Sprintf("💬 *Answered instead of running* by %s · %s", by, at), "Response")
	case approval.StatusExpired:
		when := slackDate(r.Deadline)
		if d != nil && !d.At.IsZero() {
			when = slackDate(d.At)
		}
		return "⌛ *Expired* with no decision · " + when + " · nothing ran"
	case approval.StatusCancelled:
		return withText("🚫 *Cancelled* · "+at, "Why")
	case approval.StatusLost:
		return "⚠️ *Lost*: this request vanished from Countersign's store (Redis lost its data) · nothing ran and nothing will · ask again if it is still needed"
	case approval.StatusAbandoned:
		s := "🕳 *Approved* · " + at + " — the caller had gone, so nothing ran"
		if d != nil && d.Approver != "" && d.Verdict.Human() {
			s = fmt.Sprintf("🕳 *Approved* by %s · %s — the caller had gone, so nothing ran", by, at)
		}
		if r.ClaimWindow > 0 {
			s += fmt.Sprintf(" (it did not take the call up within %s of the approval; it never will)", duration.Format(r.ClaimWindow))
		}
		return s
	}
	if d == nil {
		return ""
	}
	verb := "✅ *Approved*"
	switch d.Verdict {
	case approval.VerdictEdit:
		verb = "✏️ *Approved with edits*"
	case approval.VerdictRunNow:
		verb = "▶️ *Run now*"
	case approval.VerdictWindowElapsed:
		return "⏱ *Cancel window ended* · " + at + " · nobody cancelled, so it runs"
	}
	s := fmt.Sprintf("%s by %s · %s", verb, by, at)
	if len(r.Approvals) > 1 {
		s += " · " + quorumText(r)
	}
	return s
}

// feedbackLine says how an approver judged r after the fact, if anyone did.
func feedbackLine(r *approval.Request) string {
	f := r.Feedback
	switch {
	case f == nil:
		return ""
	case f.Wrong:
		s := fmt.Sprintf("🚩 *Marked wrong* by %s · %s", mention(f.By), slackDate(f.At))
		if strings.TrimSpace(f.Reason) != "" {
			s += "\n*Why:* " + litFit(f.Reason, decisionText)
		}
		return s
	}
	return fmt.Sprintf("👍 *Looks right* to %s · %s", mention(f.By), slackDate(f.At))
}

// executionLine reports the tool's outcome once known.
func executionLine(r *approval.Request) string {
	var head string
	switch r.Status {
	case approval.StatusExecuting:
		return "⚙️ Running…"
	case approval.StatusExecuted:
		head = "✅ *Ran*"
	case approval.StatusFailed:
		head = "⚠️ *Failed*"
	case approval.StatusUnknown:
		head = "❓ *Outcome unknown* (the process stopped while running it; it will not be retried automatically)"
		if r.Caller.Kind == approval.CallerHumanLayer {
			// Claimed on its caller's behalf by the answer that reported
			// the approval: the SDK runs it and reports nothing.
			head = "➡️ *Handed to the caller*"
		}
	default:
		return ""
	}
	if strings.TrimSpace(r.Result) == "" {
		return head
	}
	return head + ": " + resultSummary(r)
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
