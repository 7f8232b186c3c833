package approval

import (
	"cmp"
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// DefaultRemindEvery is how often the reminder loop looks at pending
// requests.
const DefaultRemindEvery = 15 * time.Second

// PendingIndex is what the reminder loop reads of the store: the index of
// pending requests by creation, and their records (store.Store implements
// it).
type PendingIndex interface {
	// PendingFrom returns the ids and creation times of the pending
	// requests created at or after from (zero: all), oldest first, from
	// the offset-th and at most count.
	PendingFrom(ctx context.Context, from time.Time, offset, count int) ([]PendingRef, error)
	// PendingRank returns the pending index's entries ranked start to
	// start+count-1, oldest first.
	PendingRank(ctx context.Context, start, count int) ([]PendingRef, error)
	// PendingRecords returns the records of ids in their order, nil for
	// one gone or no longer pending.
	PendingRecords(ctx context.Context, ids []string) ([]*Request, error)
}

// Reminder posts what the reminder loop decided in a card's thread (the
// bot implements it, Slack only). It writes no record and audits nothing:
// each call comes once across processes, after the lifecycle recorded and
// audited the reminder or the escalation. An error means nothing was
// posted; the loop logs it and does not try again (at most once).
type Reminder interface {
	// Remind posts reminder n of pending request r in its card's thread.
	Remind(ctx context.Context, r *Request, n int) error
	// Escalate tells r.Escalated.To in r's card's thread that r needs
	// them (the card was redrawn to show it already).
	Escalate(ctx context.Context, r *Request) error
}

// ReminderPolicies resolves a tool's policy (the gate).
type ReminderPolicies interface {
	Tools() []string
	Policy(tool string) (ToolPolicy, bool)
}

// RemindersOptions configure a reminder loop. Lifecycle, Pending and Posts
// are required.
type RemindersOptions struct {
	// Lifecycle records and audits each reminder and escalation
	// (ClaimReminder, Escalate), once across processes; its clock is the
	// loop's.
	Lifecycle *Lifecycle
	// Pending is the index of pending requests and their records.
	Pending PendingIndex
	// Posts posts reminders and escalations in the cards' threads.
	Posts Reminder
	// Policy resolves each tool's remind_after, escalate_after,
	// escalate_to and widen_on_escalation; default the lifecycle's gate.
	Policy ReminderPolicies
	// Every is how often Run ticks, default DefaultRemindEvery.
	Every time.Duration
	// Ticker makes the ticker Run waits on (default clock.NewTicker);
	// tests call Tick directly.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	// Logger receives operator detail, default discard.
	Logger *slog.Logger
}

// Reminders re-pings approvers of requests that wait too long and escalates
// them, following each tool's remind_after, escalate_after, escalate_to and
// widen_on_escalation: the domain decides what is due and when, the
// lifecycle records and audits it, and the card writer only posts it
// (Reminder). Every process runs one; the lifecycle makes each reminder
// and each escalation happen once across all of them (recorded, then
// audited). A reminder whose post fails after its claim is not retried (at
// most once: the next one follows RemindAfter later). It is safe for
// concurrent use: ticks run one at a time.
type Reminders struct {
	life    *Lifecycle
	pending PendingIndex
	posts   Reminder
	policy  ReminderPolicies
	now     func() time.Time
	ticker  func(d time.Duration) (<-chan time.Time, func())
	every   time.Duration
	log     *slog.Logger

	mu    sync.Mutex     // guards plan and first: one tick at a time
	plan  reminderPlan   // what the loop knows between ticks
	first *time.Duration // the earliest a reminder or escalation can be due after creation (nil: not looked yet)
}

// NewReminders returns the reminder loop of opts.Lifecycle.
func NewReminders(opts RemindersOptions) (*Reminders, error) {
	if err := cmp.Or(
		option.Required("approval: RemindersOptions.Lifecycle", opts.Lifecycle == nil),
		option.Required("approval: RemindersOptions.Pending", opts.Pending == nil),
		option.Required("approval: RemindersOptions.Posts", opts.Posts == nil),
	); err != nil {
		return nil, err
	}
	if opts.Policy == nil && opts.Lifecycle.gate != nil {
		opts.Policy = opts.Lifecycle.gate
	}
	if err := option.Required("approval: RemindersOptions.Policy (or LifecycleOptions.Gate)", opts.Policy == nil); err != nil {
		return nil, err
	}
	return &Reminders{
		life: opts.Lifecycle, pending: opts.Pending, posts: opts.Posts, policy: opts.Policy,
		now:    opts.Lifecycle.now,
		ticker: option.FuncOr(opts.Ticker, clock.NewTicker),
		every:  option.PositiveOr(opts.Every, DefaultRemindEvery),
		log:    cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
	}, nil
}

const (
	// indexLag is how far back, before its previous tick by its own
	// clock, a loop reads the pending index for new requests: for clocks
	// of other processes behind its own and index writes late by as much.
	// Later ones are found by the sweep.
	indexLag = 30 * time.Second
	// indexPage bounds the index entries of one read: new requests are
	// read in pages, and the sweep reads sweepPages pages per tick. Redis
	// answers a read whole before any other client's command, so a page
	// is a pause for everyone: 500 entries held it about 0.2 ms (a burst
	// of 10,000 new requests, read again on the ticks within indexLag,
	// showed in the click benchmark's slowest clicks), 100 about 27 µs.
	indexPage = 100
	// sweepPages is how many pages the sweep reads per tick: 500 entries,
	// a pass over 10,000 pending in 20 ticks (5 minutes).
	sweepPages = 5
)

// reminderPlan is what a loop knows between ticks, so that a tick reads
// the index entries of new requests and the records of requests with
// something due, not every pending record: with 10,000 pending, reading
// them all every 15 s held Redis 5–6 ms on the index alone and then for
// the records' pages, and decoding them was a burst of CPU and garbage
// that reached the clicks of other requests (docs/performance.md).
//
// A request is first read when its earliest reminder or escalation can be
// due (its creation plus first); its record then says when to look again,
// or that nothing more can be due. The sweep reads one page of the whole
// index per tick, a safety net for entries the reads of new requests
// missed (an index write later than indexLag); a round of it also forgets
// the ids that left the index.
type reminderPlan struct {
	since time.Time          // when the previous tick read the index (this process's clock)
	known map[string]planned // ids read from the index
	due   dueHeap            // when to look at a request again
	sweep int                // offset of the sweep's next page
	round int                // sweep rounds begun
}

// planned is what a plan knows of a request: the sweep round that last saw
// it in the index, and whether it is in the due heap.
type planned struct {
	round     int
	scheduled bool
}

// dueItem is one request to look at again at "at".
type dueItem struct {
	at time.Time
	id string
}

// dueHeap is a min-heap of dueItems by time (container/heap).
type dueHeap []dueItem

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueItem)) }
func (h *dueHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// firstDue is the shortest remind_after or escalate_after of the policy's
// tools: nothing can be due sooner after a request's creation. Zero when no
// tool reminds or escalates: then a tick reads nothing.
func (r *Reminders) firstDue() time.Duration {
	if r.first == nil {
		var first time.Duration
		for _, name := range r.policy.Tools() {
			tp, ok := r.policy.Policy(name)
			if !ok {
				continue
			}
			for _, d := range []time.Duration{tp.RemindAfter, tp.EscalateAfter} {
				if d > 0 && (first == 0 || d < first) {
					first = d
				}
			}
		}
		r.first = &first
	}
	return *r.first
}

// Run calls Tick at once and then every RemindersOptions.Every until ctx
// ends, and returns then.
func (r *Reminders) Run(ctx context.Context) {
	c, stop := r.ticker(r.every)
	defer stop()
	for {
		r.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-c:
		}
	}
}

