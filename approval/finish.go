package approval

import (
	"context"
	"errors"
	"time"
)

// Outcome is what became of an executed request.
type Outcome struct {
	// Status is StatusExecuted, StatusFailed or StatusUnknown.
	Status Status
	// Result is the tool's output or error text.
	Result string
	// Took is how long the tool ran.
	Took time.Duration
}

// maxAuditResult bounds the result text written to the audit stream.
const maxAuditResult = 2000

// Finish records the outcome of an executing request, audits it and
// redraws the card. A call that ran is remembered when its tool's rule
// asks once (remember), unless it needed more than one approval.
// Refusals: ErrAlreadyClaimed (already finished),
// ErrNotApproved (not executing), ErrNotFound.
func (l *Lifecycle) Finish(ctx context.Context, id, owner string, o Outcome) (*Request, error) {
	r, err := l.rec.Finish(ctx, id, o.Status, o.Result, Prepared{Entry: func(r *Request) Record {
		rec := outcomeRecord(r.ID, r.RunID, r.CallID, owner, r.Tool, o)
		rec.Secret = l.secret(r.Tool)
		return rec
	}})
	if err != nil {
		return nil, err
	}
	l.remember(context.WithoutCancel(ctx), r)
	l.refresh(r)
	return r, nil
}

// Feedback records an approver's judgement of a final request after the
// fact — Mark as wrong (f.Wrong), or Looks right on a sampled call's card —
// audits it (marked_wrong: an eval case; sample_reviewed) and redraws the
// card. Who may judge is the caller's check. Refusals: ErrNotFinal,
// ErrAlreadyMarked, ErrNotFound (wrapped), with the current record when
// there is one.
func (l *Lifecycle) Feedback(ctx context.Context, id string, f Feedback) (*Request, error) {
	r, err := l.rec.RecordFeedback(ctx, id, f, Prepared{Entry: func(r *Request) Record {
		data := FeedbackEvent{Reason: f.Reason, Status: r.Status, Sampled: r.Mode == ModeSampled, Created: r.Created}
		if d := r.Decision; d != nil {
			data.Verdict, data.DecidedBy = d.Verdict, d.Approver
		}
		ev := EventMarkedWrong
		if !f.Wrong {
			ev = EventSampleReviewed
		}
		return Record{Event: ev, RequestID: r.ID, RunID: r.RunID, Actor: f.By, Tool: r.Tool, Data: data}
	}})
	if err != nil {
		if r != nil {
			l.refresh(r)
		}
		return r, err
	}
	l.refresh(r)
	return r, nil
}

// NotRun ends an approved request that this executor cannot run (its
// tool is not available in this process): claimed and failed with why, so
// it never runs later, then audited (failed, by owner) and the card
// redrawn. What the policy refuses is the claim's judgement, not this. It
// returns the request as it now is (r when it could not be recorded).
//
// A claim the store's replicas did not confirm (ErrClaimNotConfirmed: it
// was withdrawn, the request is approved again) is made again after a
// pause, notRunTries times in all: otherwise the card would say approved,
// for good, of a call the run reports not run.
func (l *Lifecycle) NotRun(ctx context.Context, r *Request, owner, why string) *Request {
	cur := r
	_, err := l.rec.Claim(ctx, r.ID, owner, "", "", Prepared{})
	for try, wait := 1, notRunPause; try < notRunTries && errors.Is(err, ErrClaimNotConfirmed); try, wait = try+1, wait*2 {
		if l.sleep(ctx, wait) != nil {
			break
		}
		_, err = l.rec.Claim(ctx, r.ID, owner, "", "", Prepared{})
	}
	if err == nil {
		if fin, err := l.rec.Finish(context.WithoutCancel(ctx), r.ID, StatusFailed, why, Prepared{}); err == nil {
			cur = fin
		}
	}
	l.append(ctx, r, Record{Event: EventFailed, RequestID: r.ID, RunID: r.RunID, Actor: owner, Tool: r.Tool,
		Data: CallErrorEvent{CallID: r.CallID, Error: why}})
	l.refresh(cur)
	return cur
}

// notRunTries and notRunPause bound NotRun's claims of a call that must
// not run while the store's replicas do not confirm them (a failover):
// 4 claims, 0.2 + 0.4 + 0.8 s apart.
const (
	notRunTries = 4
	notRunPause = 200 * time.Millisecond
)
