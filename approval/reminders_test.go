package approval_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// Reminder test cast.
const (
	remRequester = "U0ALICE01"
	remApprover  = "U0BOB0001"
	remBoss      = "U0CAROL01" // approver only once escalated
)

// remGate reminds every 10 minutes and escalates to the boss at 25, with
// widening, within an hour's deadline.
func remGate(t *testing.T) *approval.Gate {
	t.Helper()
	g, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": {
		Name: "issue_refund", Risk: approval.RiskMedium, Review: approval.ReviewAlways,
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject},
		Timeout:   time.Hour, Quorum: 1,
		Approvers:   approval.Approvers{Users: []string{remApprover}},
		RemindAfter: 10 * time.Minute, EscalateAfter: 25 * time.Minute,
		EscalateTo: approval.Approvers{Users: []string{remBoss}}, WidenOnEscalation: true,
	}}})
	if err != nil {
		t.Fatalf("NewGate: %v", err)
	}
	return g
}

// remIndex is the pending index over approvaltest.Records, as the store
// keeps it: the requests created through it, by creation then id (Redis'
// order of a sorted set), those no longer pending left out. It counts
// what the loop reads.
type remIndex struct {
	recs *approvaltest.Records

	mu           sync.Mutex // guards the fields below
	refs         []approval.PendingRef
	lists, reads int
}

func (x *remIndex) add(ref approval.PendingRef) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.refs = append(x.refs, ref)
	slices.SortFunc(x.refs, func(a, b approval.PendingRef) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
}

// pending returns the pending record of id, nil when gone or final.
func (x *remIndex) pending(ctx context.Context, id string) (*approval.Request, error) {
	r, err := x.recs.Request(ctx, id)
	if errors.Is(err, approval.ErrNotFound) {
		return nil, nil
	}
	if err != nil || r.Status != approval.StatusPending {
		return nil, err
	}
	return r, nil
}

// index is the pending entries, oldest first.
func (x *remIndex) index(ctx context.Context) ([]approval.PendingRef, error) {
	x.mu.Lock()
	refs := slices.Clone(x.refs)
	x.lists++
	x.mu.Unlock()
	var out []approval.PendingRef
	for _, ref := range refs {
		r, err := x.pending(ctx, ref.ID)
		if err != nil {
			return nil, err
		}
		if r != nil {
			out = append(out, ref)
		}
	}
	return out, nil
}

func (x *remIndex) PendingFrom(ctx context.Context, from time.Time, offset, count int) ([]approval.PendingRef, error) {
	refs, err := x.index(ctx)
	if err != nil {
		return nil, err
	}
	return refsFrom(refs, from, offset, count), nil
}

// refsFrom is the page of refs (sorted as the index is) created at or after
// from (zero: all), from the offset-th and at most count, as the store's
// PendingFrom reads it.
func refsFrom(refs []approval.PendingRef, from time.Time, offset, count int) []approval.PendingRef {
	var out []approval.PendingRef
	for _, ref := range refs {
		if !from.IsZero() && ref.Created.Before(from) {
			continue
		}
		if offset > 0 {
			offset--
			continue
		}
		if len(out) == count {
			break
		}
		out = append(out, ref)
	}
	return out
}

func (x *remIndex) PendingRank(ctx context.Context, start, count int) ([]approval.PendingRef, error) {
	refs, err := x.index(ctx)
	if err != nil || start >= len(refs) {
		return nil, err
	}
	return refs[start:min(start+count, len(refs))], nil
}

