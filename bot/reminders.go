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
	// requests created at or after from, oldest first.
	PendingFrom(ctx context.Context, from time.Time) ([]approval.PendingRef, error)
	// Requests returns the records of ids in their order (nil: gone).
	Requests(ctx context.Context, ids []string) ([]*approval.Request, error)
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

	mu   sync.Mutex
	plan reminderPlan
	on   *bool // some tool reminds or escalates (nil: not looked yet)
}

// indexLag is how long after its creation (by its creator's clock) a
// request may reach the pending index and still be seen by a loop that
// already saw newer ones: each tick reads the index from the newest
// creation seen less indexLag.
const indexLag = 5 * time.Minute

// reminderPlan is what a loop knows between ticks, so that a tick reads
// the records of new requests and of those with something due, not every
// pending record: with 10,000 pending, reading them all every 15 s held
// Redis 5–6 ms on the index alone and then for the records' pages, and
// decoding them was a burst of CPU and garbage that reached the clicks of
// other requests (docs/performance.md).
type reminderPlan struct {
	newest time.Time            // the newest creation seen
	seen   map[string]time.Time // ids created since newest less indexLag, read already
	due    dueHeap              // when to look at each request again
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

// reminding reports whether any tool of the policy reminds or escalates:
// when none does, a tick reads nothing.
func (r *Reminders) reminding() bool {
	if r.on == nil {
		on := false
		for _, name := range r.Policy.Tools() {
			if tp, ok := r.Policy.Policy(name); ok && (tp.RemindAfter > 0 || tp.EscalateAfter > 0) {
				on = true
			}
		}
		r.on = &on
	}
	return *r.on
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

// Tick sends every reminder and escalation due at r.Now(). It reads the
// pending requests created since the last tick, and the records of those
// new ones and of the requests whose next reminder or escalation is due;
// each record read tells when to look at it again. Errors are logged; the
// next tick tries again what was not claimed.
func (r *Reminders) Tick(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reminding() {
		return
	}
	p := &r.plan
	if p.seen == nil {
		p.seen = map[string]time.Time{}
	}
	refs, err := r.Store.PendingFrom(ctx, p.newest.Add(-indexLag))
	if err != nil {
		if ctx.Err() == nil {
			r.Log.Error("reminders: list pending requests", "err", err)
		}
		return
	}
	var ids []string
	for _, ref := range refs {
		if _, ok := p.seen[ref.ID]; ok {
			continue
		}
		p.seen[ref.ID] = ref.Created
		if ref.Created.After(p.newest) {
			p.newest = ref.Created
		}
		ids = append(ids, ref.ID)
	}
	for id, created := range p.seen {
		if created.Before(p.newest.Add(-indexLag)) {
			delete(p.seen, id) // older than any read from now on
		}
	}
	now := r.Now()
	for p.due.Len() > 0 && !p.due[0].at.After(now) {
		ids = append(ids, heap.Pop(&p.due).(dueItem).id)
	}
	if len(ids) == 0 {
		return
	}
	reqs, err := r.Store.Requests(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			r.Log.Error("reminders: read pending requests", "n", len(ids), "err", err)
		}
		for _, id := range ids {
			heap.Push(&p.due, dueItem{at: now, id: id}) // the next tick
		}
		return
	}
	for i, req := range reqs {
		if ctx.Err() != nil {
			for _, id := range ids[i:] {
				heap.Push(&p.due, dueItem{at: now, id: id})
			}
			return
		}
		if req == nil || req.Status != approval.StatusPending {
			continue // final or gone: nothing more to send
		}
		if next, ok := r.visit(ctx, req); ok {
			heap.Push(&p.due, dueItem{at: next, id: req.ID})
		}
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
