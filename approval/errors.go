package approval

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Refusals of a click are returned as these (wrapped); a
// human "no" is never an error, it is a Decision.
var (
	ErrNotFound          = errors.New("approval: not found")
	ErrExists            = errors.New("approval: already exists")
	ErrAlreadyDecided    = errors.New("approval: already decided")
	ErrExpired           = errors.New("approval: expired")
	ErrNotApprover       = errors.New("approval: not an approver")
	ErrSelfApproval      = errors.New("approval: requester may not decide their own request")
	ErrAlreadyVoted      = errors.New("approval: already approved by this approver")
	ErrVerdictNotAllowed = errors.New("approval: decision not allowed for this tool")
	ErrStaleArgs         = errors.New("approval: arguments changed since they were shown")
	// ErrMoved refuses a decision conditional on a revision of the
	// request (Decision.Rev) that is no longer the stored one: something
	// changed it since that copy was read. Nothing was recorded; the
	// store hands back the record as it is, to be judged again.
	ErrMoved          = errors.New("approval: the request changed since it was read")
	ErrInvalidArgs    = errors.New("approval: invalid arguments")
	ErrUnknownTool    = errors.New("approval: unknown tool")
	ErrAlreadyClaimed = errors.New("approval: execution already claimed")
	ErrNotApproved    = errors.New("approval: not approved")
	// ErrAbandoned refuses a claim of a request that was approved but
	// not claimed within its claim window (the caller had gone): nothing
	// ran and nothing may.
	ErrAbandoned = errors.New("approval: abandoned: not claimed within the claim window")
	// ErrNotClaimed refuses an outcome for an approved request that
	// nobody claimed: claim it first (Lifecycle.ClaimToken).
	ErrNotClaimed = errors.New("approval: not claimed")
	// ErrClaimToken refuses an outcome whose claim token is not the one
	// the winning claim was given.
	ErrClaimToken = errors.New("approval: wrong claim token")
	// ErrNotFinal refuses feedback on a request that is not settled yet
	// (pending, approved but not run, running) or that no person decided
	// (expired, cancelled by the system).
	ErrNotFinal = errors.New("approval: not final")
	// ErrAlreadyMarked refuses a second mark as wrong, or a "looks right"
	// on a request already reviewed.
	ErrAlreadyMarked = errors.New("approval: already marked")
	// ErrLeaseLost: a process wrote to, or ran, a run it no longer owns:
	// its lease lapsed and (possibly) another process adopted the run.
	ErrLeaseLost = errors.New("approval: run lease lost")
	// ErrNotReplicated: a decision was recorded but the store could not
	// confirm that its replicas have it (Redis failing over, or a replica
	// lagging). It may stand or be lost with the old primary; deciding
	// again settles it (the decision is found, or recorded anew).
	ErrNotReplicated = errors.New("approval: decision not confirmed by a replica")
	// ErrClaimNotConfirmed: a claim the store could not confirm on its
	// replicas (Redis failing over, or a replica lagging) was withdrawn:
	// a failover could have lost it and let another process claim and
	// run the request too. Nothing may run on it; claiming again settles
	// it (the request is claimed anew, or found claimed by another).
	ErrClaimNotConfirmed = errors.New("approval: claim not confirmed by a replica, withdrawn")
	// ErrRefused: the judgement at a claim refused to run an approved
	// request (a *RefusedError says why): the request is refused now,
	// nothing ran and nothing will.
	ErrRefused = errors.New("approval: refused at its claim by the policy in force")
	// ErrNeedsApprovals: the judgement at a claim found that the policy
	// in force asks more approvals of the request's arguments than it has
	// (a *MoreApprovalsError says how many): the request is pending
	// again, its card asks for the rest, and nothing may run yet.
	ErrNeedsApprovals = errors.New("approval: the policy in force asks more approvals")
	// ErrSelfGrant refuses Approve + allow by anyone who asked for the
	// request: nobody pre-authorises their own calls.
	ErrSelfGrant = errors.New("approval: a requester cannot pre-authorise their own calls")
	// ErrGrantNotOffered refuses Approve + allow on a request whose
	// policy offers no pre-authorisation (or that needs more than one
	// approval).
	ErrGrantNotOffered = errors.New("approval: pre-authorisation not offered for this request")
)

// DecidedError is returned (wrapping ErrAlreadyDecided or ErrExpired) when a
// decision arrives for a request that is already final. It says who decided
// and when, so the loser of a race can be told.
type DecidedError struct {
	RequestID string
	Status    Status
	By        string
	At        time.Time
	// Now is set when the decision arrived after the deadline and this
	// very call expired the request (the caller audits the expiry).
	Now bool
}

func (e *DecidedError) Error() string {
	if e.Status == StatusExpired {
		return fmt.Sprintf("request %s expired at %s", e.RequestID, e.At.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("request %s already %s by %s at %s", e.RequestID, e.Status, e.By, e.At.UTC().Format(time.RFC3339))
}

// NewDecidedError describes a final request r for the loser of a race: who
// decided it and when.
func NewDecidedError(r *Request) *DecidedError {
	e := &DecidedError{RequestID: r.ID, Status: r.Status}
	if r.Decision != nil {
		e.By, e.At = r.Decision.Approver, r.Decision.At
	}
	return e
}

// Unwrap makes errors.Is(err, ErrAlreadyDecided) (or ErrExpired) hold.
func (e *DecidedError) Unwrap() error {
	if e.Status == StatusExpired {
		return ErrExpired
	}
	return ErrAlreadyDecided
}

// RefusedError is the judgement at a claim that refused to run an
// approved request (it wraps ErrRefused): a stable Code for machines —
// args_changed, invalid_args, denied, tool_not_allowed, unknown_tool,
// not_judged, or refused for a request refused before — the deny Rule when
// one refused it, and Reason in plain words.
type RefusedError struct {
	RequestID string
	Code      string
	Rule      string
	Reason    string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("request %s refused at its claim (%s): %s", e.RequestID, e.Code, e.Reason)
}

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// MoreApprovalsError is the judgement at a claim that the policy in force
// asks Need approvals of the request's arguments and it has Have (it
// wraps ErrNeedsApprovals): the request went back to pending.
type MoreApprovalsError struct {
	RequestID  string
	Need, Have int
	Reason     string
}

func (e *MoreApprovalsError) Error() string {
	return fmt.Sprintf("request %s needs %d approvals and has %d: %s", e.RequestID, e.Need, e.Have, e.Reason)
}

// Unwrap makes errors.Is(err, ErrNeedsApprovals) hold.
func (e *MoreApprovalsError) Unwrap() error { return ErrNeedsApprovals }
