package bot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// remProcess is one Countersign process as far as reminders go: its own
// store, audit writer, bot and reminder loop, on the shared Redis and
// workspace.
type remProcess struct {
	store *store.Store
	bot   *bot.Bot
	life  *approval.Lifecycle // posts and binds cards through bot
	loop  *bot.Reminders
}

// Reminder test cast.
const (
	remRequester = "U0ALICE01"
	remApprover  = "U0BOB0001"
	remBoss      = "U0CAROL01" // in the approvals channel, approver only once escalated
	remTasks     = "C0TASKS01"
	remApprovals = "G0APPROV1"
)

func remPolicy(t *testing.T) (*policyfile.File, *approval.Gate) {
	t.Helper()
	tp := approval.ToolPolicy{
		Name: "issue_refund", Risk: approval.RiskMedium, Review: approval.ReviewAlways,
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject},
		Timeout:   time.Hour, Quorum: 1,
		Approvers:   approval.Approvers{Users: []string{remApprover}},
		RemindAfter: 10 * time.Minute, EscalateAfter: 25 * time.Minute,
		EscalateTo: approval.Approvers{Users: []string{remBoss}}, WidenOnEscalation: true,
	}
	f := &policyfile.File{
		Version: 1,
		Slack:   policyfile.Slack{ApprovalsChannel: remApprovals, TaskChannels: []string{remTasks}},
		Policy:  approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": tp}},
		Tools:   []policyfile.Tool{{Name: "issue_refund", Description: "Refund an order", Schema: json.RawMessage(`{"type":"object"}`)}},
	}
	g, err := approval.NewGate(f.Policy)
	if err != nil {
		t.Fatalf("NewGate: %v", err)
	}
	return f, g
}

// remWorkspace is the reminder tests' workspace (the cast in its channels)
// on an injected clock.
func remWorkspace(t *testing.T) (*clocktest.Clock, *slacksim.Workspace) {
	t.Helper()
	clock := clocktest.New(clocktest.Opts{Start: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)})
	ws := slacksimtest.New(t, slacksim.Options{Now: clock.Now})
	for _, u := range []string{remRequester, remApprover, remBoss} {
		ws.AddUser(slacksim.User{ID: u, Name: strings.ToLower(u[3:8])})
	}
	ws.AddChannel(slacksim.Channel{ID: remTasks, Name: "tasks", Members: []string{remRequester, slacksim.BotUserID}})
	ws.AddChannel(slacksim.Channel{ID: remApprovals, Name: "approvals", IsPrivate: true,
		Members: []string{remApprover, remBoss, slacksim.BotUserID}})
	return clock, ws
}

type remRunner struct{}

func (remRunner) Handle(context.Context, approval.Task) error { return nil }

func newRemProcess(t *testing.T, ctx context.Context, rdb redis.UniversalClient, prefix string, ws *slacksim.Workspace,
	clock *clocktest.Clock, pf *policyfile.File, gate *approval.Gate) *remProcess {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.New(rdb, store.Options{Prefix: prefix, Now: clock.Now})
	t.Cleanup(func() { _ = st.Close() })
	au := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: clock.Now})
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(st, au), Now: clock.Now, Logger: log})
	if err != nil {
		t.Fatalf("NewLifecycle: %v", err)
	}
	b, err := bot.New(bot.Options{
		Slack: slacksimtest.Client(ws, "", ""), Requests: st, Lifecycle: life, Runner: remRunner{}, Policy: pf,
		Now: clock.Now, Logger: log, Workers: 2,
	})
	if err != nil {
		t.Fatalf("bot.New: %v", err)
	}
	life.SetCards(b)
	life.SetDirectory(b)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("bot Start: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &remProcess{store: st, bot: b, life: life, loop: &bot.Reminders{Store: st, Lifecycle: life, Cards: b, Policy: gate, Now: clock.Now, Log: log}}
}

