package approval

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Claim judges an approved request against the policy in force and, fit
// to run, moves it to executing (at most once across processes), audits
// the execution about to start and redraws the card. It is the claim of
// Countersign's own agent, in-process: no claim token, and the agent
// finishes by owner. Every claim, of every executor, is this one
// judgement (judgeClaim): arguments bound to every approval counted, the
// caller's key, schema, deny rules and quorum as the policy says now.
//
// Refusals come with the request as it now is: a *RefusedError
// (ErrRefused: the judgement refused it, which ended it refused — or it
// was refused before), a *MoreApprovalsError (ErrNeedsApprovals: pending
// again, its card asking for the rest: wait for it and claim again),
// ErrAlreadyClaimed, ErrAbandoned, ErrNotApproved, ErrClaimNotConfirmed;
// ErrNotFound without one.
func (l *Lifecycle) Claim(ctx context.Context, id, owner string) (*Request, error) {
	return l.claim(ctx, id, owner, "")
}

// ClaimToken is Claim for an executor outside this process (an API
// client, the MCP gateway, a HumanLayer caller): the winning claim also
// gets a fresh random claim token, of which only the SHA-256 is kept,
// and FinishClaim then requires it. Every later claim is refused as
// Claim's are, with the request as it now is and no token.
func (l *Lifecycle) ClaimToken(ctx context.Context, id, owner string) (*Request, string, error) {
	token, err := newClaimToken()
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", id, err)
	}
	r, err := l.claim(ctx, id, owner, HashClaimToken(token))
	if err != nil {
		return r, "", err
	}
	return r, token, nil
}

// ClaimRequest is Claim for a claimant that has read the request, as
// approved (known: the record its wait returned): the executing entry is
// built from known before the claim, so that the claim and the entry can
// go to the store together (ClaimingAuditor), one round trip instead of
// two. The entry is written only if the claim took with known's
// arguments (its digest); otherwise it is built from the record claimed,
// as Claim does. known is what the judgement judges (no read): the claim
// takes only while the record's arguments are known's. What is judged,
// recorded, audited and refused is Claim's.
func (l *Lifecycle) ClaimRequest(ctx context.Context, known *Request, owner string) (*Request, error) {
	return l.claimKnown(ctx, known.ID, owner, "", known)
}

// ClaimTokenRequest is ClaimToken for a claimant that has read the
// request (ClaimRequest).
func (l *Lifecycle) ClaimTokenRequest(ctx context.Context, known *Request, owner string) (*Request, string, error) {
	token, err := newClaimToken()
	if err != nil {
		return nil, "", fmt.Errorf("claim %s: %w", known.ID, err)
	}
	r, err := l.claimKnown(ctx, known.ID, owner, HashClaimToken(token), known)
	if err != nil {
		return r, "", err
	}
	return r, token, nil
}

// claim is the one door of all four: judge (claimKnown), record
// (tokenHash on it), audit executing, card.
func (l *Lifecycle) claim(ctx context.Context, id, owner, tokenHash string) (*Request, error) {
	return l.claimKnown(ctx, id, owner, tokenHash, nil)
}

// claimTries bounds how often a claim judges again a request whose
// arguments changed between the read it judged and the claim (an edit
// after a reopen): each round judges the record the store returned.
const claimTries = 3

// claimKnown is claim, for the request known as the claimant read it (nil:
// read here). It judges the request first (judgeClaim: the policy in
// force, in memory, no round trip): refused, the request ends refused
// (refuseRun); short of approvals, it goes back to pending (reopen);
// otherwise it is claimed only while its arguments are still the ones
// judged (the store's digest guard), with the executing entry sent with
// the claim when the Auditor can.
func (l *Lifecycle) claimKnown(ctx context.Context, id, owner, tokenHash string, known *Request) (*Request, error) {
	r := known
	for try := 1; ; try++ {
		if r == nil || r.ID != id {
			cur, err := l.rec.Request(ctx, id)
			if err != nil {
				return nil, err
			}
			r = cur
		}
		if r.Status != StatusApproved {
			return r, unclaimable(r)
		}
		var (
			cur *Request
			err error
		)
		switch j := l.judgeClaim(r); {
		case j.refused != nil:
			cur, err = l.refuseRun(ctx, r, j.refused)
		case j.more != nil:
			cur, err = l.reopen(ctx, r, j.more)
		default:
			cur, err = l.claimJudged(ctx, r, owner, tokenHash)
		}
		if errors.Is(err, ErrStaleArgs) && cur != nil && try < claimTries {
			r = cur // changed since it was read: judge it as it is
			continue
		}
		return cur, err
	}
}

// claimJudged claims r, judged fit to run, while its digest is the one
// judged, and audits the execution it lets start.
func (l *Lifecycle) claimJudged(ctx context.Context, r *Request, owner, tokenHash string) (*Request, error) {
	// The entry is r's: a claim takes only while the record's arguments
	// are r's, and nothing else it shows changes.
	exec := l.executingRecord(r, owner, false)
	guess := *r
	guess.Status = StatusExecuting
	got, err := l.rec.Claim(ctx, r.ID, owner, tokenHash, r.Digest, Prepared{Entry: entry(exec), Guess: &guess})
	if err != nil {
		return got, err
	}
	l.refresh(got)
	return got, nil
}

