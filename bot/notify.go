package bot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
)

// Message size budgets for thread posts.
const (
	maxAnswerBlocks = 10
	maxThreadText   = 12000
)

// PostCard posts r's approval card to the approvals channel and a note in
// the task thread saying what is waiting and where. A 429 is waited out,
// never dropped. When Slack refuses for good (channel_not_found,
// not_in_channel, invalid_auth…) it logs what the operator must fix, tells
// the task thread, and returns an error: the caller must fail closed.
func (b *Bot) PostCard(ctx context.Context, r *approval.Request) (approval.CardRef, error) {
	rr := *r
	if rr.Origin.Permalink == "" && rr.Origin.Channel != "" && rr.Origin.ThreadTS != "" {
		rr.Origin.Permalink = b.permalink(ctx, rr.Origin.Channel, rr.Origin.ThreadTS)
	}
	channel := b.policy.Slack.ApprovalsChannel
	log := b.log.With("request_id", r.ID, "run_id", r.RunID, "tool", r.Tool, "channel", channel)
	var ts string
	err := b.retry(ctx, "chat.postMessage", func(ctx context.Context) error {
		var err error
		_, ts, err = b.api.PostMessageContext(ctx, channel,
			slack.MsgOptionText(cardFallback(&rr), false),
			slack.MsgOptionBlocks(cardBlocks(&rr)...),
			slack.MsgOptionDisableLinkUnfurl(),
			slack.MsgOptionDisableMediaUnfurl())
		return err
	})
	if err != nil {
		code := slackCode(err)
		log.Error("cannot post approval card; the request fails closed", "slack_error", code, "hint", operatorHint(code, channel), "err", err)
		why := "Slack is not reachable"
		if code != "" {
			why = "Slack said `" + esc(code) + "`"
		}
		_ = b.postThread(ctx, r.Origin, fmt.Sprintf("⚠️ I couldn't post the approval request for `%s` to %s (%s). Nothing was run; an operator has to fix the Slack set-up.",
			esc(r.Tool), channelRef(channel), why))
		return approval.CardRef{}, fmt.Errorf("post approval card for %s to %s: %w", r.ID, channel, err)
	}
	ref := approval.CardRef{Channel: channel, TS: ts}
	if _, err := b.audit.Append(ctx, approval.Record{
		Event: approval.EventCardPosted, RequestID: r.ID, RunID: r.RunID, Actor: "bot", Tool: r.Tool,
		Data: map[string]string{"channel": channel, "ts": ts},
	}); err != nil {
		log.Error("audit card_posted", "err", err)
	}
	where := channelRef(channel)
	if pl := b.permalink(ctx, channel, ts); pl != "" {
		where += " (" + link(pl, "open the card") + ")"
	}
	if err := b.postThread(ctx, r.Origin, fmt.Sprintf("⏳ Waiting for approval of `%s` in %s", esc(r.Tool), where)); err != nil {
		log.Error("post waiting note in task thread", "err", err)
	}
	return ref, nil
}

// UpdateRequest redraws r's card from r (quorum progress, who decided and
// when, the edit diff, the execution result; buttons gone once final) and,
// the first time this process sees r in a final state, says in the task
// thread what happened, e.g. "`issue_refund` rejected by @alice: needs a
// manager". Call it after every change. It returns an error only when the
// card could not be updated.
func (b *Bot) UpdateRequest(ctx context.Context, r *approval.Request) error {
	err := b.updateCard(ctx, r)
	if line, key := threadLine(r); line != "" && b.firstNote(r.ID, key) {
		if perr := b.postThread(ctx, r.Origin, line); perr != nil {
			b.log.Error("post decision in task thread", "request_id", r.ID, "err", perr)
		}
	}
	return err
}

// updateCard redraws the card with chat.update.
func (b *Bot) updateCard(ctx context.Context, r *approval.Request) error {
	if r.Card.Channel == "" || r.Card.TS == "" {
		return fmt.Errorf("update card of %s: no card posted yet", r.ID)
	}
	err := b.retry(ctx, "chat.update", func(ctx context.Context) error {
		_, _, _, err := b.api.UpdateMessageContext(ctx, r.Card.Channel, r.Card.TS,
			slack.MsgOptionText(cardFallback(r), false),
			slack.MsgOptionBlocks(cardBlocks(r)...))
		return err
	})
	if err != nil {
		code := slackCode(err)
		b.log.Error("cannot update approval card", "request_id", r.ID, "tool", r.Tool, "slack_error", code, "hint", operatorHint(code, r.Card.Channel), "err", err)
		return fmt.Errorf("update card of %s: %w", r.ID, err)
	}
	return nil
}

