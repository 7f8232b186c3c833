// Package weekly posts the approval load of each past week to the ops
// channel, once across all processes: requests per tool, the median time
// to decide, the share approved unedited, and the rules that approvals
// which were always the same suggest, each with its replay. It reads the
// audit stream (auditreport, replay) and knows nothing of Slack or Redis:
// the bot posts (Poster) and the store claims each week (Claims).
package weekly

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/duration"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/replay"
)

// Claims is what the summary needs of the store.
type Claims interface {
	// ClaimWeek claims the summary of week (an ISO week, "2026-W49"):
	// true for exactly one caller across all processes, false for every
	// other. An error means the claim is not known to be taken: the next
	// tick tries again.
	ClaimWeek(ctx context.Context, week string) (bool, error)
}

// Poster posts a summary to the ops channel (the bot). An error means it
// was not posted.
type Poster interface {
	PostSummary(ctx context.Context, text string) error
}

// DefaultEvery is how often a process looks whether last week's summary
// is due: hourly, so a summary follows the week's end by at most an hour
// wherever the processes restart.
const DefaultEvery = time.Hour

// defaultTop is how many suggestions a summary lists.
const defaultTop = 3

// Summary posts last week's approval load once a week (weeks run Monday
// to Monday, UTC). Every process runs one; Claims makes one of them post.
// A summary whose post fails after its claim is not posted again (at most
// once, as reminders are): the failure is logged.
type Summary struct {
	Entries auditreport.Ranger
	// Policy is the policy in force, which suggestions change and replay
	// against; without it (zero Tools) the summary lists none.
	Policy replay.Policy
	// Min is the fewest identical approvals a suggestion is drawn from
	// (default 20, as the load page's).
	Min    int
	Claims Claims
	Post   Poster
	Now    func() time.Time
	// Ticker makes the ticker Run waits on (default clock.NewTicker);
	// tests call Tick directly.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	Every  time.Duration
	Log    *slog.Logger
}