// refuseRun ends r, which the judgement at its claim refused, as refused:
// recorded, audited (call_refused, with the rule), its waiters woken, its
// card and thread told why, OnFinal told. It returns the request as it
// now is and the refusal (or the store's own refusal: r changed first).
func (l *Lifecycle) refuseRun(ctx context.Context, r *Request, e *RefusedError) (*Request, error) {
	actor := "gate"
	if ed := EditOf(r); ed != nil && e.Code == RefusedInvalidArgs {
		actor = ed.Approver
	}
	rec := Record{Event: EventCallRefused, RequestID: r.ID, RunID: r.RunID, Actor: actor, Tool: r.Tool, TraceID: r.TraceID,
		Data: CallErrorEvent{CallID: r.CallID, Error: e.Reason, DenyRule: e.Rule, Args: r.Args}, Secret: l.secret(r.Tool)}
	cur, err := l.rec.Refuse(ctx, r.ID, r.Digest, e.Reason, Prepared{Entry: entry(rec), Wake: true})
	if err != nil {
		return cur, err
	}
	l.log.WarnContext(ctx, "approved request refused at its claim by the policy in force", "request_id", r.ID, "tool", r.Tool, "code", e.Code, "rule", e.Rule)
	l.refresh(cur)
	l.told(cur)
	return cur, fmt.Errorf("claim %s: %w", r.ID, e)
}

// reopen takes r, approved but short of the approvals the policy in force
// asks of its arguments, back to pending: recorded (quorum raised, a new
// deadline as long as its first), audited (reopened), its card redrawn to
// ask for the rest and say why. It returns the request as it now is and
// the judgement (or the store's own refusal: r changed first).
func (l *Lifecycle) reopen(ctx context.Context, r *Request, m *MoreApprovalsError) (*Request, error) {
	now := l.now().UTC()
	ro := Reopening{At: now, Need: m.Need, Have: m.Have, Reason: m.Reason}
	if !r.Deadline.IsZero() {
		ro.Deadline = now.Add(max(r.Deadline.Sub(r.Created), time.Minute))
	}
	rec := Record{Event: EventReopened, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool, TraceID: r.TraceID,
		Data: ReopenedEvent{Need: m.Need, Have: m.Have, Reason: m.Reason, Deadline: ro.Deadline}}
	cur, err := l.rec.Reopen(ctx, r.ID, r.Digest, ro, Prepared{Entry: entry(rec)})
	if err != nil {
		return cur, err
	}
	l.log.InfoContext(ctx, "approved request pending again: the policy in force asks more approvals", "request_id", r.ID, "tool", r.Tool, "need", m.Need, "have", m.Have)
	l.refresh(cur)
	return cur, fmt.Errorf("claim %s: %w", r.ID, m)
}

// FinishClaim records the outcome reported by the holder of the claim
// token of request id (ClaimToken): the token is checked against the
// record in constant time, then the outcome is recorded as Finish does.
// Refusals: ErrClaimToken (another claim's token, or none), ErrNotClaimed
// (approved, nobody claimed it), ErrAlreadyClaimed (an outcome is
// recorded already), ErrAbandoned, ErrNotApproved, ErrNotFound; each but
// the last with the request as it now is.
func (l *Lifecycle) FinishClaim(ctx context.Context, id, token, owner string, o Outcome) (*Request, error) {
	r, err := l.rec.Request(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ClaimTokenMatches(r.ClaimHash, token) {
		switch r.Status {
		case StatusApproved:
			return r, fmt.Errorf("finish %s: %w", id, ErrNotClaimed)
		case StatusAbandoned:
			return r, fmt.Errorf("finish %s: %w", id, ErrAbandoned)
		case StatusExecuting, StatusExecuted, StatusFailed, StatusUnknown:
			return r, fmt.Errorf("finish %s: %w", id, ErrClaimToken)
		}
		return r, fmt.Errorf("finish %s: status %s: %w", id, r.Status, ErrNotApproved)
	}
	// The token hash is written once, by the one claim that won, so the
	// token matching here still names the claim Finish ends.
	done, err := l.Finish(ctx, id, owner, o)
	if err != nil {
		if cur, rerr := l.rec.Request(ctx, id); rerr == nil {
			return cur, err
		}
	}
	return done, err
}

// Executing audits that r's tool starts running by owner; retry says it
// runs again after a process stopped mid-execution (retry-safe tools
// only). Claim calls it; call it directly only for such a retry.
func (l *Lifecycle) Executing(ctx context.Context, r *Request, owner string, retry bool) {
	l.append(ctx, r, l.executingRecord(r, owner, retry))
	l.refresh(r)
}

// executingRecord is the audit record of r's tool starting to run by
// owner (Executing), with r's trace id.
func (l *Lifecycle) executingRecord(r *Request, owner string, retry bool) Record {
	return Record{Event: EventExecuting, RequestID: r.ID, RunID: r.RunID, Actor: owner, Tool: r.Tool,
		Data: ExecutingEvent{CallID: r.CallID, Args: r.Args, Gated: true, Retry: retry}, Secret: l.secret(r.Tool), TraceID: r.TraceID}
}
