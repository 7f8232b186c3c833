package bot

import (
	"context"
	"log/slog"
	"time"

	"github.com/countersign/countersign/approval"
)

// DefaultRemindEvery is how often the reminder loop looks at pending
// requests.
const DefaultRemindEvery = 15 * time.Second

// ReminderStore is what the reminder loop needs of the store. ClaimReminder
// and Escalate succeed for exactly one caller across all processes.
type ReminderStore interface {
	// Pending returns pending requests, oldest first.
	Pending(ctx context.Context) ([]*approval.Request, error)
	// ClaimReminder reports whether the caller is the one to send reminder
	// n of request id; false for a final request or one past its deadline.
	ClaimReminder(ctx context.Context, id string, n int, now time.Time) (bool, error)
	// Escalate marks id escalated (once) and, with widen, adds to to its
	// approvers. It reports whether this call did it.
	Escalate(ctx context.Context, id string, to approval.Approvers, widen bool, now time.Time) (*approval.Request, bool, error)
}

// ReminderCards posts reminders and escalations (the bot).
type ReminderCards interface {
	Remind(ctx context.Context, r *approval.Request, n int) error
	Escalate(ctx context.Context, r *approval.Request) error
}

// ReminderPolicies resolves a tool's policy (the gate).
type ReminderPolicies interface {
	Policy(tool string) (approval.ToolPolicy, bool)
}

// ReminderAudit appends to the audit stream.
type ReminderAudit interface {
	Append(ctx context.Context, r approval.Record) (approval.Entry, error)
}

// Reminders re-pings approvers of requests that wait too long and escalates
// them, following each tool's remind_after, escalate_after, escalate_to and
// widen_on_escalation. Every process runs one; the store makes each
// reminder and each escalation happen once across all of them. A reminder
// whose post fails after its claim is not retried (at most once: the next
// one follows RemindAfter later).
type Reminders struct {
	Store  ReminderStore
	Cards  ReminderCards
	Policy ReminderPolicies
	Audit  ReminderAudit
	Now    func() time.Time
	// Ticker makes the ticker Run waits on (default time.NewTicker); tests
	// call Tick directly.
	Ticker func(d time.Duration) (<-chan time.Time, func())
	Every  time.Duration
	Log    *slog.Logger
}

// Run calls Tick at once and then every r.Every until ctx ends, and
// returns then.
func (r *Reminders) Run(ctx context.Context) {
	every := approval.PositiveOr(r.Every, DefaultRemindEvery)
	c, stop := approval.FuncOr(r.Ticker, approval.NewTicker)(every)
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

// Tick sends every reminder and escalation due at r.Now(). Errors are
// logged; the next tick tries again what was not claimed.
func (r *Reminders) Tick(ctx context.Context) {
	pending, err := r.Store.Pending(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.Log.Error("reminders: list pending requests", "err", err)
		}
		return
	}
	for _, req := range pending {
		if ctx.Err() != nil {
			return
		}
		if req.Card.Channel == "" || req.Card.TS == "" {
			continue // no card yet: nothing to reply to
		}
		if req.Mode == approval.ModeAfter {
			continue // a cancel window waits for nobody: it runs when it ends
		}
		tp, ok := r.Policy.Policy(req.Tool)
		if !ok {
			continue // the tool left the policy; its deadline still applies
		}
		now := r.Now()
		if !req.Deadline.IsZero() && !now.Before(req.Deadline) {
			continue // the expiry sweeper's turn
		}
		log := r.Log.With("request_id", req.ID, "run_id", req.RunID, "tool", req.Tool)
		if tp.EscalateAfter > 0 && req.Escalated == nil && !now.Before(req.Created.Add(tp.EscalateAfter)) {
			r.escalate(ctx, log, req, tp, now)
		}
		if n := ReminderDue(req.Created, tp.RemindAfter, now); n > 0 {
			r.remind(ctx, log, req, n, now)
		}
	}
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

func (r *Reminders) remind(ctx context.Context, log *slog.Logger, req *approval.Request, n int, now time.Time) {
	ok, err := r.Store.ClaimReminder(ctx, req.ID, n, now)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: claim reminder", "n", n, "err", err)
		}
		return
	}
	if !ok {
		return // another process sent it, or the request moved on
	}
	if err := r.Cards.Remind(ctx, req, n); err != nil {
		log.Error("reminders: post reminder", "n", n, "err", err)
		return
	}
	if _, err := r.Audit.Append(ctx, approval.Record{
		Event: approval.EventReminded, RequestID: req.ID, RunID: req.RunID, Actor: "system", Tool: req.Tool,
		Data:    approval.RemindedEvent{N: n, WaitingSince: req.Created, Deadline: req.Deadline},
		TraceID: req.TraceID,
	}); err != nil {
		log.Error("reminders: audit reminded", "err", err)
	}
	log.Info("reminder sent", "n", n)
}

func (r *Reminders) escalate(ctx context.Context, log *slog.Logger, req *approval.Request, tp approval.ToolPolicy, now time.Time) {
	esc, ok, err := r.Store.Escalate(ctx, req.ID, tp.EscalateTo, tp.WidenOnEscalation, now)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: escalate", "err", err)
		}
		return
	}
	if !ok {
		return
	}
	if _, err := r.Audit.Append(ctx, approval.Record{
		Event: approval.EventEscalated, RequestID: req.ID, RunID: req.RunID, Actor: "system", Tool: req.Tool,
		Data:    approval.EscalatedEvent{To: esc.Escalated.To, Widened: esc.Escalated.Widened, Approvers: esc.Approvers},
		TraceID: req.TraceID,
	}); err != nil {
		log.Error("reminders: audit escalated", "err", err)
	}
	if err := r.Cards.Escalate(ctx, esc); err != nil {
		log.Error("reminders: post escalation", "err", err)
		return
	}
	log.Info("request escalated", "widened", esc.Escalated.Widened)
}
