package bot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Message size budgets for thread posts.
const (
	maxAnswerBlocks = 10
	maxThreadText   = 12000
)

// cardEventType is the message metadata type of an approval card; its
// payload names the request, so a card posted by a process that stopped
// before binding it can be found again (findCard).
const cardEventType = "countersign_card"

// Post posts r's approval card to the approvals channel and returns where
// it is (the card writer of approval.Cards: Slack only). The lifecycle
// binds it at once (Lifecycle.BindCard: recorded, audited card_posted):
// after the binding only a click on this very message decides r. A click
// on the card that arrives before Slack answers the post binds it itself
// (bindClicked), so nobody waits for that answer. With again (an earlier
// attempt may have posted the card: a process stopped between posting and
// binding), that card is looked up (conversations.history, its metadata
// naming r) and returned, found, instead of posting a second one. A 429 is
// waited out, never dropped. When Slack refuses for good
// (channel_not_found, not_in_channel, invalid_auth…) it logs what the
// operator must fix, tells the task thread, and returns an error: the
// caller must fail closed.
func (b *Bot) Post(ctx context.Context, r *approval.Request, again bool) (approval.CardRef, bool, error) {
	channel := b.policy.Slack.ApprovalsChannel
	log := b.log.With("request_id", r.ID, "run_id", r.RunID, "tool", r.Tool, "channel", channel)
	if again {
		ref, found, err := b.findCard(ctx, r, "")
		if err != nil {
			return approval.CardRef{}, false, fmt.Errorf("look for the approval card of %s: %w", r.ID, err)
		}
		if found {
			return ref, true, nil
		}
	}
	rr := *r
	if rr.Origin.Permalink == "" && rr.Origin.Channel != "" && rr.Origin.ThreadTS != "" {
		rr.Origin.Permalink = b.permalink(ctx, rr.Origin.Channel, rr.Origin.ThreadTS)
	}
	var ts string
	err := b.retry(ctx, limitKey("chat.postMessage", channel), func(ctx context.Context) error {
		var err error
		_, ts, err = b.messages.PostMessageContext(ctx, channel,
			slack.MsgOptionText(cardFallback(&rr), false),
			slack.MsgOptionBlocks(b.cardBlocks(&rr)...),
			slack.MsgOptionMetadata(slack.SlackMetadata{EventType: cardEventType, EventPayload: map[string]any{"request_id": r.ID}}),
			slack.MsgOptionDisableLinkUnfurl(),
			slack.MsgOptionDisableMediaUnfurl())
		return err
	})
	if err != nil && ctx.Err() != nil {
		// The caller stopped (shutdown, or a run whose lease went with
		// Redis's data) before Slack answered: the card may be up or not.
		// Whoever stopped it says what became of the request (a later
		// attempt looks for the card; a lost request's is looked for and
		// drawn lost): nothing to tell the thread from here.
		log.WarnContext(ctx, "approval card post cut short before Slack answered", "err", err)
		return approval.CardRef{}, false, fmt.Errorf("post approval card for %s to %s: %w", r.ID, channel, err)
	}
	if err != nil {
		slackErr := slackCode(err)
		level, hint := failureLog(err, channel)
		log.Log(ctx, level, "cannot post approval card; the request fails closed", "slack_error", slackErr, "hint", hint, "err", err)
		why := "Slack is not reachable"
		if slackErr != "" {
			why = "Slack said " + code(slackErr)
		}
		_ = b.tellThread(ctx, r, fmt.Sprintf("⚠️ I couldn't post the approval request for %s to %s (%s). Nothing was run; an operator has to fix the Slack set-up.",
			code(clip.Runes(r.Tool, 100)), channelRef(channel), why))
		return approval.CardRef{}, false, fmt.Errorf("post approval card for %s to %s: %w", r.ID, channel, err)
	}
	rr.Card = approval.CardRef{Channel: channel, TS: ts}
	b.cards.drew(&rr) // what it shows, with the task thread's link (forgotten if it is deleted)
	return rr.Card, false, nil
}

