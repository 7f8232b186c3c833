package bot_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
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
	loop  *approval.Reminders // the domain's reminder loop, posting through bot
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
	loop, err := approval.NewReminders(approval.RemindersOptions{Lifecycle: life, Pending: st, Posts: b, Policy: gate, Logger: log})
	if err != nil {
		t.Fatalf("NewReminders: %v", err)
	}
	return &remProcess{store: st, bot: b, life: life, loop: loop}
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
