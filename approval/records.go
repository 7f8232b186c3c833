package approval

import (
	"context"
	"time"
)

// Records is the durable record of requests and their audit, as the
// lifecycle owner needs it (store.Ledger implements it). A transition is
// one method: it changes the record atomically, writes the transition's
// audit entry (Prepared) behind it and, when the transition asks for it,
// pushes the request's wake-up behind the entry — record → audit →
// wake-up, whatever the topology. How many round trips that takes is the
// store's business (one where one script call can hold them, more on a
// Cluster or with replicas to confirm); the lifecycle has one path.
//
// Refusals are wrapped sentinels and write nothing; any other error is
// the store failing. An audit entry that cannot be written does not undo
// a transition that took: the store logs it (one line naming the
// request) and the method reports the transition.
type Records interface {
	// Request returns the stored request, or ErrNotFound.
	Request(ctx context.Context, id string) (*Request, error)
	// Append writes audit entries that are no transition of a request's
	// record (assessed, card_posted, decision_refused, executing of a
	// direct call…), in order, in one round trip where the store can.
	Append(ctx context.Context, rs ...Record) error
	// AppendNew writes rs as Append does, only while no request has id:
	// the entries of a call settled without a request (let through or
	// refused by the gate) whose id names the call, which a call sent
	// again that has a request must not get. When one has id: that
	// request and ErrExists, nothing written. One round trip where the
	// store can check and write in one.
	AppendNew(ctx context.Context, id string, rs ...Record) (*Request, error)
	// CreateRequest saves a new pending (or settled, or sampled) request,
	// filling in what store.Store.CreateRequest fills in, and then writes
	// entries(r) (nil: none), in order; ErrExists when the id is taken
	// (nothing written).
	CreateRequest(ctx context.Context, r *Request, entries func(r *Request) []Record) error
	// RecordDecision records one human decision (see
	// store.Store.RecordDecision for its semantics) and audits it
	// (p.Entry; p.Elapsed when the call found the deadline passed and
	// ended the request itself, then the request is expired or, at the
	// end of a cancel window, approved). Refusals: *DecidedError (with Now
	// set in that last case), ErrAlreadyVoted, ErrVerdictNotAllowed,
	// ErrStaleArgs, ErrNotFound. An error wrapping ErrNotReplicated comes
	// with the request decided: recorded, but not confirmed by replicas.
	RecordDecision(ctx context.Context, d Decision, p Prepared) (*Request, error)
	// RecordExpiries expires every pending request due at now, approves
	// (VerdictWindowElapsed) every review-after request whose cancel window
	// ended, abandons (StatusAbandoned) every approved request whose claim
	// window (Request.ClaimWindow, from its approval) ended unclaimed, and
	// returns those this call changed (each exactly once across
	// processes), each audited with p.Elapsed and woken.
	RecordExpiries(ctx context.Context, now time.Time, p Prepared) ([]*Request, error)
	// RecordCancel ends a pending request without a human decision;
	// *DecidedError when it is already final.
	RecordCancel(ctx context.Context, id, by, reason string, p Prepared) (*Request, error)
	// Claim moves an approved request to executing at most once,
	// recording owner and tokenHash (the hex SHA-256 of the claim token;
	// "" for an in-process claim without one). Every later claim is
	// refused with the record as it now is: ErrAlreadyClaimed (executing
	// or finished), ErrAbandoned, ErrNotApproved (pending, rejected…);
	// ErrNotFound without one. A store that confirms writes on replicas
	// refuses a claim they did not confirm with ErrClaimNotConfirmed,
	// withdrawn: nothing may run on it, and it may be claimed again.
	// With digest set, only a request whose digest is still digest is
	// claimed (the arguments the claim judged); another is refused with
	// ErrStaleArgs and the record as it is.
	Claim(ctx context.Context, id, owner, tokenHash, digest string, p Prepared) (*Request, error)
	// Refuse ends an approved request whose digest is digest as refused,
	// why its Result: the judgement at its claim refused it, so it never
	// runs. A request not approved is refused as Claim refuses it, one
	// with another digest with ErrStaleArgs, each with the record as it
	// is; ErrNotFound without one.
	Refuse(ctx context.Context, id, digest, why string, p Prepared) (*Request, error)
	// Reopen takes an approved request whose digest is digest back to
	// pending, because the policy in force asks more approvals of its
	// arguments: its quorum raised to ro.Need (never lowered), the
	// approvals counted kept (each approver still counts once), its
	// deadline ro.Deadline, ro recorded as Request.Reopened, and indexed
	// as pending again. Refusals as Refuse's.
	Reopen(ctx context.Context, id, digest string, ro Reopening, p Prepared) (*Request, error)
	// Finish records the outcome of an executing request.
	Finish(ctx context.Context, id string, st Status, result string, p Prepared) (*Request, error)
	// RecordFeedback records f on a final request (Request.Markable):
	// ErrNotFinal when it is not, ErrAlreadyMarked when it is already
	// marked wrong (or already reviewed, for a "looks right"),
	// ErrNotFound.
	RecordFeedback(ctx context.Context, id string, f Feedback, p Prepared) (*Request, error)
	// PutGrant saves a pre-authorisation and records it on its request.
	PutGrant(ctx context.Context, g *Grant) error
	// UseGrant counts one use of grant g by the call of request
	// requestID, adding amount to its total, atomically across processes:
	// it returns the grant as now used and true, or false (nothing
	// counted) when the grant is gone, replaced, or a limit would be
	// passed. The same request counted again is not counted twice.
	UseGrant(ctx context.Context, g *Grant, requestID string, amount float64) (*Grant, bool, error)
	// Wake pushes the wake-up of a request that became final, for a
	// transition whose wake-up its caller held back (Prepared.Hold); an
	// error wrapping ErrNotReplicated when the store could not confirm
	// that its replicas have the transition.
	Wake(ctx context.Context, id string, st Status) error
	// CardBindings records where each request's card is (approval/cards.go).
	CardBindings
	// Upkeep records reminders, escalations and revoked grants.
	Upkeep
}

// Prepared is what a transition writes behind the record: its audit
// entry, built by the lifecycle, and whether the request's waiters are
// woken.
type Prepared struct {
	// Entry builds the transition's entry from the request as the
	// transition left it; nil writes none.
	Entry func(after *Request) Record
	// Guess, when set, is the request as the lifecycle expects the
	// transition to leave it (its status and digest): the store may then
	// send Entry(Guess) with the transition in one round trip, written
	// only if the outcome is the guessed one; otherwise the entry is
	// built from the request as it is. It never changes what is written.
	Guess *Request
	// Elapsed builds the entry of a request the transition found past its
	// deadline and ended itself (expired, a cancel window's end approved
	// it, a claim window's end abandoned it).
	Elapsed func(after *Request) Record
	// Wake pushes the wake-up of a request the transition made final,
	// behind its entry.
	Wake bool
	// Hold leaves the wake-up of a request the transition approved to
	// the caller (Records.Wake), who has something to save first (the
	// grant of an Approve + allow); other final outcomes are woken.
	Hold bool
}

// Auditor appends to the audit stream: a surface's own entries (an HTTP
// call refused before any door, a webhook delivered), none of them a
// transition of a request's record.
type Auditor interface {
	Append(ctx context.Context, r Record) (Entry, error)
}