// Posted tells r's task thread, once r's card is bound, what is waiting
// and for whom (the waiting note, replaced by the decision line later).
// A request without a task thread (an API request) gets nothing, nor a
// sampled call (it already ran: the run's answer told the thread).
func (b *Bot) Posted(ctx context.Context, r *approval.Request) {
	b.cards.boundAt(r)
	if r.Mode == approval.ModeSampled || r.Origin.Channel == "" {
		return
	}
	if note, err := b.postThreadTS(ctx, r.Origin, waitingLine(r)); err != nil {
		b.log.Error("post waiting note in task thread", "request_id", r.ID, "err", err)
	} else {
		b.rememberWaitingNote(r.ID, note)
	}
}

// Delete deletes c, a message posted as r's card that is not r's card (a
// second card, or one that could not be bound): it could decide nothing.
func (b *Bot) Delete(ctx context.Context, r *approval.Request, c approval.CardRef) {
	b.cards.forget(r.ID, c)
	b.deleteMessage(ctx, c)
}

func (b *Bot) deleteMessage(ctx context.Context, ref approval.CardRef) {
	err := b.retry(ctx, "chat.delete", func(ctx context.Context) error {
		_, _, err := b.messages.DeleteMessageContext(ctx, ref.Channel, ref.TS)
		return err
	})
	if err != nil {
		b.log.Error("chat.delete of an unbound card failed; it stays but can decide nothing", "channel", ref.Channel, "ts", ref.TS, "err", err)
	}
}

// findCardPages bounds the history pages read looking for an unbound card.
const findCardPages = 20

// findCard looks in the approvals channel, from r's creation on (or over
// the latest findCardPages pages when r's creation is not known: a lost
// request told from the run's own record), for a card this app posted
// for r (its metadata names r): the message at ts when ts is set (a
// clicked message), else the newest such card.
func (b *Bot) findCard(ctx context.Context, r *approval.Request, ts string) (approval.CardRef, bool, error) {
	channel := b.policy.Slack.ApprovalsChannel
	self := b.identity()
	params := &slack.GetConversationHistoryParameters{
		ChannelID: channel, Limit: 200, IncludeAllMetadata: true,
	}
	if !r.Created.IsZero() {
		params.Oldest = fmt.Sprintf("%d.000000", r.Created.Add(-time.Minute).Unix())
	}
	if ts != "" {
		params.Latest, params.Inclusive = ts, true // the clicked message first
	}
	for range findCardPages {
		var res *slack.GetConversationHistoryResponse
		err := b.retry(ctx, "conversations.history", func(ctx context.Context) error {
			var err error
			res, err = b.messages.GetConversationHistoryContext(ctx, params)
			return err
		})
		if err != nil {
			return approval.CardRef{}, false, err
		}
		for _, m := range res.Messages {
			if (ts == "" || m.Timestamp == ts) && isCardOf(m.Metadata, m.BotID, self, r.ID) {
				return approval.CardRef{Channel: channel, TS: m.Timestamp}, true, nil
			}
		}
		if !res.HasMore || res.ResponseMetaData.NextCursor == "" {
			return approval.CardRef{}, false, nil
		}
		params.Cursor = res.ResponseMetaData.NextCursor
	}
	return approval.CardRef{}, false, nil
}

// isCardOf reports whether a message with metadata md, posted by botID,
// is this app's card of request id.
func isCardOf(md slack.SlackMetadata, botID string, self identity, id string) bool {
	return md.EventType == cardEventType && md.EventPayload["request_id"] == id && (self.BotID == "" || botID == self.BotID)
}

// updateCard redraws the card with chat.update, waiting out at most
// cardUpdateWaits rate limits (the card writer tries again later).
func (b *Bot) updateCard(ctx context.Context, r *approval.Request) error {
	if !r.Card.Bound() {
		return fmt.Errorf("update card of %s: no card posted yet", r.ID)
	}
	err := b.retryLimited(ctx, "chat.update", cardUpdateWaits, func(ctx context.Context) error {
		_, _, _, err := b.messages.UpdateMessageContext(ctx, r.Card.Channel, r.Card.TS,
			slack.MsgOptionText(cardFallback(r), false),
			slack.MsgOptionBlocks(b.cardBlocks(r)...))
		return err
	})
	if err != nil {
		level, hint := failureLog(err, r.Card.Channel)
		b.log.Log(ctx, level, "cannot update approval card", "request_id", r.ID, "tool", r.Tool, "slack_error", slackCode(err), "hint", hint, "err", err)
		return fmt.Errorf("update card of %s: %w", r.ID, err)
	}
	return nil
}

