package approval

import (
	"context"
	"time"
)

// ExpireDue expires every pending request whose deadline passed (fail
// closed), lets run every review-after request whose cancel window
// ended (approved, audited window_elapsed), and abandons every approved
// request of an outside caller that nobody claimed within its claim
// window (audited abandoned: nothing ran, a later claim is refused):
// each is recorded, audited, its waiters woken and its card redrawn. Any
// number of processes may sweep at once; each transition happens once.
// It returns how many requests this call changed.
func (l *Lifecycle) ExpireDue(ctx context.Context) (int, error) {
	expired, err := l.rec.RecordExpiries(ctx, l.now(), Prepared{Elapsed: deadlineRecord, Wake: true})
	for _, r := range expired {
		l.refresh(r)
		l.told(r)
	}
	return len(expired), err
}

// deadlineRecord audits what the clock did to r at its deadline: expired
// it (fail closed), or, at the end of a cancel window, let it run; or, at
// the end of its claim window, abandoned it (the caller had gone).
func deadlineRecord(r *Request) Record {
	if r.Status == StatusAbandoned {
		data := AbandonedEvent{ClaimWindowMS: r.ClaimWindow.Milliseconds(), Created: r.Created}
		if d := r.Decision; d != nil {
			data.Approver, data.ApprovedAt = d.Approver, d.At
		}
		if r.Caller.External() {
			data.Caller = r.Caller.Kind + ":" + r.Caller.Name
		}
		return Record{Event: EventAbandoned, RequestID: r.ID, RunID: r.RunID, Actor: "system", Tool: r.Tool, Data: data}
	}
	if r.Status == StatusApproved {
		return Record{Event: EventWindowElapsed, RequestID: r.ID, RunID: r.RunID, Actor: "system", Tool: r.Tool,
			Data: WindowElapsedEvent{RunAt: r.Deadline, Created: r.Created}}
	}
	return Record{Event: EventExpired, RequestID: r.ID, RunID: r.RunID, Actor: "system", Tool: r.Tool,
		Data: ExpiredEvent{Deadline: r.Deadline, Created: r.Created}}
}

// RunExpiry sweeps deadlines at once and then every interval until ctx
// ends; errors are logged and the loop goes on. It returns nil when ctx is
// done.
func (l *Lifecycle) RunExpiry(ctx context.Context, every time.Duration) error {
	tick, stop := l.ticker(every)
	defer stop()
	for {
		if _, err := l.ExpireDue(ctx); err != nil && ctx.Err() == nil {
			l.log.Error("expire due requests", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
	}
}

// Cancel ends a pending request without a human decision (the run
// stopped, the card could not be posted...): recorded, audited, waiters
// woken, card redrawn. A final request gives *DecidedError.
func (l *Lifecycle) Cancel(ctx context.Context, id, by, reason string) (*Request, error) {
	r, err := l.rec.RecordCancel(ctx, id, by, reason, Prepared{Wake: true, Entry: func(r *Request) Record {
		return Record{Event: EventCancelled, RequestID: r.ID, RunID: r.RunID, Actor: by, Tool: r.Tool, Data: ReasonEvent{Reason: reason}}
	}})
	if err != nil {
		return r, err
	}
	l.refresh(r)
	l.told(r)
	return r, nil
}

// Lose reports that request r vanished from the store (Redis lost its
// data) while a run waited on it: nothing ran and nothing will. The loss
// is audited and the card redrawn from r, the last copy known, to say so.
func (l *Lifecycle) Lose(ctx context.Context, r *Request) {
	l.append(ctx, r, Record{Event: EventLost, RequestID: r.ID, RunID: r.RunID, Actor: "countersign", Tool: r.Tool,
		Data: ReasonEvent{Reason: "the request's record is gone from the store; nothing ran"}})
	lost := *r
	lost.Status = StatusLost
	l.refresh(&lost)
}
