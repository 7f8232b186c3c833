package bot

import (
	"context"
	"log/slog"
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
	// Pending returns pending requests, oldest first.
	Pending(ctx context.Context) ([]*approval.Request, error)
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
			r.escalate(ctx, log, req, tp)
		}
		if n := ReminderDue(req.Created, tp.RemindAfter, now); n > 0 {
			r.remind(ctx, log, req, n)
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

func (r *Reminders) remind(ctx context.Context, log *slog.Logger, req *approval.Request, n int) {
	ok, err := r.Lifecycle.ClaimReminder(ctx, req, n)
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
		log.Error("reminders: reminder claimed and audited, but not posted", "n", n, "err", err)
		return
	}
	log.Info("reminder sent", "n", n)
}

func (r *Reminders) escalate(ctx context.Context, log *slog.Logger, req *approval.Request, tp approval.ToolPolicy) {
	esc, ok, err := r.Lifecycle.Escalate(ctx, req.ID, tp.EscalateTo, tp.WidenOnEscalation)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("reminders: escalate", "err", err)
		}
		return
	}
	if !ok {
		return
	}
	if err := r.Cards.Escalate(ctx, esc); err != nil {
		log.Error("reminders: post escalation", "err", err)
		return
	}
	log.Info("request escalated", "widened", esc.Escalated.Widened)
}