// waitingLine is the task thread's note while r waits: who may decide and
// by when (no channel id or link: the requester may not see the approvals
// channel). The decision line replaces it.
func waitingLine(r *approval.Request) string {
	who := "an approver"
	if q := max(r.Quorum, 1); q > 1 {
		who = fmt.Sprintf("%d approvers", q)
	}
	if r.Mode == approval.ModeAfter {
		return fmt.Sprintf("⏱ %s runs %s unless an approver cancels it. You will be told here.",
			code(clip.Runes(r.Tool, 100)), slackDate(r.Deadline))
	}
	return fmt.Sprintf("⏳ %s is waiting for %s to decide, until %s. You will be told here.",
		code(clip.Runes(r.Tool, 100)), who, slackDate(r.Deadline))
}

// rememberWaitingNote keeps where request id's waiting note is, so the
// decision replaces it (in this process; after a restart the decision is
// posted as a new line).
func (b *Bot) rememberWaitingNote(id, ts string) {
	b.notedMu.Lock()
	defer b.notedMu.Unlock()
	if len(b.waitingNotes) > 50000 { // bounded memory; at worst a note stays
		clear(b.waitingNotes)
	}
	b.waitingNotes[id] = ts
}

// tellThread tells r's task thread line, replacing r's waiting note when
// this process posted it: the note is deleted once the line is up, so the
// thread never shows a request as waiting after it was decided.
//
// A request made through the HTTP API has no task thread (its Origin is
// empty, its Caller set): nothing is posted for it, by design — its caller
// learns the outcome from the API and its webhooks, approvers from the
// card.
func (b *Bot) tellThread(ctx context.Context, r *approval.Request, line string) error {
	if r.Origin.Channel == "" {
		return nil
	}
	if err := b.postThread(ctx, r.Origin, line); err != nil {
		return err
	}
	b.notedMu.Lock()
	note := b.waitingNotes[r.ID]
	delete(b.waitingNotes, r.ID)
	b.notedMu.Unlock()
	if note == "" {
		return nil
	}
	err := b.retry(ctx, "chat.delete", func(ctx context.Context) error {
		_, _, err := b.messages.DeleteMessageContext(ctx, r.Origin.Channel, note)
		return err
	})
	if err != nil {
		b.log.Warn("remove the waiting note", "request_id", r.ID, "err", err)
	}
	return nil
}

// Decided tells r's task thread what became of r (threadLine), in place of
// its waiting note, once per state in this process; it returns once the
// line is posted. The run that r belongs to calls it (agent.Notifier)
// before it acts on r, so the decision line always comes before what
// follows from it (the tool's result, the run's answer), whichever
// process recorded the decision. A request whose card was never bound
// showed nobody a wait: the failure to post it told the thread already —
// except a lost one (Redis lost its data, maybe between the card's post
// and its binding, where nobody else tells): the thread always learns
// that nothing ran.
func (b *Bot) Decided(ctx context.Context, r *approval.Request) error {
	if r == nil || (!r.Card.Bound() && r.Status != approval.StatusLost) {
		return nil
	}
	line, key := threadLine(r)
	if line == "" || !b.firstNote(r.ID, key) {
		return nil
	}
	if err := b.tellThread(ctx, r, line); err != nil {
		return fmt.Errorf("tell the task thread about %s: %w", r.ID, err)
	}
	return nil
}