// Run ticks until ctx is done.
func (s *Summary) Run(ctx context.Context) {
	every := option.PositiveOr(s.Every, DefaultEvery)
	c, stop := option.FuncOr(s.Ticker, clock.NewTicker)(every)
	defer stop()
	for {
		if _, err := s.Tick(ctx); err != nil && ctx.Err() == nil {
			s.log().Error("weekly summary", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-c:
		}
	}
}

func (s *Summary) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// WeekOf returns the week t belongs to: its start (Monday 00:00 UTC) and
// its ISO name ("2026-W49").
func WeekOf(t time.Time) (start time.Time, name string) {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	start = day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
	y, w := start.ISOWeek()
	return start, fmt.Sprintf("%d-W%02d", y, w)
}

// Tick posts the summary of the week before this one unless a process
// did: it claims the week, reads it, and posts. posted says this call
// posted it. The error is the claim's, the stream's or the post's.
func (s *Summary) Tick(ctx context.Context) (posted bool, err error) {
	this, _ := WeekOf(s.Now())
	start, week := WeekOf(this.Add(-time.Hour))
	won, err := s.Claims.ClaimWeek(ctx, week)
	if err != nil || !won {
		return false, err
	}
	text, err := s.Text(ctx, start, this)
	if err != nil {
		return false, fmt.Errorf("summary of %s, claimed but not posted: %w", week, err)
	}
	if err := s.Post.PostSummary(ctx, text); err != nil {
		return false, fmt.Errorf("summary of %s, claimed but not posted: %w", week, err)
	}
	s.log().Info("weekly summary posted", "week", week)
	return true, nil
}

// Text reads the week from start to end and writes its summary: one pass
// for the load and the drafting of suggestions, one more to replay them.
func (s *Summary) Text(ctx context.Context, start, end time.Time) (string, error) {
	lb := auditreport.NewLoadBuilder(start, end)
	var sg *replay.Suggester
	if len(s.Policy.Policy.Tools) > 0 {
		var err error
		sg, err = replay.NewSuggester(replay.SuggestOptions{Current: s.Policy, Since: start, Until: end, Min: option.PositiveOr(s.Min, 20)})
		if err != nil {
			return "", err
		}
	}
	err := auditreport.ScanSince(ctx, s.Entries, start, func(e approval.Entry) error {
		// A request of the next week is not this week's; its decision
		// then finds no request and is skipped too.
		if e.Event == approval.EventRequested && !e.Time.Before(end) {
			return nil
		}
		lb.Add(e)
		if sg != nil {
			_ = sg.Add(e)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read the audit stream: %w", err)
	}
	var sugs *replay.Suggestions
	note := ""
	if sg != nil {
		sugs, err = sg.Suggestions(ctx, s.Entries)
		switch {
		case errors.Is(err, replay.ErrTrimmed):
			// The load is still worth posting; a rule drawn from part of
			// the week would be a guess.
			sugs, note = nil, "No suggested rules: the audit stream no longer holds the whole week (trimmed).\n"
		case errors.Is(err, replay.ErrEmpty):
			sugs = nil
		case err != nil:
			return "", err
		}
	}
	return Write(lb.Report(), sugs, defaultTop) + note, nil
}

// Write is a week's summary for people (Slack mrkdwn): a line per tool,
// then the top suggestions (by calls they would let through), each with
// its replay. sugs may be nil (no policy).
func Write(load auditreport.LoadReport, sugs *replay.Suggestions, top int) string {
	var b strings.Builder
	requests, decided := 0, 0
	for _, r := range load.Tools {
		requests += r.Requests
		decided += r.Decided
	}
	fmt.Fprintf(&b, "*Approval load, week of %s to %s (UTC)*: %s, %s by a person\n",
		load.Since.UTC().Format("Mon 2 Jan"), load.Until.UTC().Add(-time.Nanosecond).Format("Mon 2 Jan 2006"),
		plural(requests, "request"), plural(decided, "decided"))
	if requests == 0 {
		b.WriteString("No requests this week.\n")
	}
	for _, r := range load.Tools {
		if r.Requests == 0 {
			continue
		}
		fmt.Fprintf(&b, "• %s: %s", r.Tool, plural(r.Requests, "request"))
		if r.MedianSec != nil {
			fmt.Fprintf(&b, ", median %s to decide", duration.Format(time.Duration(*r.MedianSec*float64(time.Second))))
		}
		if r.Decided > 0 {
			fmt.Fprintf(&b, ", %d%% of %s approved unedited", int(r.UneditedShare()*100+0.5), plural(r.Decided, "decision"))
		}
		b.WriteString("\n")
	}
	if sugs == nil {
		return b.String()
	}
	if len(sugs.Suggestions) == 0 {
		b.WriteString("No suggested rule this week.\n")
		return b.String()
	}
	// The ones that would spare people the most calls first.
	sorted := slices.Clone(sugs.Suggestions)
	slices.SortStableFunc(sorted, func(a, b replay.Suggestion) int { return b.LetThrough - a.LetThrough })
	fmt.Fprintf(&b, "*Suggested rules* (%d; replayed over the week; nothing is applied: review the patch, `countersign policy suggest` prints it):\n", len(sorted))
	for _, g := range sorted[:min(top, len(sorted))] {
		fmt.Fprintf(&b, "• %s asked for by %s: %s unedited; replayed: %s would run without a person, %d of them declined by a person, %s still asked; %s people-minutes saved\n",
			g.Tool, g.Requester, plural(g.Approvals, "approval"), plural(g.LetThrough, "past call"), g.Regressions,
			plural(g.StillAsked, "declined call"), strconv.FormatFloat(g.MinutesSaved, 'f', 1, 64))
	}
	return b.String()
}

// plural is n and the noun, with an s unless n is 1 ("decided" stays).
func plural(n int, noun string) string {
	if n != 1 && !strings.HasSuffix(noun, "ed") {
		noun += "s"
	}
	return strconv.Itoa(n) + " " + noun
}
