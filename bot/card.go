package bot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
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

// cardBlocks renders the approval card for r with what the policy says of
// its tool (renderCard).
func (b *Bot) cardBlocks(r *approval.Request) []slack.Block {
	tool, _ := b.policy.Tool(r.Tool)
	return renderCard(r, cardTool{description: tool.Description, order: propOrder(tool.Schema)})
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
		if r.StepUp != nil {
			// Said before the buttons: a click on Approve opens a page, it
			// does not count yet.
			add(contextBlock("🔑 " + lit(stepUpSentence(r.StepUp)))) // Unicode, as the card's other signs: a shortcode is Slack's alone
		}
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

// stepUpSentence is the card's step-up note as a sentence: "Your vote
// needs a passkey confirmation: Approve opens a page to confirm it."
func stepUpSentence(n *approval.StepUpNeed) string {
	w := n.Words()
	return strings.ToUpper(w[:1]) + w[1:] + ": Approve opens a page to confirm it."
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

// resultSummary is r's result for people, on one line of safe mrkdwn (lit):
// a JSON object as its scalar fields ("id EM-1 · subject Sorry · to
// dana@example.com"), a list as its length, text as it is. It leaves out
// the idempotency key and long values that only repeat an argument the
// card already shows (an email's body); every value is cut to
// resultValueLimit and the line to resultLimit, each with a note. A field
// named like an argument the policy formats reads in that format
// ("amount $64.00").
func resultSummary(r *approval.Request) string {
	s := strings.TrimSpace(r.Result)
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return litFit(oneLine(s), resultLimit)
	}
	switch v := v.(type) {
	case map[string]any:
		args := argValues(r.Args)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var parts []string
		for _, k := range keys {
			var text string
			switch x := v[k].(type) {
			case string:
				text = x
				if f, ok := r.Formats[k]; ok && f.Kind != "" {
					text = f.Apply(x)
				}
			case json.Number:
				text = x.String()
				if f, ok := r.Formats[k]; ok && f.Kind != "" {
					text = f.Apply(x)
				}
			case bool:
				text = fmt.Sprint(x)
			default:
				continue
			}
			if plumbingKey.MatchString(k) {
				continue
			}
			if a, ok := args[k]; ok && a == v[k] && (runes(text) > resultValueLimit || strings.Contains(text, "\n")) {
				continue // the card shows it among the arguments
			}
			parts = append(parts, argName(k)+" "+plainFit(oneLine(text), resultValueLimit))
		}
		if len(parts) == 0 {
			return "done"
		}
		return litFit(strings.Join(parts, " · "), resultLimit)
	case []any:
		return fmt.Sprintf("%d items", len(v))
	case string:
		return litFit(oneLine(v), resultLimit)
	}
	return litFit(oneLine(s), resultLimit)
}

// contactBlocks renders the Respond card of a contact request: who asks,
// the question, the answers the caller suggests, who may answer, and an
// Answer button while it waits.
func contactBlocks(r *approval.Request) []slack.Block {
	q := questionOf(r)
	head := "💬 Question"
	if q.Subject != "" {
		head += ": " + q.Subject
	}
	blocks := []slack.Block{
		slack.NewHeaderBlock(plain(plainFit(head, maxHeaderText))),
		contextBlock("Asked " + callerText(r)),
		mrkdwnSection(plainFit("*The agent asks:*\n"+quote(litFit(q.Msg, summaryTextLimit)), maxSectionText)),
	}
	if len(r.Choices) > 0 {
		blocks = append(blocks, mrkdwnSection(plainFit("*Answers the agent suggests*\n"+choiceList(r.Choices), maxSectionText)))
	}
	if r.Status == approval.StatusPending {
		if line := approversLine(r); line != "" {
			blocks = append(blocks, contextBlock(strings.Replace(line, "Approvers: ", "Who may answer: ", 1)))
		}
	}
	blocks = append(blocks, contextBlock("Deadline "+slackDate(r.Deadline)))
	if line := statusLine(r); line != "" {
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	if line := feedbackLine(r); line != "" {
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	if r.Status == approval.StatusPending {
		blocks = append(blocks, slack.NewActionBlock(cardActionsBlock,
			slack.NewButtonBlockElement(actionRespond, refValue(r.ID, r.Digest), plain("Answer")).WithStyle(slack.StylePrimary)))
	}
	blocks = append(blocks, feedbackActions(r)...)
	return append(blocks, contextBlock(idsLine(r)))
}

// contactStatusLine says where a contact request is.
func contactStatusLine(r *approval.Request) string {
	d := r.Decision
	switch r.Status {
	case approval.StatusPending:
		return "⏳ *Waiting for an answer*"
	case approval.StatusResponded:
		s := fmt.Sprintf("💬 *Answered* by %s · %s", mention(d.Approver), slackDate(d.At))
		c, picked := choiceNamed(r, d.Choice)
		if picked && strings.TrimSpace(d.Text) != strings.TrimSpace(c.Label()) {
			s += "\n*Picked:* " + lit(clip.Runes(c.Label(), maxOptionText))
		}
		// An option picked without words of one's own is the answer: once.
		return s + "\n*Answer:* " + litFit(d.Text, decisionText)
	case approval.StatusRejected:
		s := fmt.Sprintf("❌ *Declined* by %s · %s", mention(d.Approver), slackDate(d.At))
		if strings.TrimSpace(d.Text) != "" {
			s += "\n*Why:* " + litFit(d.Text, decisionText)
		}
		return s
	case approval.StatusExpired:
		return "⌛ *Expired* with no answer · " + slackDate(r.Deadline) + " · the agent was told none will come"
	}
	return ""
}

// feedbackActions are the buttons that judge a final request after the
// fact (Mark as wrong; Looks right / Wrong on a sampled call's card).
func feedbackActions(r *approval.Request) []slack.Block {
	if !r.Markable() {
		return nil
	}
	value := refValue(r.ID, r.Digest)
	if r.Mode == approval.ModeSampled && r.Feedback == nil {
		return []slack.Block{slack.NewActionBlock(feedbackBlock,
			slack.NewButtonBlockElement(actionLooksRight, value, slack.NewTextBlockObject(slack.PlainTextType, "Looks right", false, false)).WithStyle(slack.StylePrimary),
			slack.NewButtonBlockElement(actionMarkWrong, value, slack.NewTextBlockObject(slack.PlainTextType, "Wrong", false, false)).WithStyle(slack.StyleDanger))}
	}
	return []slack.Block{slack.NewActionBlock(feedbackBlock,
		slack.NewButtonBlockElement(actionMarkWrong, value, slack.NewTextBlockObject(slack.PlainTextType, "Mark as wrong", false, false)))}
}
