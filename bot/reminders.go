package bot

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// DefaultRemindEvery is how often the reminder loop looks at pending
// requests.
const DefaultRemindEvery = 15 * time.Second

// ReminderStore is what the reminder loop reads of the store.
type ReminderStore interface {
	// PendingFrom returns the ids and creation times of the pending
	// requests created at or after from (zero: all), oldest first, from
	// the offset-th and at most count.
	PendingFrom(ctx context.Context, from time.Time, offset, count int) ([]approval.PendingRef, error)
	// PendingRank returns the pending index's entries ranked start to
	// start+count-1, oldest first.
	PendingRank(ctx context.Context, start, count int) ([]approval.PendingRef, error)
	// PendingRecords returns the records of ids in their order, nil for
	// one gone or no longer pending.
	PendingRecords(ctx context.Context, ids []string) ([]*approval.Request, error)
}

// ReminderLifecycle is the owner of request state (*approval.Lifecycle):
// it records each reminder and each escalation (once across all
// processes) and audits it.
type ReminderLifecycle interface {
	// ClaimReminder claims reminder n of r and audits it; false when
	// another process sent it or the request moved on.
	ClaimReminder(ctx context.Context, r *approval.Request, n int) (bool, error)
	// Escalate escalates pending request id to "to" (with widen, they may
	// decide it), audits it and redraws the card; false when another
	// process did or the request moved on.
	Escalate(ctx context.Context, id string, to approval.Approvers, widen bool) (*approval.Request, bool, error)
}

// ReminderCards posts reminders and escalations in a card's thread (the
// bot).
type ReminderCards interface {
	Remind(ctx context.Context, r *approval.Request, n int) error
	Escalate(ctx context.Context, r *approval.Request) error
}

// ReminderPolicies resolves a tool's policy (the gate).
type ReminderPolicies interface {
	Tools() []string
	Policy(tool string) (approval.ToolPolicy, bool)
}

// Reminders re-pings approvers of requests that wait too long and escalates
// them, following each tool's remind_after, escalate_after, escalate_to and
// widen_on_escalation. Every process runs one; the lifecycle makes each
// reminder and each escalation happen once across all of them (recorded,
// then audited). A reminder whose post fails after its claim is not
// retried (at most once: the next one follows RemindAfter later).
type Reminders struct {
	Store     ReminderStore
	Lifecycle ReminderLifecycle
	Cards     ReminderCards
	Policy    ReminderPolicies
	Now       func() time.Time
	// Ticker makes the ticker Run waits on (default time.NewTicker); tests
	// call Tick directly.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	Every  time.Duration
	Log    *slog.Logger

	mu    sync.Mutex
	plan  reminderPlan
	first *time.Duration // the earliest a reminder or escalation can be due after creation (nil: not looked yet)
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
		for _, name := range r.Policy.Tools() {
			tp, ok := r.Policy.Policy(name)
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

// Run calls Tick at once and then every r.Every until ctx ends, and
// returns then.
func (r *Reminders) Run(ctx context.Context) {
	every := option.PositiveOr(r.Every, DefaultRemindEvery)
	c, stop := option.FuncOr(r.Ticker, clock.NewTicker)(every)
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
func (p *reminderPlan) learn(refs []approval.PendingRef, first time.Duration) {
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

// Tick sends every reminder and escalation due at r.Now(). It reads the
// index entries of the requests created since its previous tick and one
// page of the sweep, then the records of the requests with something due;
// each record read tells when to look at it again. Errors are logged; the
// next tick tries again what was not claimed.
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
	now := r.Now()
	if err := r.readNew(ctx, first); err != nil {
		if ctx.Err() == nil {
			r.Log.Error("reminders: list new pending requests", "err", err)
		}
		return // since unchanged: the next tick reads them again
	}
	p.since = now
	if err := r.sweep(ctx, first); err != nil && ctx.Err() == nil {
		r.Log.Error("reminders: sweep pending requests", "err", err)
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
		refs, err := r.Store.PendingFrom(ctx, from, skip, indexPage)
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
		refs, err := r.Store.PendingRank(ctx, p.sweep, indexPage)
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
	reqs, err := r.Store.PendingRecords(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			r.Log.Error("reminders: read pending requests", "n", len(ids), "err", err)
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
		if req != nil && req.Status == approval.StatusPending {
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
func (r *Reminders) visit(ctx context.Context, req *approval.Request) (time.Time, bool) {
	now := r.Now()
	if req.Card.Channel == "" || req.Card.TS == "" {
		return now, true // no card yet: nothing to reply to; the next tick
	}
	if req.Mode == approval.ModeAfter {
		return time.Time{}, false // a cancel window waits for nobody: it runs when it ends
	}
	tp, ok := r.Policy.Policy(req.Tool)
	if !ok {
		return time.Time{}, false // the tool left the policy; its deadline still applies
	}
	if !req.Deadline.IsZero() && !now.Before(req.Deadline) {
		return time.Time{}, false // the expiry sweeper's turn
	}
	log := r.Log.With("request_id", req.ID, "run_id", req.RunID, "tool", req.Tool)
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

// remind sends reminder n of req once across processes. It returns false
// when the claim failed, to be tried again (a post that fails after its
// claim is not: at most once).
func (r *Reminders) remind(ctx context.Context, log *slog.Logger, req *approval.Request, n int) bool {
	ok, err := r.Lifecycle.ClaimReminder(ctx, req, n)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: claim reminder", "n", n, "err", err)
		}
		return false
	}
	if !ok {
		return true // another process sent it, or the request moved on
	}
	if err := r.Cards.Remind(ctx, req, n); err != nil {
		log.Error("reminders: reminder claimed and audited, but not posted", "n", n, "err", err)
		return true
	}
	log.Info("reminder sent", "n", n)
	return true
}

// escalate escalates req once across processes. It returns false when
// the escalation failed, to be tried again.
func (r *Reminders) escalate(ctx context.Context, log *slog.Logger, req *approval.Request, tp approval.ToolPolicy) bool {
	esc, ok, err := r.Lifecycle.Escalate(ctx, req.ID, tp.EscalateTo, tp.WidenOnEscalation)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: escalate", "err", err)
		}
		return false
	}
	if !ok {
		return true
	}
	if err := r.Cards.Escalate(ctx, esc); err != nil {
		log.Error("reminders: post escalation", "err", err)
		return true
	}
	log.Info("request escalated", "widened", esc.Escalated.Widened)
	return true
}