func (x *remIndex) PendingRecords(ctx context.Context, ids []string) ([]*approval.Request, error) {
	x.mu.Lock()
	x.reads += len(ids)
	x.mu.Unlock()
	out := make([]*approval.Request, len(ids))
	for i, id := range ids {
		r, err := x.pending(ctx, id)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// take returns the records read since the last take.
func (x *remIndex) take() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := x.reads
	x.reads = 0
	return n
}

// remPosts is the card writer's side of reminders: what it was asked to
// post, as approval.Reminder.
type remPosts struct {
	// fail, when set, is asked before each reminder is posted: an error
	// is Slack refusing the post (nothing posted).
	fail func(r *approval.Request, n int) error

	mu        sync.Mutex // guards the maps
	reminders map[string][]int
	escalated map[string][]approval.Escalation
}

func newRemPosts() *remPosts {
	return &remPosts{reminders: map[string][]int{}, escalated: map[string][]approval.Escalation{}}
}

func (p *remPosts) Remind(_ context.Context, r *approval.Request, n int) error {
	if p.fail != nil {
		if err := p.fail(r, n); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reminders[r.ID] = append(p.reminders[r.ID], n)
	return nil
}

func (p *remPosts) Escalate(_ context.Context, r *approval.Request) error {
	if r.Escalated == nil {
		return fmt.Errorf("escalate %s: the request is not escalated", r.ID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.escalated[r.ID] = append(p.escalated[r.ID], *r.Escalated)
	return nil
}

// counts returns the reminders and escalations posted in all.
func (p *remPosts) counts() (reminders, escalations int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range p.reminders {
		reminders += len(ns)
	}
	for _, es := range p.escalated {
		escalations += len(es)
	}
	return reminders, escalations
}

var _ approval.Reminder = (*remPosts)(nil)

// remWorld is a lifecycle with its reminder loop on a test clock.
type remWorld struct {
	clock *clocktest.Clock
	recs  *approvaltest.Records
	audit *approvaltest.Auditor
	cards *approvaltest.Cards
	life  *approval.Lifecycle
	index *remIndex
	posts *remPosts
	loop  *approval.Reminders
	gate  *approval.Gate
}

func newRemWorld(t *testing.T) *remWorld {
	t.Helper()
	return newRemWorldOver(t, nil)
}

// newRemWorldOver is newRemWorld whose lifecycle records through wrap(the
// in-memory records) when wrap is set.
func newRemWorldOver(t *testing.T, wrap func(*approvaltest.Ledger) approval.Records) *remWorld {
	t.Helper()
	w := &remWorld{clock: clocktest.New(clocktest.Opts{Start: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}), gate: remGate(t)}
	w.recs = approvaltest.NewRecords(w.clock.Now)
	w.audit = approvaltest.NewAuditor(w.clock.Now)
	w.cards = approvaltest.NewCards()
	var recs approval.Records = approvaltest.NewLedger(w.recs, w.audit)
	if wrap != nil {
		recs = wrap(approvaltest.NewLedger(w.recs, w.audit))
	}
	var err error
	w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Records: recs, Cards: w.cards, Gate: w.gate, Now: w.clock.Now})
	if err != nil {
		t.Fatalf("NewLifecycle: %v", err)
	}
	w.index = &remIndex{recs: w.recs}
	w.posts = newRemPosts()
	w.loop, err = approval.NewReminders(approval.RemindersOptions{Lifecycle: w.life, Pending: w.index, Posts: w.posts})
	if err != nil {
		t.Fatalf("NewReminders: %v", err)
	}
	return w
}

// create saves a pending request created skew from now, and its card, as
// the agent makes them.
func (w *remWorld) create(t *testing.T, ctx context.Context, i int, skew time.Duration) *approval.Request {
	t.Helper()
	tp, _ := w.gate.Policy("issue_refund")
	created := w.clock.Now().Add(skew)
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: remRequester,
		Tool: "issue_refund", Risk: approval.RiskMedium,
		Args: json.RawMessage(fmt.Sprintf(`{"order_id":"1234","amount":%d}`, 60+i)), Decisions: tp.Decisions, Quorum: 1,
		Approvers: tp.Approvers, Created: created, Deadline: created.Add(tp.Timeout),
	}
	if err := w.recs.CreateRequest(ctx, r); err != nil {
		t.Fatalf("CreateRequest: %v", err)
	}
	w.index.add(approval.PendingRef{ID: r.ID, Created: r.Created})
	if cur := w.life.EnsureCard(ctx, r); !cur.Card.Bound() {
		t.Fatalf("EnsureCard: card not bound (%s)", cur.Status)
	}
	return r
}

// events counts the audit stream's entries by event.
func (w *remWorld) events() map[approval.Event]int {
	m := map[approval.Event]int{}
	for _, e := range w.audit.Entries() {
		m[e.Event]++
	}
	return m
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
			if got := approval.ReminderDue(c, tc.every, tc.now); got != tc.want {
				t.Errorf("approval.ReminderDue(+%v, %v) = %d, want %d", tc.now.Sub(c), tc.every, got, tc.want)
			}
		})
	}
}