// threadLine is what the task thread is told about r, with a key naming
// that state; empty while nothing final happened.
func threadLine(r *approval.Request) (line, key string) {
	tool := "`" + esc(cutRunes(r.Tool, 100)) + "`"
	d := r.Decision
	by := "someone"
	text := ""
	if d != nil {
		by = mention(d.Approver)
		if t := strings.TrimSpace(d.Text); t != "" {
			text = ": " + escFit(t, 1000)
		}
	}
	switch r.Status {
	case approval.StatusApproved, approval.StatusExecuting, approval.StatusExecuted:
		if d != nil && d.Verdict == approval.VerdictEdit {
			return fmt.Sprintf("✏️ %s approved with edits by %s", tool, by), "approved"
		}
		return fmt.Sprintf("✅ %s approved by %s", tool, by), "approved"
	case approval.StatusRejected:
		return fmt.Sprintf("❌ %s rejected by %s%s", tool, by, text), "rejected"
	case approval.StatusResponded:
		return fmt.Sprintf("💬 %s was not run; %s answered instead%s", tool, by, text), "responded"
	case approval.StatusExpired:
		return fmt.Sprintf("⌛ %s expired with no decision; nothing ran", tool), "expired"
	case approval.StatusCancelled:
		return fmt.Sprintf("🚫 %s was cancelled%s", tool, text), "cancelled"
	case approval.StatusFailed:
		return fmt.Sprintf("⚠️ %s failed", tool), "failed"
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
	answer = escFit(answer, maxAnswerBlocks*maxSectionText-200)
	parts := slices.Collect(chunks(icon+answer, maxSectionText))
	if len(parts) > maxAnswerBlocks {
		// Splitting at line breaks made more sections than a reply holds:
		// end the last one shown with the visible truncation note.
		parts = parts[:maxAnswerBlocks]
		note := "\n" + truncNote(total)
		last := cutRunes(parts[len(parts)-1], maxSectionText-runes(note))
		if i := strings.LastIndex(last, "&"); i >= 0 && i > len(last)-6 && !strings.Contains(last[i:], ";") {
			last = last[:i] // do not leave half an escape entity
		}
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
			head := cutRunes(s, n)
			if i := strings.LastIndex(head, "\n"); i > len(head)/2 {
				head = head[:i+1]
			} else if i := strings.LastIndex(head, "&"); i > len(head)-6 {
				head = head[:i] // do not split an escape entity
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
	add(res.Approved, "approved")
	add(res.Edited, "approved with edits")
	add(res.Rejected, "rejected")
	add(res.Responded, "answered by a person")
	add(res.Expired, "expired")
	add(res.Refused, "refused as invalid")
	s := strings.Join(parts, " · ")
	if len(res.RejectionReasons) > 0 {
		reasons := make([]string, 0, len(res.RejectionReasons))
		for _, r := range res.RejectionReasons {
			reasons = append(reasons, "“"+esc(cutRunes(r, 200))+"”")
		}
		s += " · why rejected: " + strings.Join(reasons, "; ")
	}
	return s
}

// Say posts text (shown literally: no mentions or links) in the thread of
// o.
func (b *Bot) Say(ctx context.Context, o approval.Origin, text string) error {
	return b.postThread(ctx, o, escFit(text, maxThreadText))
}

// postThread posts text (already safe mrkdwn) and optional blocks as a
// reply in o's thread, waiting out rate limits.
func (b *Bot) postThread(ctx context.Context, o approval.Origin, text string, blocks ...slack.Block) error {
	if o.Channel == "" {
		return errors.New("post in task thread: no channel")
	}
	opts := []slack.MsgOption{slack.MsgOptionText(text, false), slack.MsgOptionDisableLinkUnfurl(), slack.MsgOptionDisableMediaUnfurl()}
	if o.ThreadTS != "" {
		opts = append(opts, slack.MsgOptionTS(o.ThreadTS))
	}
	if len(blocks) > 0 {
		opts = append(opts, slack.MsgOptionBlocks(blocks...))
	}
	err := b.retry(ctx, "chat.postMessage", func(ctx context.Context) error {
		_, _, err := b.api.PostMessageContext(ctx, o.Channel, opts...)
		return err
	})
	if err != nil {
		code := slackCode(err)
		b.log.Error("cannot post in task thread", "channel", o.Channel, "thread_ts", o.ThreadTS, "slack_error", code, "hint", operatorHint(code, o.Channel), "err", err)
		return fmt.Errorf("post in thread %s/%s: %w", o.Channel, o.ThreadTS, err)
	}
	return nil
}

// permalink returns a link to a message, or "" when Slack cannot say.
func (b *Bot) permalink(ctx context.Context, channel, ts string) string {
	var pl string
	err := b.retry(ctx, "chat.getPermalink", func(ctx context.Context) error {
		var err error
		pl, err = b.api.GetPermalinkContext(ctx, &slack.PermalinkParameters{Channel: channel, Ts: ts})
		return err
	})
	if err != nil {
		b.log.Warn("chat.getPermalink", "channel", channel, "ts", ts, "err", err)
		return ""
	}
	return pl
}