// TestRemindersTwoProcessesEscalation: two processes tick at the same instants of an
// injected clock, concurrently. Each due reminder reaches the card's thread
// exactly once, the escalation once, nothing after the decision; after the
// escalation (with widening) the escalation target's approval counts.
func TestRemindersTwoProcessesEscalation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	clock, ws := remWorkspace(t)
	pf, gate := remPolicy(t)
	rdb, prefix := storetest.New(t)
	a := newRemProcess(t, ctx, rdb, prefix, ws, clock, pf, gate)
	b := newRemProcess(t, ctx, rdb, prefix, ws, clock, pf, gate)

	// Clicks arrive over process a's socket.
	smDone := make(chan struct{})
	go func() { // exits when ctx is cancelled
		defer close(smDone)
		_ = a.bot.RunSocketMode(ctx, socketmode.New(slacksimtest.Client(ws, "", "")))
	}()
	t.Cleanup(func() { cancel(); <-smDone })
	remWaitFor(t, ws, "socket connection", func() bool { return ws.Connections() > 0 })

	// The request and its card, as the agent makes them.
	root, err := ws.PostMessage(remRequester, remTasks, "refund order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	tp, _ := gate.Policy("issue_refund")
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: remRequester,
		Origin: approval.Origin{Channel: remTasks, ThreadTS: root}, Tool: "issue_refund", Risk: approval.RiskMedium,
		Args: json.RawMessage(`{"order_id":"1234","amount":64}`), Decisions: tp.Decisions, Quorum: 1,
		Approvers: tp.Approvers, Created: clock.Now(), Deadline: clock.Now().Add(tp.Timeout),
	}
	if err := a.store.CreateRequest(ctx, r); err != nil {
		t.Fatalf("CreateRequest: %v", err)
	}
	if cur := a.life.EnsureCard(ctx, r); !cur.Card.Bound() {
		t.Fatalf("EnsureCard: card not bound (%s)", cur.Status)
	}
	stored, err := a.store.Request(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	card := stored.Card

	count := func(what string) int {
		n := 0
		for _, m := range ws.Replies(remApprovals, card.TS) {
			if strings.Contains(m.Text, what) {
				n++
			}
		}
		return n
	}
	// tickBoth runs both processes' ticks at once, twice (a repeated tick
	// at the same instant sends nothing new).
	tickBoth := func() {
		for range 2 {
			var wg sync.WaitGroup
			for _, p := range []*remProcess{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.loop.Tick(ctx)
				}()
			}
			wg.Wait()
		}
	}

	steps := []struct {
		advance             time.Duration
		reminders, escalate int
	}{
		{0, 0, 0},
		{9 * time.Minute, 0, 0},
		{time.Minute, 1, 0},      // 10m: reminder 1
		{5 * time.Minute, 1, 0},  // 15m
		{5 * time.Minute, 2, 0},  // 20m: reminder 2
		{5 * time.Minute, 2, 1},  // 25m: escalation
		{5 * time.Minute, 3, 1},  // 30m: reminder 3
		{25 * time.Minute, 4, 1}, // 55m: after a gap only the latest (5) is sent, not 4 and 5
	}
	at := time.Duration(0)
	for _, s := range steps {
		clock.Advance(s.advance)
		at += s.advance
		tickBoth()
		if got := count("Still waiting"); got != s.reminders {
			t.Errorf("at +%v: %d reminders in the card thread, want %d", at, got, s.reminders)
		}
		if got := count("Escalated"); got != s.escalate {
			t.Errorf("at +%v: %d escalations in the card thread, want %d", at, got, s.escalate)
		}
	}
	replies := ws.Replies(remApprovals, card.TS)
	if last := replies[len(replies)-1].Text; !strings.Contains(last, "reminder 5") {
		t.Errorf("last reminder = %q, want reminder 5", last)
	}
	// The escalating process asked its card writer for a redraw, which
	// runs in the background: wait until both writers are done.
	for _, p := range []*remProcess{a, b} {
		select {
		case <-p.bot.CardsIdle():
		case <-time.After(hangAfter):
			t.Fatalf("card writer still busy after %v", hangAfter)
		}
	}
	if m, _ := ws.Message(remApprovals, card.TS); !strings.Contains(string(m.Blocks), "Escalated to") {
		t.Errorf("card does not show the escalation: %s", m.Blocks)
	}

	// The audit stream has one entry per reminder and one escalation.
	au := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}"})
	entries, err := au.Range(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	events := map[approval.Event]int{}
	for _, e := range entries {
		events[e.Event]++
	}
	if events[approval.EventReminded] != 4 || events[approval.EventEscalated] != 1 {
		t.Errorf("audit: %d reminded, %d escalated; want 4 and 1 (%v)", events[approval.EventReminded], events[approval.EventEscalated], events)
	}
	if _, err := au.Verify(ctx); err != nil {
		t.Errorf("audit Verify: %v", err)
	}

	// The escalation target may now approve.
	if err := ws.Click(remBoss, remApprovals, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	var got *approval.Request
	remWaitFor(t, ws, "the boss's approval", func() bool {
		got, err = b.store.Request(ctx, r.ID)
		return err == nil && got.Status == approval.StatusApproved
	})
	if got.Decision == nil || got.Decision.Approver != remBoss {
		t.Errorf("decision = %+v, want %s's", got.Decision, remBoss)
	}
	before := len(ws.Replies(remApprovals, card.TS))
	clock.Advance(time.Minute)
	tickBoth()
	if after := len(ws.Replies(remApprovals, card.TS)); after != before {
		t.Errorf("card thread grew from %d to %d after the decision", before, after)
	}
}

// waitFor waits (on workspace changes, not sleeps) until cond holds.
func remWaitFor(t *testing.T, ws *slacksim.Workspace, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ws.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func TestReminderDue(t *testing.T) {
	c := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		every time.Duration
		now   time.Time
		want  int
	}{
		{"off", 0, c.Add(time.Hour), 0},
		{"before first", 10 * time.Minute, c.Add(9 * time.Minute), 0},
		{"first", 10 * time.Minute, c.Add(10 * time.Minute), 1},
		{"between", 10 * time.Minute, c.Add(25 * time.Minute), 2},
		{"clock behind", 10 * time.Minute, c.Add(-time.Minute), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := bot.ReminderDue(c, tc.every, tc.now); got != tc.want {
				t.Errorf("bot.ReminderDue(+%v, %v) = %d, want %d", tc.now.Sub(c), tc.every, got, tc.want)
			}
		})
	}
}