// learn plans the first look at each request of refs not known yet.
func (p *reminderPlan) learn(refs []PendingRef, first time.Duration) {
	for _, ref := range refs {
		e, ok := p.known[ref.ID]
		if !ok {
			heap.Push(&p.due, dueItem{at: ref.Created.Add(first), id: ref.ID})
			e.scheduled = true
		}
		e.round = p.round
		p.known[ref.ID] = e
	}
}

// Tick sends every reminder and escalation due now (the lifecycle's
// clock). It reads the index entries of the requests created since its
// previous tick and one page of the sweep, then the records of the
// requests with something due; each record read tells when to look at it
// again. Errors are logged; the next tick tries again what was not
// claimed.
func (r *Reminders) Tick(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.firstDue()
	if first == 0 {
		return
	}
	p := &r.plan
	if p.known == nil {
		p.known = map[string]planned{}
	}
	now := r.now()
	if err := r.readNew(ctx, first); err != nil {
		if ctx.Err() == nil {
			r.log.Error("reminders: list new pending requests", "err", err)
		}
		return // since unchanged: the next tick reads them again
	}
	p.since = now
	if err := r.sweep(ctx, first); err != nil && ctx.Err() == nil {
		r.log.Error("reminders: sweep pending requests", "err", err)
	}
	var ids []string
	for p.due.Len() > 0 && !p.due[0].at.After(now) {
		ids = append(ids, heap.Pop(&p.due).(dueItem).id)
	}
	if len(ids) > 0 {
		r.look(ctx, ids, now)
	}
}