// threadLine is what the task thread is told about r, with a key naming
// that state; empty while nothing final happened.
func threadLine(r *approval.Request) (line, key string) {
	if r.Mode == approval.ModeSampled {
		return "", "" // reviewed after it ran; the run's answer told the thread
	}
	tool := code(clip.Runes(r.Tool, 100))
	d := r.Decision
	by := "someone"
	text := ""
	if d != nil {
		by = mention(d.Approver)
		if t := strings.TrimSpace(d.Text); t != "" {
			text = ": " + keepMentions(litFit(t, 1000)) // "the run stopped: … rejected by <@U…>"
		}
	}
	switch r.Status {
	case approval.StatusApproved, approval.StatusExecuting, approval.StatusExecuted:
		switch {
		case d != nil && d.Verdict == approval.VerdictEdit:
			return fmt.Sprintf("✏️ %s approved with edits by %s", tool, by), "approved"
		case d != nil && d.Verdict == approval.VerdictRunNow:
			return fmt.Sprintf("▶️ %s run now by %s, before its cancel window ended", tool, by), "approved"
		case d != nil && d.Verdict == approval.VerdictWindowElapsed:
			return fmt.Sprintf("⏱ %s runs: nobody cancelled it within its cancel window", tool), "approved"
		}
		return fmt.Sprintf("✅ %s approved by %s", tool, by), "approved"
	case approval.StatusRejected:
		if d != nil && d.Verdict == approval.VerdictCancel {
			return fmt.Sprintf("🚫 %s cancelled by %s in its cancel window; nothing ran%s", tool, by, text), "rejected"
		}
		return fmt.Sprintf("❌ %s rejected by %s%s", tool, by, text), "rejected"
	case approval.StatusResponded:
		return fmt.Sprintf("💬 %s was not run; %s answered instead%s", tool, by, text), "responded"
	case approval.StatusExpired:
		return fmt.Sprintf("⌛ %s expired with no decision; nothing ran", tool), "expired"
	case approval.StatusCancelled:
		return fmt.Sprintf("🚫 %s was cancelled%s", tool, text), "cancelled"
	case approval.StatusFailed:
		return fmt.Sprintf("⚠️ %s failed", tool), "failed"
	case approval.StatusAbandoned:
		return fmt.Sprintf("🕳 %s was approved by %s, but the caller had gone, so nothing ran", tool, by), "abandoned"
	case approval.StatusRefused:
		return fmt.Sprintf("⛔ %s was approved by %s, but refused when it was to run: %s. Nothing ran.", tool, by, litFit(strings.TrimSpace(r.Result), 1000)), "refused"
	case approval.StatusLost:
		return fmt.Sprintf("⚠️ The approval request for %s was lost (the store lost its data); nothing ran. Ask again if it is still needed.", tool), "lost"
	}
	return "", ""
}

// firstNote reports whether key is new for request id in this process.
func (b *Bot) firstNote(id, key string) bool {
	b.notedMu.Lock()
	defer b.notedMu.Unlock()
	if b.noted[id+"|"+key] != "" {
		return false
	}
	if len(b.noted) > 50000 { // bounded memory; at worst a line is repeated
		clear(b.noted)
	}
	b.noted[id+"|"+key] = key
	return true
}

// PostRunResult posts the agent's answer and what happened to each gated
// call in the task thread.
func (b *Bot) PostRunResult(ctx context.Context, res approval.RunResult) error {
	icon := ""
	switch res.Status {
	case approval.RunFailed:
		icon = "⚠️ "
	case approval.RunStopped:
		icon = "🛑 "
	case approval.RunMaxSteps:
		icon = "⏱️ "
	}
	answer := strings.TrimSpace(res.Answer)
	if answer == "" {
		answer = "(no answer)"
	}
	total := runes(answer)
	answer = keepMentions(litFit(answer, maxAnswerBlocks*maxSectionText-200))
	parts := slices.Collect(chunks(icon+answer, maxSectionText))
	if len(parts) > maxAnswerBlocks {
		// Splitting at line breaks made more sections than a reply holds:
		// end the last one shown with the visible truncation note.
		parts = parts[:maxAnswerBlocks]
		note := "\n" + truncNote(total)
		last := wholeMarkup(firstRunes(parts[len(parts)-1], maxSectionText-runes(note)))
		parts[len(parts)-1] = last + note
	}
	blocks := make([]slack.Block, 0, len(parts)+1)
	for _, p := range parts {
		blocks = append(blocks, mrkdwnSection(p))
	}
	if counts := runCounts(res); counts != "" {
		blocks = append(blocks, contextBlock(counts))
	}
	return b.postThread(ctx, res.Origin, plainFit(icon+answer, maxFallbackText), blocks...)
}

// chunks splits s into pieces of at most n runes, preferring line breaks.
func chunks(s string, n int) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		for s != "" {
			if runes(s) <= n {
				yield(s)
				return
			}
			head := firstRunes(s, n)
			if i := strings.LastIndex(head, "\n"); i > len(head)/2 {
				head = head[:i+1]
			} else if whole := wholeMarkup(head); whole != "" {
				head = whole // do not split an escape entity or a control
			}
			if !yield(head) {
				return
			}
			s = s[len(head):]
		}
	}
}