// remReads counts what a reminder loop reads.
type remReads struct {
	bot.ReminderStore
	mu           sync.Mutex
	lists, reads int
}

func (c *remReads) PendingFrom(ctx context.Context, from time.Time, offset, count int) ([]approval.PendingRef, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.ReminderStore.PendingFrom(ctx, from, offset, count)
}

func (c *remReads) PendingRank(ctx context.Context, start, count int) ([]approval.PendingRef, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.ReminderStore.PendingRank(ctx, start, count)
}

func (c *remReads) PendingRecords(ctx context.Context, ids []string) ([]*approval.Request, error) {
	c.mu.Lock()
	c.reads += len(ids)
	c.mu.Unlock()
	return c.ReminderStore.PendingRecords(ctx, ids)
}

// take returns the records read since the last take.
func (c *remReads) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.reads
	c.reads = 0
	return n
}

// TestRemindersReadWhatIsDue: a tick reads the records of the requests with
// a reminder or escalation due, not every pending record (the loop read
// all of them every 15 s: with 10,000 pending that stalled Redis and the
// clicks of others). Reminders and escalations still go out on time, a
// decided request is no longer read, a new one is first read when its
// first reminder is due, one indexed late is found by the sweep, and with
// no tool that reminds or escalates a tick asks the store nothing.
func TestRemindersReadWhatIsDue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	clock, ws := remWorkspace(t)
	pf, gate := remPolicy(t) // reminders every 10 minutes, escalation at 25
	rdb, prefix := storetest.New(t)
	p := newRemProcess(t, ctx, rdb, prefix, ws, clock, pf, gate)
	cs := &remReads{ReminderStore: p.store}
	p.loop.Store = cs

	tp, _ := gate.Policy("issue_refund")
	create := func(i int, skew time.Duration) *approval.Request {
		t.Helper()
		created := clock.Now().Add(skew)
		r := &approval.Request{
			ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: remRequester,
			Tool: "issue_refund", Risk: approval.RiskMedium,
			Args: json.RawMessage(fmt.Sprintf(`{"order_id":"1234","amount":%d}`, 60+i)), Decisions: tp.Decisions, Quorum: 1,
			Approvers: tp.Approvers, Created: created, Deadline: created.Add(tp.Timeout),
		}
		if err := p.store.CreateRequest(ctx, r); err != nil {
			t.Fatalf("CreateRequest: %v", err)
		}
		if cur := p.life.EnsureCard(ctx, r); !cur.Card.Bound() {
			t.Fatalf("EnsureCard: card not bound (%s)", cur.Status)
		}
		return r
	}
	const n = 30
	var reqs []*approval.Request
	for i := range n {
		reqs = append(reqs, create(i, 0))
	}
	audit := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}"})
	events := func() map[approval.Event]int {
		t.Helper()
		entries, err := audit.Range(ctx, "", 10000)
		if err != nil {
			t.Fatal(err)
		}
		m := map[approval.Event]int{}
		for _, e := range entries {
			m[e.Event]++
		}
		return m
	}

	steps := []struct {
		name                string
		advance             time.Duration
		read                int // records read by the tick
		reminders, escalate int // audited so far
		before              func()
	}{
		{name: "created: nothing can be due for 10 minutes"},
		{name: "+1m: nothing due", advance: time.Minute},
		{name: "+9m: nothing due", advance: 8 * time.Minute},
		{name: "+10m: first look, reminder 1 of each", advance: time.Minute, read: n, reminders: n},
		{name: "+11m: nothing due", advance: time.Minute, reminders: n},
		{name: "+20m: reminder 2 of the 20 still pending", advance: 9 * time.Minute, read: n, reminders: n + 20,
			before: func() {
				for _, r := range reqs[:10] {
					if _, err := p.life.Cancel(ctx, r.ID, remRequester, "no longer needed"); err != nil {
						t.Fatalf("Cancel: %v", err)
					}
				}
			}},
		{name: "+25m: escalation of the 20", advance: 5 * time.Minute, read: 20, reminders: n + 20, escalate: 20},
		{name: "+26m: a new request, not read before its first reminder", advance: time.Minute, reminders: n + 20, escalate: 20,
			before: func() { reqs = append(reqs, create(n, 0)) }},
		{name: "+27m: nothing due", advance: time.Minute, reminders: n + 20, escalate: 20},
		{name: "+30m: reminder 3 of the 20", advance: 3 * time.Minute, read: 20, reminders: n + 40, escalate: 20},
		{name: "+36m: reminder 1 of the new one", advance: 6 * time.Minute, read: 1, reminders: n + 41, escalate: 20},
		{name: "+37m: one indexed 20 minutes late (its creator's clock behind), found by the sweep and reminded at once",
			advance: time.Minute, read: 1, reminders: n + 42, escalate: 20,
			before: func() { reqs = append(reqs, create(n+1, -20*time.Minute)) }},
	}
	for _, s := range steps {
		clock.Advance(s.advance)
		if s.before != nil {
			s.before()
		}
		p.loop.Tick(ctx)
		if got := cs.take(); got != s.read {
			t.Errorf("%s: the tick read %d records, want %d", s.name, got, s.read)
		}
		ev := events()
		if ev[approval.EventReminded] != s.reminders || ev[approval.EventEscalated] != s.escalate {
			t.Errorf("%s: %d reminders and %d escalations audited, want %d and %d",
				s.name, ev[approval.EventReminded], ev[approval.EventEscalated], s.reminders, s.escalate)
		}
	}

	// A policy where no tool reminds or escalates: a tick asks nothing.
	tpq := tp
	tpq.RemindAfter, tpq.EscalateAfter = 0, 0
	g2, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": tpq}})
	if err != nil {
		t.Fatal(err)
	}
	cq := &remReads{ReminderStore: p.store}
	loop := &bot.Reminders{Store: cq, Lifecycle: p.life, Cards: p.bot, Policy: g2, Now: clock.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for range 3 {
		clock.Advance(10 * time.Minute)
		loop.Tick(ctx)
	}
	if cq.lists != 0 || cq.reads != 0 {
		t.Errorf("with no tool that reminds or escalates, three ticks listed %d times and read %d records; want none", cq.lists, cq.reads)
	}
}