// readNew learns the index entries created since the previous tick (less
// indexLag; the whole index on the first), page by page from the last
// creation read, skipping the ones read with it (a later entry of the
// same millisecond missed here is the sweep's).
func (r *Reminders) readNew(ctx context.Context, first time.Duration) error {
	p := &r.plan
	from := time.Time{}
	if !p.since.IsZero() {
		from = p.since.Add(-indexLag)
	}
	for skip := 0; ; {
		refs, err := r.pending.PendingFrom(ctx, from, skip, indexPage)
		if err != nil {
			return err
		}
		p.learn(refs, first)
		if len(refs) < indexPage {
			return nil
		}
		last := refs[len(refs)-1].Created
		if last.Equal(from) {
			skip += len(refs) // a page of one millisecond
			continue
		}
		from, skip = last, 0
		for _, ref := range refs {
			if ref.Created.Equal(last) {
				skip++
			}
		}
	}
}

// sweep learns the next sweepPages pages of the whole index by rank; at
// the end of a round it forgets the ids that left the index (and reads no
// further this tick).
func (r *Reminders) sweep(ctx context.Context, first time.Duration) error {
	p := &r.plan
	for range sweepPages {
		refs, err := r.pending.PendingRank(ctx, p.sweep, indexPage)
		if err != nil {
			return err
		}
		p.learn(refs, first)
		p.sweep += len(refs)
		if len(refs) < indexPage {
			for id, e := range p.known {
				if e.round < p.round && !e.scheduled {
					delete(p.known, id)
				}
			}
			p.round++
			p.sweep = 0
			return nil
		}
	}
	return nil
}

// look reads the records of ids, due at now, sends what is due and plans
// when to look at each again; what could not be read is looked at on the
// next tick.
func (r *Reminders) look(ctx context.Context, ids []string, now time.Time) {
	p := &r.plan
	again := func(ids []string) {
		for _, id := range ids {
			heap.Push(&p.due, dueItem{at: now, id: id})
		}
	}
	reqs, err := r.pending.PendingRecords(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Error("reminders: read pending requests", "n", len(ids), "err", err)
		}
		again(ids)
		return
	}
	for i, req := range reqs {
		if ctx.Err() != nil {
			again(ids[i:])
			return
		}
		id := ids[i]
		var next time.Time
		ok := false // final or gone: nothing more to send
		if req != nil && req.Status == StatusPending {
			next, ok = r.visit(ctx, req)
		}
		if ok {
			heap.Push(&p.due, dueItem{at: next, id: id})
		}
		// Known until a sweep round no longer finds it in the index.
		p.known[id] = planned{round: p.known[id].round, scheduled: ok}
	}
}