// TestRemindersReadWhatIsDue: a tick reads the records of the requests with
// a reminder or escalation due, not every pending record (the loop read
// all of them every 15 s: with 10,000 pending that stalled Redis and the
// clicks of others). Reminders and escalations still go out on time, each
// audited and posted once, a decided request is no longer read, a new one
// is first read when its first reminder is due, one indexed late is found
// by the sweep, and with no tool that reminds or escalates a tick asks the
// store nothing.
func TestRemindersReadWhatIsDue(t *testing.T) {
	ctx := context.Background()
	w := newRemWorld(t)
	const n = 30
	var reqs []*approval.Request
	for i := range n {
		reqs = append(reqs, w.create(t, ctx, i, 0))
	}

	steps := []struct {
		name                string
		advance             time.Duration
		read                int // records read by the tick
		reminders, escalate int // audited (and posted) so far
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
					if _, err := w.life.Cancel(ctx, r.ID, remRequester, "no longer needed"); err != nil {
						t.Fatalf("Cancel: %v", err)
					}
				}
			}},
		{name: "+25m: escalation of the 20", advance: 5 * time.Minute, read: 20, reminders: n + 20, escalate: 20},
		{name: "+26m: a new request, not read before its first reminder", advance: time.Minute, reminders: n + 20, escalate: 20,
			before: func() { reqs = append(reqs, w.create(t, ctx, n, 0)) }},
		{name: "+27m: nothing due", advance: time.Minute, reminders: n + 20, escalate: 20},
		{name: "+30m: reminder 3 of the 20", advance: 3 * time.Minute, read: 20, reminders: n + 40, escalate: 20},
		{name: "+36m: reminder 1 of the new one", advance: 6 * time.Minute, read: 1, reminders: n + 41, escalate: 20},
		{name: "+37m: one indexed 20 minutes late (its creator's clock behind), found by the sweep and reminded at once",
			advance: time.Minute, read: 1, reminders: n + 42, escalate: 20,
			before: func() { reqs = append(reqs, w.create(t, ctx, n+1, -20*time.Minute)) }},
	}
	for _, s := range steps {
		w.clock.Advance(s.advance)
		if s.before != nil {
			s.before()
		}
		w.loop.Tick(ctx)
		if got := w.index.take(); got != s.read {
			t.Errorf("%s: the tick read %d records, want %d", s.name, got, s.read)
		}
		ev := w.events()
		if ev[approval.EventReminded] != s.reminders || ev[approval.EventEscalated] != s.escalate {
			t.Errorf("%s: %d reminders and %d escalations audited, want %d and %d",
				s.name, ev[approval.EventReminded], ev[approval.EventEscalated], s.reminders, s.escalate)
		}
		if rem, esc := w.posts.counts(); rem != s.reminders || esc != s.escalate {
			t.Errorf("%s: %d reminders and %d escalations posted, want %d and %d", s.name, rem, esc, s.reminders, s.escalate)
		}
	}
	// The escalation widened the approvers and the card was asked to
	// show it.
	esc := reqs[n-1]
	got, err := w.recs.Request(ctx, esc.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Escalated == nil || !slices.Contains(got.Approvers.Users, remBoss) {
		t.Errorf("escalated request: Escalated %+v, approvers %v; want escalated to %s and among the approvers", got.Escalated, got.Approvers.Users, remBoss)
	}
	if last := w.cards.Last(esc.ID); last == nil || last.Escalated == nil {
		t.Errorf("the card of %s was not redrawn to show the escalation (last redraw %+v)", esc.ID, last)
	}

	// A policy where no tool reminds or escalates: a tick asks nothing.
	tp, _ := w.gate.Policy("issue_refund")
	tp.RemindAfter, tp.EscalateAfter = 0, 0
	g2, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"issue_refund": tp}})
	if err != nil {
		t.Fatal(err)
	}
	quiet := &remIndex{recs: w.recs}
	loop, err := approval.NewReminders(approval.RemindersOptions{Lifecycle: w.life, Pending: quiet, Posts: w.posts, Policy: g2})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		w.clock.Advance(10 * time.Minute)
		loop.Tick(ctx)
	}
	if quiet.lists != 0 || quiet.reads != 0 {
		t.Errorf("with no tool that reminds or escalates, three ticks listed %d times and read %d records; want none", quiet.lists, quiet.reads)
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
	return refsFrom(m.refs, from, offset, count), nil
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
	gate := remGate(t) // reminders every 10 minutes
	recs := approvaltest.NewRecords(clock.Now)
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: approvaltest.NewLedger(recs, approvaltest.NewAuditor(clock.Now)), Gate: gate, Now: clock.Now})
	if err != nil {
		t.Fatalf("NewLifecycle: %v", err)
	}
	idx := &memIndex{asked: map[string]int{}}
	for i := range 1300 {
		created := t0
		if i >= 800 {
			created = t0.Add(time.Millisecond)
		}
		idx.refs = append(idx.refs, approval.PendingRef{ID: fmt.Sprintf("req_%05d", i), Created: created})
	}
	loop, err := approval.NewReminders(approval.RemindersOptions{Lifecycle: life, Pending: idx, Posts: newRemPosts()})
	if err != nil {
		t.Fatalf("NewReminders: %v", err)
	}
	loop.Tick(context.Background())
	if len(idx.asked) != 0 {
		t.Fatalf("the first tick read %d records; nothing can be due for 10 minutes", len(idx.asked))
	}
	// The burst's pages (the last one short) and the sweep's pages: reads
	// by the page, never by the entry or twice.
	if want := (len(idx.refs)+approval.IndexPage)/approval.IndexPage + approval.SweepPages; idx.lists > want {
		t.Errorf("the first tick read the index %d times, want at most %d (%d pages of new requests of %d entries and %d of the sweep)",
			idx.lists, want, want-approval.SweepPages, approval.IndexPage, approval.SweepPages)
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

// TestNewRemindersRequired: a loop without its lifecycle, index, card
// writer or policy is refused, naming the option.
func TestNewRemindersRequired(t *testing.T) {
	w := newRemWorld(t)
	bare, err := approval.NewLifecycle(approval.LifecycleOptions{Records: approvaltest.NewLedger(w.recs, w.audit)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts approval.RemindersOptions
		want string
	}{
		{"no lifecycle", approval.RemindersOptions{Pending: w.index, Posts: w.posts}, "RemindersOptions.Lifecycle"},
		{"no index", approval.RemindersOptions{Lifecycle: w.life, Posts: w.posts}, "RemindersOptions.Pending"},
		{"no card writer", approval.RemindersOptions{Lifecycle: w.life, Pending: w.index}, "RemindersOptions.Posts"},
		{"no policy, no gate", approval.RemindersOptions{Lifecycle: bare, Pending: w.index, Posts: w.posts}, "RemindersOptions.Policy"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := approval.NewReminders(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewReminders = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// flakyReminders fails the next ClaimReminder calls as a store that does
// not answer.
type flakyReminders struct {
	*approvaltest.Ledger
	mu    sync.Mutex // guards fails
	fails int
}

func (f *flakyReminders) ClaimReminder(ctx context.Context, id string, n int, now time.Time) (bool, error) {
	f.mu.Lock()
	fail := f.fails > 0
	if fail {
		f.fails--
	}
	f.mu.Unlock()
	if fail {
		return false, errors.New("store not answering")
	}
	return f.Ledger.ClaimReminder(ctx, id, n, now)
}

// TestRemindersAtMostOnce: a reminder whose claim failed is tried again on
// the next tick; one claimed (and audited) whose post then failed is not
// (at most once: the next reminder follows RemindAfter later).
func TestRemindersAtMostOnce(t *testing.T) {
	ctx := context.Background()
	flaky := &flakyReminders{}
	w := newRemWorldOver(t, func(r *approvaltest.Ledger) approval.Records { flaky.Ledger = r; return flaky })
	r := w.create(t, ctx, 0, 0)
	refused := 0
	w.posts.fail = func(_ *approval.Request, n int) error {
		if n == 2 {
			refused++
			return errors.New("slack refused the post")
		}
		return nil
	}
	reminded := func() int { return w.events()[approval.EventReminded] }

	w.clock.Advance(10 * time.Minute)
	flaky.fails = 1
	w.loop.Tick(ctx)
	if got, _ := w.posts.counts(); reminded() != 0 || got != 0 {
		t.Fatalf("a failed claim: %d reminders audited and %d posted, want none", reminded(), got)
	}
	w.clock.Advance(approval.DefaultRemindEvery)
	w.loop.Tick(ctx)
	if got := w.posts.reminders[r.ID]; reminded() != 1 || !slices.Equal(got, []int{1}) {
		t.Fatalf("the tick after a failed claim: %d reminders audited, posted %v; want reminder 1 audited and posted", reminded(), got)
	}

	w.clock.Advance(10 * time.Minute) // +20m15s: reminder 2, its post refused
	w.loop.Tick(ctx)
	for range 3 {
		w.clock.Advance(approval.DefaultRemindEvery)
		w.loop.Tick(ctx)
	}
	if got := w.posts.reminders[r.ID]; reminded() != 2 || refused != 1 || !slices.Equal(got, []int{1}) {
		t.Errorf("a refused post: %d reminders audited, the post tried %d times, posted %v; want 2 audited, one try, [1] posted", reminded(), refused, got)
	}
	w.clock.Advance(10 * time.Minute) // +31m: reminder 3
	w.loop.Tick(ctx)
	if got := w.posts.reminders[r.ID]; reminded() != 3 || !slices.Equal(got, []int{1, 3}) {
		t.Errorf("the next reminder: %d audited, posted %v; want 3 audited, [1 3] posted", reminded(), got)
	}
}
