package approval

import (
	"context"
	"errors"

	"github.com/countersign/countersign/approval/clip"
)

// Create saves a new pending request, audits it and has its card posted
// and bound. When the id exists (a run resumed after a restart) the stored
// request is the truth: its card is posted only if it has none. A card
// that cannot be posted cancels the request (fail closed); the returned
// request then says so. An error means the request could not be saved.
func (l *Lifecycle) Create(ctx context.Context, r *Request) (*Request, error) {
	if r.Caller.External() && r.ClaimWindow <= 0 {
		r.ClaimWindow = l.claimWindow
	}
	actor := "agent"
	if r.Caller.External() {
		actor = r.Caller.Kind + ":" + r.Caller.Name
	}
	entries := func(r *Request) []Record {
		return l.createdRecords(r, actor)
	}
	stored, err := l.createOrReuse(ctx, r, entries)
	if err != nil {
		return nil, err
	}
	return l.EnsureCard(ctx, stored), nil
}

// createdRecords are the entries of a request created by actor:
// requested, and scheduled for a cancel window.
func (l *Lifecycle) createdRecords(r *Request, actor string) []Record {
	entries := []Record{{Event: EventRequested, RequestID: r.ID, RunID: r.RunID, Actor: actor, Tool: r.Tool, TraceID: r.TraceID,
		Data: RequestedEvent{CallID: r.CallID, Args: r.Args, Digest: r.Digest, Deadline: r.Deadline, Quorum: r.Quorum,
			Signals: r.Signals, Preview: r.Preview, PreviewError: r.Preview.Error, Decisions: r.Decisions,
			Created: r.Created, Reason: r.Reason, Confidence: r.Confidence, Requester: r.Requester, Requesters: multiple(r.Askers()), Kind: r.Kind, Choices: r.Choices}, Secret: l.secret(r.Tool)}}
	if r.Mode == ModeAfter {
		entries = append(entries, Record{Event: EventScheduled, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool, TraceID: r.TraceID,
			Data: ScheduledEvent{RunAt: r.Deadline, WindowMS: r.Deadline.Sub(r.Created).Milliseconds()}})
	}
	return entries
}

// createOrReuse saves r with its entries, or, when its id is taken (a run
// resumed, a caller that retried), returns the stored request, which is
// the truth, having written nothing. The one create of Create, Sampled
// and Settle.
func (l *Lifecycle) createOrReuse(ctx context.Context, r *Request, entries func(*Request) []Record) (*Request, error) {
	err := l.rec.CreateRequest(ctx, r, entries)
	if errors.Is(err, ErrExists) {
		return l.rec.Request(ctx, r.ID)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Sampled records a call that ran without a human and was picked for
// review (Sampled: the tool's sample rate), audits it (sampled, with what
// its review card shows) and has that card posted, offering Looks right /
// Wrong. r has Mode ModeSampled and Status executed or failed. When the id
// exists (a run replayed after a restart) the stored request stands and
// only a missing card is posted. A card that cannot be posted is logged:
// the call already ran, so there is nothing to fail closed. An error means
// the request could not be saved.
func (l *Lifecycle) Sampled(ctx context.Context, r *Request, rate float64) (*Request, error) {
	r, err := l.createOrReuse(ctx, r, func(r *Request) []Record {
		return []Record{{Event: EventSampled, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool, TraceID: r.TraceID,
			Data: SampledEvent{CallID: r.CallID, Args: r.Args, Digest: r.Digest, Preview: r.Preview, Status: r.Status,
				Result: clip.Bytes(r.Result, maxAuditResult), Rate: rate, Created: r.Created, Requester: r.Requester}, Secret: l.secret(r.Tool)}}
	})
	if err != nil {
		return nil, err
	}
	if r.Card.Bound() || l.cards == nil {
		return r, nil
	}
	cur, err := l.postCard(ctx, r)
	if err != nil {
		l.log.Error("review card of a sampled call not posted", "request_id", r.ID, "tool", r.Tool, "err", err)
		return r, nil
	}
	return cur, nil
}

// Settle records a call the gate settled without a human (r.Mode
// ModeSettled, r.Status approved or rejected) and audits rec (the gate's
// auto_approved or call_refused): no card, nobody to wake. It exists so
// that a caller who asks again by call id reads the same answer. When the
// id exists (the caller retried) the stored request stands and nothing is
// audited again. An error means the request could not be saved.
func (l *Lifecycle) Settle(ctx context.Context, r *Request, rec Record) (*Request, error) {
	if rec.TraceID == "" {
		rec.TraceID = r.TraceID
	}
	return l.createOrReuse(ctx, r, func(*Request) []Record { return []Record{rec} })
}

// EnsureCard has r's card posted and bound when r is pending without one
// (created before a restart, or posted by a process that stopped before
// binding it: the card writer finds that card rather than posting
// another). When the card cannot be posted or bound the request is
// cancelled (fail closed). It returns the request as it now is.
func (l *Lifecycle) EnsureCard(ctx context.Context, r *Request) *Request {
	if r.Status != StatusPending || r.Card.Bound() || l.cards == nil {
		return r
	}
	cur, err := l.postCard(ctx, r)
	if err == nil {
		return cur
	}
	if ctx.Err() != nil {
		return r // never reject a request because we are stopping
	}
	if errors.Is(err, ErrNotFound) {
		// Gone from the store (Redis lost its data) while its card went
		// up: nothing to cancel. The wait on it reports it lost (Lose).
		return r
	}
	l.log.ErrorContext(ctx, "approval card not posted; cancelling the request", "request_id", r.ID, "tool", r.Tool, "err", err)
	cur, cerr := l.Cancel(ctx, r.ID, "countersign", "the approval card could not be posted")
	if cerr != nil {
		l.log.WarnContext(ctx, "cancel request", "request_id", r.ID, "err", cerr)
		return r
	}
	return cur
}