// memIndex is a pending index in memory, sorted by creation then id as
// Redis sorts a sorted set, with every record gone.
type memIndex struct {
	refs  []approval.PendingRef
	mu    sync.Mutex
	asked map[string]int // records asked for, by id
	lists int
}

func (m *memIndex) PendingFrom(_ context.Context, from time.Time, offset, count int) ([]approval.PendingRef, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	var out []approval.PendingRef
	for _, r := range m.refs {
		if !from.IsZero() && r.Created.Before(from) {
			continue
		}
		if offset > 0 {
			offset--
			continue
		}
		if len(out) == count {
			break
		}
		out = append(out, r)
	}
	return out, nil
}

func (m *memIndex) PendingRank(_ context.Context, start, count int) ([]approval.PendingRef, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lists++
	if start >= len(m.refs) {
		return nil, nil
	}
	return slices.Clone(m.refs[start:min(start+count, len(m.refs))]), nil
}

func (m *memIndex) PendingRecords(_ context.Context, ids []string) ([]*approval.Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		m.asked[id]++
	}
	return make([]*approval.Request, len(ids)), nil
}

// TestRemindersPageABurst: 1,300 requests created within two milliseconds
// (800 in one) are read from the index in pages, each learned once
// (ties across pages neither lost nor repeated), and each record is first
// read once, when a reminder can be due.
func TestRemindersPageABurst(t *testing.T) {
	t0 := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	clock := clocktest.New(clocktest.Opts{Start: t0})
	_, gate := remPolicy(t) // reminders every 10 minutes
	idx := &memIndex{asked: map[string]int{}}
	for i := range 1300 {
		created := t0
		if i >= 800 {
			created = t0.Add(time.Millisecond)
		}
		idx.refs = append(idx.refs, approval.PendingRef{ID: fmt.Sprintf("req_%05d", i), Created: created})
	}
	loop := &bot.Reminders{Store: idx, Policy: gate, Now: clock.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	loop.Tick(context.Background())
	if len(idx.asked) != 0 {
		t.Fatalf("the first tick read %d records; nothing can be due for 10 minutes", len(idx.asked))
	}
	// The burst's pages (the last one short) and the sweep's pages: reads
	// by the page, never by the entry or twice.
	if want := (len(idx.refs)+bot.IndexPage)/bot.IndexPage + bot.SweepPages; idx.lists > want {
		t.Errorf("the first tick read the index %d times, want at most %d (%d pages of new requests of %d entries and %d of the sweep)",
			idx.lists, want, want-bot.SweepPages, bot.IndexPage, bot.SweepPages)
	}
	clock.Advance(10*time.Minute + time.Second)
	loop.Tick(context.Background())
	if len(idx.asked) != len(idx.refs) {
		t.Errorf("the tick at +10m1s read %d distinct records, want %d", len(idx.asked), len(idx.refs))
	}
	for id, n := range idx.asked {
		if n != 1 {
			t.Errorf("%s read %d times, want once", id, n)
		}
	}
	clear(idx.asked)
	for range 5 {
		clock.Advance(15 * time.Second)
		loop.Tick(context.Background())
	}
	if len(idx.asked) != 0 {
		t.Errorf("later ticks read %d records of requests found gone", len(idx.asked))
	}
}