func runCounts(res approval.RunResult) string {
	var parts []string
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(res.AutoRun, "ran without review")
	if res.Preauthorized > 0 {
		by := make([]string, 0, len(res.PreauthorizedBy))
		for _, u := range res.PreauthorizedBy {
			by = append(by, mention(u))
		}
		what := "ran under a pre-authorisation"
		if len(by) > 0 {
			what += " by " + strings.Join(by, ", ")
		}
		add(res.Preauthorized, what)
	}
	add(res.Approved, "approved")
	add(res.AfterWindow, "ran when its cancel window ended")
	add(res.Edited, "approved with edits")
	add(res.Rejected, "rejected")
	add(res.Responded, "answered by a person instead of running")
	add(res.Expired, "expired")
	add(res.Denied, "refused by policy")
	add(res.Refused, "refused as invalid")
	// No reasons: each rejection's line in the thread gave its own, once.
	return strings.Join(parts, " · ")
}

// Say posts text (shown literally: no mentions or links) in the thread of
// o.
func (b *Bot) Say(ctx context.Context, o approval.Origin, text string) error {
	return b.postThread(ctx, o, litFit(text, maxThreadText))
}

// postThread posts text (already safe mrkdwn) and optional blocks as a
// reply in o's thread, waiting out rate limits.
func (b *Bot) postThread(ctx context.Context, o approval.Origin, text string, blocks ...slack.Block) error {
	_, err := b.postThreadTS(ctx, o, text, blocks...)
	return err
}

// postThreadTS is postThread, returning the reply's ts.
func (b *Bot) postThreadTS(ctx context.Context, o approval.Origin, text string, blocks ...slack.Block) (string, error) {
	if o.Channel == "" {
		return "", errors.New("post in task thread: no channel")
	}
	opts := []slack.MsgOption{slack.MsgOptionText(text, false), slack.MsgOptionDisableLinkUnfurl(), slack.MsgOptionDisableMediaUnfurl()}
	if o.ThreadTS != "" {
		opts = append(opts, slack.MsgOptionTS(o.ThreadTS))
	}
	if len(blocks) > 0 {
		opts = append(opts, slack.MsgOptionBlocks(blocks...))
	}
	var ts string
	err := b.retry(ctx, limitKey("chat.postMessage", o.Channel), func(ctx context.Context) error {
		var err error
		_, ts, err = b.messages.PostMessageContext(ctx, o.Channel, opts...)
		return err
	})
	if err != nil {
		level, hint := failureLog(err, o.Channel)
		b.log.Log(ctx, level, "cannot post in task thread", "channel", o.Channel, "thread_ts", o.ThreadTS, "slack_error", slackCode(err), "hint", hint, "err", err)
		return "", fmt.Errorf("post in thread %s/%s: %w", o.Channel, o.ThreadTS, err)
	}
	return ts, nil
}

// permalink returns a link to a top-level message, or "" when Slack
// cannot say: the workspace's address (auth.test) followed by
// archives/<channel>/p<ts without its dot>, the form chat.getPermalink
// answers, so that a list of cards costs no call; chat.getPermalink
// itself when the address is not known.
func (b *Bot) permalink(ctx context.Context, channel, ts string) string {
	if base := b.identity().URL; safeURL(base) && strings.HasSuffix(base, "/") && slackID(channel) && slackTS.MatchString(ts) {
		return base + "archives/" + channel + "/p" + strings.Replace(ts, ".", "", 1)
	}
	var pl string
	err := b.retry(ctx, "chat.getPermalink", func(ctx context.Context) error {
		var err error
		pl, err = b.messages.GetPermalinkContext(ctx, &slack.PermalinkParameters{Channel: channel, Ts: ts})
		return err
	})
	if err != nil {
		b.log.Warn("chat.getPermalink", "channel", channel, "ts", ts, "err", err)
		return ""
	}
	return pl
}

// ephemeral shows text to one user; failures are logged only.
func (b *Bot) ephemeral(ctx context.Context, channel, user, text string) {
	err := b.retry(ctx, "chat.postEphemeral", func(ctx context.Context) error {
		_, err := b.messages.PostEphemeralContext(ctx, channel, user, slack.MsgOptionText(text, false))
		return err
	})
	if err != nil {
		b.log.Error("post ephemeral", "channel", channel, "user", user, "err", err)
	}
}