// visit sends what is due for pending request req and returns when to look
// at it again (false: never, nothing more can be due).
func (r *Reminders) visit(ctx context.Context, req *Request) (time.Time, bool) {
	now := r.now()
	if req.Card.Channel == "" || req.Card.TS == "" {
		return now, true // no card yet: nothing to reply to; the next tick
	}
	if req.Mode == ModeAfter {
		return time.Time{}, false // a cancel window waits for nobody: it runs when it ends
	}
	tp, ok := r.policy.Policy(req.Tool)
	if !ok {
		return time.Time{}, false // the tool left the policy; its deadline still applies
	}
	if !req.Deadline.IsZero() && !now.Before(req.Deadline) {
		return time.Time{}, false // the expiry sweeper's turn
	}
	log := r.log.With("request_id", req.ID, "run_id", req.RunID, "tool", req.Tool)
	retry := false
	escalateAt := req.Created.Add(tp.EscalateAfter)
	if tp.EscalateAfter > 0 && req.Escalated == nil && !now.Before(escalateAt) {
		retry = !r.escalate(ctx, log, req, tp)
	}
	n := ReminderDue(req.Created, tp.RemindAfter, now)
	if n > 0 {
		retry = !r.remind(ctx, log, req, n) || retry
	}
	if retry {
		return now, true // the next tick tries again
	}
	var next time.Time
	if tp.EscalateAfter > 0 && req.Escalated == nil && now.Before(escalateAt) {
		next = escalateAt
	}
	if tp.RemindAfter > 0 {
		if at := req.Created.Add(time.Duration(n+1) * tp.RemindAfter); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if next.IsZero() || (!req.Deadline.IsZero() && !next.Before(req.Deadline)) {
		return time.Time{}, false
	}
	return next, true
}

// ReminderDue is the number of the latest reminder due at now for a
// request created at created: reminder n is due at created + n·every. Zero
// means none (or reminders are off).
func ReminderDue(created time.Time, every time.Duration, now time.Time) int {
	if every <= 0 || now.Before(created) {
		return 0
	}
	return int(now.Sub(created) / every)
}

// remind sends reminder n of req once across processes: claimed and
// audited by the lifecycle, then posted. It returns false when the claim
// failed, to be tried again (a post that fails after its claim is not: at
// most once).
func (r *Reminders) remind(ctx context.Context, log *slog.Logger, req *Request, n int) bool {
	ok, err := r.life.ClaimReminder(ctx, req, n)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: claim reminder", "n", n, "err", err)
		}
		return false
	}
	if !ok {
		return true // another process sent it, or the request moved on
	}
	if err := r.posts.Remind(ctx, req, n); err != nil {
		log.Error("reminders: reminder claimed and audited, but not posted", "n", n, "err", err)
		return true
	}
	log.Info("reminder sent", "n", n)
	return true
}

// escalate escalates req once across processes: recorded, audited and the
// card redrawn by the lifecycle, then the target told. It returns false
// when the escalation failed, to be tried again.
func (r *Reminders) escalate(ctx context.Context, log *slog.Logger, req *Request, tp ToolPolicy) bool {
	esc, ok, err := r.life.Escalate(ctx, req.ID, tp.EscalateTo, tp.WidenOnEscalation)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: escalate", "err", err)
		}
		return false
	}
	if !ok {
		return true
	}
	if err := r.posts.Escalate(ctx, esc); err != nil {
		log.Error("reminders: post escalation", "err", err)
		return true
	}
	log.Info("request escalated", "widened", esc.Escalated.Widened)
	return true
}
