package approval

import (
	"context"
	"errors"
	"fmt"
)

// DecideOptions qualify a decision.
type DecideOptions struct {
	// Allow (Approve + allow) pre-authorises further calls like this one
	// when the decision approves the request (Request.Preauthorize long).
	Allow bool
}

// Decide records d on the request before (the clicker's copy), audits it
// (decided, or approval_counted short of the quorum), saves the grant of
// an Approve + allow, wakes the waiting agent when the request became
// final, and refreshes the card. State is the store's. Refusals are returned as the store's wrapped
// sentinels and change nothing (a decision arriving after the deadline
// expires the request, which is audited and shown). With Allow, a grant
// that could not be saved leaves the returned request's Grant nil.
//
// Who may decide is judged here first, for every path that decides
// (MayDecide: approvers, four-eyes, who may grant): a refusal wraps
// ErrNotApprover, ErrSelfApproval, ErrSelfGrant or ErrGrantNotOffered and
// records nothing.
//
// An edit (VerdictEdit) is judged first as a new proposal for the edited
// arguments (Judge): invalid arguments are refused (ErrInvalidArgs), a
// deny rule refuses them (*DenialError, wrapping ErrDenied), and nothing
// is recorded. An edited call that needs more approvals than the request
// asks for raises the request's quorum to what it needs (never lowers
// it); the edit counts as one approval of the edited arguments, so the
// request stays pending until other approvers supply the rest.
//
// What is judged is before; the decision is recorded only while the
// stored request is still the one before is a copy of (its revision,
// Request.Rev, when it has one): a request that changed in between (a
// vote, an escalation, a card bound) is judged again as the store
// answers it is, up to decideTries times, then refused with ErrMoved. So
// a caller may pass a copy it holds (the card writer's) without reading
// the request first.
func (l *Lifecycle) Decide(ctx context.Context, before *Request, d Decision, opts DecideOptions) (*Request, error) {
	for try := 1; ; try++ {
		after, err := l.decideOn(ctx, before, d, opts)
		if !errors.Is(err, ErrMoved) || after == nil || try == decideTries {
			return after, err
		}
		before = after // changed since before was read: judged again as it is
	}
}

// decideTries bounds how often Decide judges a request again that
// changed between its read and its decision (ErrMoved).
const decideTries = 3

// decideOn is one attempt of Decide, judged on before and recorded only
// while the stored request is still before (Decision.Rev): else ErrMoved
// with the request as it is, nothing recorded.
func (l *Lifecycle) decideOn(ctx context.Context, before *Request, d Decision, opts DecideOptions) (*Request, error) {
	d.Quorum, d.Signals, d.Rev = 0, nil, before.Rev
	if err := l.MayDecide(ctx, before, d.Approver, d.Verdict, opts.Allow); err != nil {
		return nil, err
	}
	if d.Verdict == VerdictEdit {
		if err := l.judgeEdit(before, &d); err != nil {
			return nil, err
		}
	}
	if err := l.checkStepUp(ctx, before, d, opts.Allow); err != nil {
		return nil, err
	}
	p := Prepared{
		Entry:   func(after *Request) Record { return l.decidedRecord(before, after, d) },
		Elapsed: deadlineRecord,
		Wake:    true,
		// An Approve + allow saves its grant before the agent wakes, so
		// its next call already sees it.
		Hold: opts.Allow,
	}
	if st, final := finalWith(before, d); final {
		// Expected to make the request final: the store may send the
		// entry with the decision, written only if it did.
		then := *before
		then.Status = st
		p.Guess = &then
	}
	after, err := l.rec.RecordDecision(ctx, d, p)
	return l.decided(ctx, before, d, opts, after, err)
}

// finalWith reports whether d on before is expected to make the request
// final, and with which status: a pending request, anything but an edit,
// an approval only when it completes the quorum on before.
func finalWith(before *Request, d Decision) (Status, bool) {
	if before.Status != StatusPending || before.ID != d.RequestID {
		return "", false
	}
	switch d.Verdict {
	case VerdictApprove:
		return StatusApproved, max(before.Quorum, 1)-len(before.Approvals) <= 1
	case VerdictRunNow:
		return StatusApproved, true
	case VerdictReject, VerdictCancel:
		return StatusRejected, true
	case VerdictRespond:
		return StatusResponded, true
	}
	return "", false
}

