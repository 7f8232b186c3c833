package weekly_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/approval/weekly"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// posts is the ops channel: what each process posted.
type posts struct {
	mu    sync.Mutex // guards texts
	texts []string
}

func (p *posts) PostSummary(_ context.Context, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.texts = append(p.texts, text)
	return nil
}

func (p *posts) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.texts...)
}

// history is a real audit stream (Redis when REDIS_URL is set, miniredis
// otherwise) written by store.Audit on a test clock.
type history struct {
	rdb    redis.UniversalClient
	prefix string
	clock  *clocktest.Clock
	audit  *store.Audit
}

// monday is the start of ISO week 2026-W49: the summary posted during it
// is of W48.
var monday = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// ask records a request of tool by requester with args, decided by
// verdict after decide.
func (h *history) ask(tb testing.TB, at time.Time, id, tool, requester, args string, verdict approval.Verdict, decide time.Duration) {
	tb.Helper()
	ctx := context.Background()
	h.clock.Set(at)
	if _, err := h.audit.Append(ctx, approval.Record{Event: approval.EventRequested, RequestID: id, Actor: requester, Tool: tool,
		Data: approval.RequestedEvent{CallID: id, Args: []byte(args), Quorum: 1, Requester: requester}}); err != nil {
		tb.Fatalf("Append requested: %v", err)
	}
	h.clock.Set(at.Add(decide))
	if _, err := h.audit.Append(ctx, approval.Record{Event: approval.EventDecided, RequestID: id, Actor: "U0ANN", Tool: tool,
		Data: approval.DecidedEvent{Verdict: verdict, DecisionMS: decide.Milliseconds()}}); err != nil {
		tb.Fatalf("Append decided: %v", err)
	}
}

var policy = replay.Policy{Policy: approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
	"send_email":   {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}},
	"issue_refund": {Review: approval.ReviewAlways},
}}}

// mustHistory records week W48 (Mon 23 Nov to Sun 29 Nov 2026): 30
// emails by api:mailer, 24 approved unedited in 20 s, every fifth (to
// another recipient) rejected; 3 refunds by api:billing, one edited, each
// decided in 90 s. And one request of W49, which W48's summary leaves out.
func mustHistory(tb testing.TB) (*store.Store, *history) {
	tb.Helper()
	rdb, prefix := storetest.New(tb)
	clock := clocktest.New(clocktest.Opts{Start: monday.Add(-7 * 24 * time.Hour)})
	h := &history{rdb: rdb, prefix: prefix, clock: clock,
		audit: store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: clock.Now})}
	start := monday.Add(-7*24*time.Hour + 9*time.Hour)
	for i := range 30 {
		to, v := "ops@example.com", approval.VerdictApprove
		if i%5 == 4 {
			to, v = "boss@evil.example", approval.VerdictReject
		}
		h.ask(tb, start.Add(time.Duration(i)*time.Hour), fmt.Sprintf("req_mail%04d", i), "send_email", "api:mailer",
			fmt.Sprintf(`{"to":%q,"subject":"Nightly report"}`, to), v, 20*time.Second)
	}
	for i, v := range []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictApprove} {
		h.ask(tb, start.Add(time.Duration(i)*24*time.Hour+30*time.Minute), fmt.Sprintf("req_refund%04d", i), "issue_refund", "api:billing",
			fmt.Sprintf(`{"order_id":"ORD-%d","amount":%d}`, i, 20+i), v, 90*time.Second)
	}
	h.ask(tb, monday.Add(2*time.Hour), "req_next0001", "issue_refund", "api:billing", `{"order_id":"ORD-9","amount":5}`, approval.VerdictReject, time.Minute)
	return store.New(rdb, store.Options{Prefix: prefix, Now: clock.Now}), h
}

// TestSummaryText: the post names tools and requesters (never request
// ids), gives times and shares with their units, and lists the suggestion
// with its replay over the week.
func TestSummaryText(t *testing.T) {
	st, h := mustHistory(t)
	h.clock.Set(monday.Add(12 * time.Hour))
	ch := &posts{}
	s := &weekly.Summary{Entries: h.audit, Policy: policy, Claims: st, Post: ch, Now: h.clock.Now}
	posted, err := s.Tick(t.Context())
	if err != nil || !posted {
		t.Fatalf("Tick = %v, %v; want true, nil", posted, err)
	}
	got := ch.all()
	if len(got) != 1 {
		t.Fatalf("posted %d summaries, want 1", len(got))
	}
	text := got[0]
	t.Logf("summary:\n%s", text)
	for _, want := range []string{
		"*Approval load, week of Mon 23 Nov to Sun 29 Nov 2026 (UTC)*: 33 requests, 33 decided by a person",
		"• issue_refund: 3 requests, median 1m30s to decide, 67% of 3 decisions approved unedited",
		"• send_email: 30 requests, median 20s to decide, 80% of 30 decisions approved unedited",
		"• send_email asked for by api:mailer: 24 approvals unedited; replayed: 24 past calls would run without a person, 0 of them declined by a person, 6 declined calls still asked; 8.0 people-minutes saved",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	for _, never := range []string{"req_", "U0ANN", "ORD-9"} {
		if strings.Contains(text, never) {
			t.Errorf("summary shows %q (an id, or next week's request)", never)
		}
	}
}

// TestSummaryOncePerWeek: two processes tick through the same week; one
// of them posts its summary, once, and next week's once more.
func TestSummaryOncePerWeek(t *testing.T) {
	st, h := mustHistory(t)
	st2 := store.New(h.rdb, store.Options{Prefix: h.prefix, Now: h.clock.Now})
	ch := &posts{}
	procs := []*weekly.Summary{
		{Entries: h.audit, Policy: policy, Claims: st, Post: ch, Now: h.clock.Now},
		{Entries: h.audit, Policy: policy, Claims: st2, Post: ch, Now: h.clock.Now},
	}
	tick := func(at time.Time) int {
		t.Helper()
		h.clock.Set(at)
		var wg sync.WaitGroup
		wins := make([]bool, len(procs))
		for i, p := range procs {
			wg.Go(func() {
				var err error
				if wins[i], err = p.Tick(t.Context()); err != nil {
					t.Errorf("process %d: Tick: %v", i, err)
				}
			})
		}
		wg.Wait()
		n := 0
		for _, w := range wins {
			if w {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		name string
		at   time.Time
		want int
	}{
		{"Monday, W48's summary due", monday.Add(time.Minute), 1},
		{"an hour later", monday.Add(time.Hour + time.Minute), 0},
		{"Sunday night", monday.Add(7*24*time.Hour - time.Minute), 0},
		{"next Monday, W49's due", monday.Add(7*24*time.Hour + time.Minute), 1},
		{"next Tuesday", monday.Add(8 * 24 * time.Hour), 0},
	} {
		if got := tick(c.at); got != c.want {
			t.Errorf("%s: %d processes posted, want %d", c.name, got, c.want)
		}
	}
	texts := ch.all()
	if len(texts) != 2 || !strings.Contains(texts[0], "week of Mon 23 Nov") || !strings.Contains(texts[1], "week of Mon 30 Nov to Sun 6 Dec 2026 (UTC)*: 1 request, 1 decided") {
		t.Errorf("posted %q; want W48's summary, then W49's (its one request)", texts)
	}
}

// TestWeekOf: weeks start on Monday 00:00 UTC and are named as ISO weeks.
func TestWeekOf(t *testing.T) {
	for _, c := range []struct {
		at    time.Time
		start time.Time
		name  string
	}{
		{monday, monday, "2026-W49"},
		{monday.Add(7*24*time.Hour - time.Nanosecond), monday, "2026-W49"},
		{time.Date(2027, 1, 3, 23, 0, 0, 0, time.UTC), time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC), "2026-W53"},
		{time.Date(2027, 1, 4, 1, 0, 0, 0, time.FixedZone("CET", 3600)), time.Date(2027, 1, 4, 0, 0, 0, 0, time.UTC), "2027-W01"},
	} {
		start, name := weekly.WeekOf(c.at)
		if !start.Equal(c.start) || name != c.name {
			t.Errorf("WeekOf(%s) = %s, %s; want %s, %s", c.at, start, name, c.start, c.name)
		}
	}
}

// TestSummaryTrimmedStream: when the stream no longer holds the whole
// week, the load is posted and the suggestions are left out, saying why.
func TestSummaryTrimmedStream(t *testing.T) {
	st, h := mustHistory(t)
	if err := h.rdb.XTrimMaxLen(t.Context(), h.prefix+":{audit}", 40).Err(); err != nil {
		t.Fatalf("XTRIM: %v", err)
	}
	h.clock.Set(monday.Add(12 * time.Hour))
	ch := &posts{}
	s := &weekly.Summary{Entries: h.audit, Policy: policy, Claims: st, Post: ch, Now: h.clock.Now}
	if posted, err := s.Tick(t.Context()); err != nil || !posted {
		t.Fatalf("Tick = %v, %v; want true, nil", posted, err)
	}
	got := ch.all()
	if len(got) != 1 || !strings.Contains(got[0], "• send_email: ") ||
		!strings.Contains(got[0], "No suggested rules: the audit stream no longer holds the whole week (trimmed).") ||
		strings.Contains(got[0], "asked for by") {
		t.Errorf("posted %q; want the load and why no rule is suggested", got)
	}
}