// decided is Decide once the store answered d (after, err): refusals
// shown, then the entry (decided, approval_counted, or the review-after
// window's), the grant, the wake-up and the card.
func (l *Lifecycle) decided(ctx context.Context, before *Request, d Decision, opts DecideOptions, after *Request, err error) (*Request, error) {
	var de *DecidedError
	switch {
	case err == nil:
	case errors.Is(err, ErrNotReplicated) && after != nil:
		// Recorded, but perhaps only on a primary a failover is dropping:
		// the clicker is told to decide again rather than that it stands.
		l.refresh(after)
		l.told(after)
		return after, err
	case errors.As(err, &de) && de.Now && after != nil:
		l.refresh(after) // the deadline ended it, audited and woken
		l.told(after)
		return after, err
	case after != nil && (errors.Is(err, ErrStaleArgs) || errors.Is(err, ErrAlreadyDecided) || errors.Is(err, ErrExpired)):
		l.refresh(after) // the clicker saw an old card: show the current one
		return after, err
	default:
		return after, err
	}
	if after.Status == StatusPending {
		l.refresh(after)
		return after, nil
	}
	var werr error
	if opts.Allow && after.Status == StatusApproved {
		after.Grant = l.grant(ctx, after, d)
		werr = l.wake(ctx, after)
	}
	l.refresh(after)
	l.told(after)
	if errors.Is(werr, ErrNotReplicated) {
		return after, fmt.Errorf("decide %s: %w", after.ID, werr)
	}
	return after, nil
}

// decidedRecord is the audit record of decision d, which took the request
// from before to after: decided when after is final, approval_counted
// short of the quorum, the review-after window's run_now or cancelled.
// It carries the request's trace id.
func (l *Lifecycle) decidedRecord(before, after *Request, d Decision) Record {
	ev := EventDecided
	// created and decision_ms let audit stats and the decision-time metric
	// time a decision without finding the request's first entry.
	data := DecidedEvent{Verdict: d.Verdict, Digest: d.Digest, Status: after.Status,
		Created: before.Created, DecisionMS: d.At.Sub(before.Created).Milliseconds(), Text: d.Text, Choice: d.Choice}
	if after.Status == StatusPending {
		ev = EventApprovalVote
		data.Approvals, data.Quorum = len(after.Approvals), max(after.Quorum, 1)
	}
	if d.Verdict == VerdictEdit {
		// The quorum the edit left (raised when the edited call needs
		// more approvals) and what fired for the edited call.
		data.Args, data.OriginalArgs, data.NewDigest = d.Args, before.Args, after.Digest
		data.Approvals, data.Quorum, data.Signals = len(after.Approvals), max(after.Quorum, 1), d.Signals
	}
	rec := Record{Event: ev, RequestID: after.ID, RunID: after.RunID, Actor: d.Approver, Tool: after.Tool, Data: data,
		Secret: l.secret(after.Tool), TraceID: after.TraceID}
	if before.Mode == ModeAfter {
		rec.Event, rec.Data = EventRunNow, WindowDecisionEvent{Verdict: d.Verdict, Reason: d.Text, Digest: d.Digest,
			RunAt: before.Deadline, Created: before.Created, DecisionMS: data.DecisionMS}
		if d.Verdict == VerdictCancel {
			rec.Event = EventCancelled
		}
	}
	return rec
}

// grant saves the pre-authorisation given with d's approval of r and
// audits it; nil when it could not be saved (the approval stands).
func (l *Lifecycle) grant(ctx context.Context, r *Request, d Decision) *Grant {
	g := &Grant{
		ID: NewID("grant"), Tool: r.Tool, Requester: r.Requester, Origin: r.Origin,
		GrantedBy: d.Approver, RequestID: r.ID, Created: d.At, Expires: d.At.Add(r.Preauthorize),
		Limits: r.PreauthorizeLimits,
	}
	if err := l.rec.PutGrant(ctx, g); err != nil {
		l.log.ErrorContext(ctx, "pre-authorisation not saved; the approval stands", "request_id", r.ID, "user", d.Approver, "err", err)
		return nil
	}
	l.append(ctx, r, Record{Event: EventGranted, RequestID: r.ID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool,
		Data: GrantedEvent{GrantID: g.ID, Requester: g.Requester, Channel: g.Origin.Channel, ThreadTS: g.Origin.ThreadTS, Expires: g.Expires}})
	return g
}

// UseGrant lets the call of request requestID run under grant g when g's
// limits allow it: the use is recorded (atomic: two calls can never both
// take the last of a budget), audited as rec (EventPreauthorized, its
// data completed with the grant's use), and the card that granted it
// redrawn to show what is left. It reports false, having changed nothing,
// when the limits do not allow the call; the caller then asks a human.
func (l *Lifecycle) UseGrant(ctx context.Context, g *Grant, requestID string, amount float64, rec Record) (*Grant, bool, error) {
	used, ok, err := l.rec.UseGrant(ctx, g, requestID, amount)
	if err != nil || !ok {
		return nil, false, err
	}
	if ev, isEv := rec.Data.(PreauthorizedEvent); isEv {
		ev.Uses, ev.Spent, ev.Amount = len(used.Uses), used.Spent, amount
		rec.Data = ev
	}
	l.append(ctx, nil, rec)
	if granting, err := l.rec.Request(ctx, g.RequestID); err == nil {
		l.refresh(granting)
	}
	return used, true, nil
}
