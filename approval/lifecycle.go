package approval

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// Records is the durable record of requests as the lifecycle owner needs
// it (store.Store implements it). Every method changes the record
// atomically and wakes nobody: the owner pushes the wake-up itself, after
// the audit entry, with Wake. Refusals are wrapped sentinels; any other
// error is the store failing.
type Records interface {
	// CreateRequest saves a new pending request; ErrExists when the id is
	// taken.
	CreateRequest(ctx context.Context, r *Request) error
	// Request returns the stored request, or ErrNotFound.
	Request(ctx context.Context, id string) (*Request, error)
	// RecordDecision records one human decision (see
	// store.Store.RecordDecision for its semantics). Refusals: *DecidedError (with Now set when this
	// call found the deadline passed and expired the request, or ended its
	// cancel window: then the request is approved),
	// ErrAlreadyVoted, ErrVerdictNotAllowed, ErrStaleArgs, ErrNotFound.
	RecordDecision(ctx context.Context, d Decision) (*Request, error)
	// RecordExpiries expires every pending request due at now, approves
	// (VerdictWindowElapsed) every review-after request whose cancel window
	// ended, abandons (StatusAbandoned) every approved request whose claim
	// window (Request.ClaimWindow, from its approval) ended unclaimed, and
	// returns those this call changed (each exactly once across
	// processes).
	RecordExpiries(ctx context.Context, now time.Time) ([]*Request, error)
	// RecordCancel ends a pending request without a human decision;
	// *DecidedError when it is already final.
	RecordCancel(ctx context.Context, id, by, reason string) (*Request, error)
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
	Claim(ctx context.Context, id, owner, tokenHash, digest string) (*Request, error)
	// Refuse ends an approved request whose digest is digest as refused,
	// why its Result: the judgement at its claim refused it, so it never
	// runs. A request not approved is refused as Claim refuses it, one
	// with another digest with ErrStaleArgs, each with the record as it
	// is; ErrNotFound without one.
	Refuse(ctx context.Context, id, digest, why string) (*Request, error)
	// Reopen takes an approved request whose digest is digest back to
	// pending, because the policy in force asks more approvals of its
	// arguments: its quorum raised to ro.Need (never lowered), the
	// approvals counted kept (each approver still counts once), its
	// deadline ro.Deadline, ro recorded as Request.Reopened, and indexed
	// as pending again. Refusals as Refuse's.
	Reopen(ctx context.Context, id, digest string, ro Reopening) (*Request, error)
	// Finish records the outcome of an executing request.
	Finish(ctx context.Context, id string, st Status, result string) (*Request, error)
	// PutGrant saves a pre-authorisation and records it on its request.
	PutGrant(ctx context.Context, g *Grant) error
	// UseGrant counts one use of grant g by the call of request
	// requestID, adding amount to its total, atomically across processes:
	// it returns the grant as now used and true, or false (nothing
	// counted) when the grant is gone, replaced, or a limit would be
	// passed. The same request counted again is not counted twice.
	UseGrant(ctx context.Context, g *Grant, requestID string, amount float64) (*Grant, bool, error)
	// Wake pushes the wake-up of a request that became final; an error
	// wrapping ErrNotReplicated when the store could not confirm that its
	// replicas have the transition.
	Wake(ctx context.Context, id string, st Status) error
	// RecordFeedback records f on a final request (Request.Markable):
	// ErrNotFinal when it is not, ErrAlreadyMarked when it is already
	// marked wrong (or already reviewed, for a "looks right"),
	// ErrNotFound.
	RecordFeedback(ctx context.Context, id string, f Feedback) (*Request, error)
	// CardBindings records where each request's card is (approval/cards.go).
	CardBindings
	// Upkeep records reminders, escalations and revoked grants.
	Upkeep
}

// Auditor appends to the audit stream.
type Auditor interface {
	Append(ctx context.Context, r Record) (Entry, error)
}

// WakingAuditor is an Auditor that can push the wake-up of a request that
// became final in the same round trip as the entry that must come before
// it (store.Audit on a single node). The lifecycle uses it when its
// Auditor has it.
type WakingAuditor interface {
	Auditor
	// AppendWake appends r, then pushes the wake-up of request id (final
	// with status st) only once the entry is in the stream. woke false:
	// the wake-up was not pushed, and the caller pushes it (Records.Wake).
	// The error is Append's.
	AppendWake(ctx context.Context, r Record, id string, st Status) (e Entry, woke bool, err error)
}

// ClaimingAuditor is an Auditor that can also claim a request and append
// the entry of the execution it lets start in one round trip
// (store.Audit on a single node). The lifecycle uses it when its Auditor
// has it and the claimant knows the request (ClaimRequest).
type ClaimingAuditor interface {
	Auditor
	// ClaimAppend claims request id for owner as Records.Claim does
	// (tokenHash as there: "" for an in-process claim), and appends r
	// behind the claim only if the claim took and the request's digest is
	// still digest. appended false with no error: the claim took but r
	// was not appended (another writer moved the chain, the digest
	// differs, or the two cannot share a round trip here), and the
	// caller appends it from the record claimed. A refused claim is
	// Claim's error; ErrCannotClaim: this auditor cannot claim at all
	// (nothing was done).
	ClaimAppend(ctx context.Context, r Record, id, owner, tokenHash, digest string) (claimed *Request, e Entry, appended bool, err error)
}

// DecidingAuditor is an Auditor that can also record a decision, append
// the entry of the request it makes final and push the request's wake-up
// behind that entry in one round trip (store.Audit on a single node). The
// lifecycle uses it when its Auditor has it, for a decision it expects to
// make the request final (Decide).
type DecidingAuditor interface {
	Auditor
	// DecideAppendWake records d as Records.RecordDecision does; after
	// and err are RecordDecision's. Behind it, r is appended (as e) only if that
	// very decision made the request final and the request's digest is
	// digest (r describes the request as final with status st), and the
	// wake-up (final with st) is pushed only once r is in the stream.
	// appended false: the decision (if recorded) has no entry yet and the
	// caller appends it from after, and pushes the wake-up; woke false
	// with appended: the caller pushes the wake-up. ErrCannotDecide: this
	// auditor cannot record decisions at all (nothing was done).
	DecideAppendWake(ctx context.Context, d Decision, r Record, st Status, digest string) (after *Request, e Entry, appended, woke bool, err error)
}

// Cards is the one writer of approval cards (the Slack bot). It talks to
// Slack only: where a card is, and whether it is a request's card, is the
// lifecycle's record (Lifecycle.BindCard), never the writer's.
type Cards interface {
	// Post posts r's card and returns where it is, writing no record:
	// the lifecycle binds it at once. With again (an earlier attempt
	// may have posted it: a process stopped between posting and
	// binding) it first looks for that card and, found, returns it
	// instead of posting a second one (found true). An error means no
	// card is up: the caller fails closed.
	Post(ctx context.Context, r *Request, again bool) (c CardRef, found bool, err error)
	// Posted is told once the card Post posted is bound (r.Card): the
	// writer tells r's task thread that r waits and for whom (nothing
	// for a request without a task thread, nor for a sampled call, whose
	// run told it). Failures are the writer's to log: the card is up.
	Posted(ctx context.Context, r *Request)
	// Delete removes c, a message posted as r's card that is not r's
	// card (a second card, or one that could not be bound). Failures
	// are the writer's to log: an unbound card decides nothing.
	Delete(ctx context.Context, r *Request, c CardRef)
	// Refresh asks for r's card (and its task thread) to show r's latest
	// durable state. It returns at once; redraws are serialised and
	// coalesced per card and rendered from the record at send time. r is
	// the caller's latest copy, used when the record itself is gone.
	Refresh(r *Request)
}

// Schemas validates a call's arguments against its tool's JSON Schema
// (policyfile.File implements it: the JSON Schema library's one home).
type Schemas interface {
	// ValidateCall checks args against tool's schema: the policy's for a
	// declared tool, else inputSchema (its caller's) when one is given.
	// The error wraps ErrInvalidArgs and says in plain words what is
	// wrong (an *policyfile.ArgsError lists the fields); nil when valid
	// or when there is no schema to check.
	ValidateCall(tool string, inputSchema, args json.RawMessage) error
}

// LifecycleOptions configure a Lifecycle. Records and Audit are required;
// Cards may be set later with SetCards (the bot and the lifecycle need each
// other).
type LifecycleOptions struct {
	Records Records
	Audit   Auditor
	Cards   Cards
	// Gate judges proposals, and every edit again as a new proposal.
	Gate *Gate
	// Schemas validates arguments, proposed and edited.
	Schemas Schemas
	// Memory keeps ask-once approvals and pre-authorisations; default
	// Records when it implements Memory (store.Store does), else none:
	// every call that needs a person then asks one.
	Memory Memory
	// Scopes says which tools an outside caller's key may ask for under
	// the policy in force, asked again at every claim; nil: keys are not
	// checked at claims (a process with no HTTP API).
	Scopes Scopes
	// Directory answers who is in a usergroup or the approvals channel
	// when a person decides (Decide, MayDecide: Authorize); nil: only
	// approvers listed by user id are admitted.
	Directory Directory
	// Secret names, per tool, the argument properties audited redacted.
	Secret func(tool string) []string
	// Now is the clock, default time.Now.
	Now func() time.Time
	// ClaimWindow is how long an approved request of an outside caller
	// (Request.Caller: an API key, the MCP gateway, a HumanLayer SDK)
	// waits to be claimed before it ends abandoned, default
	// DefaultClaimWindow (the policy file's api.claim_window). The
	// agent's own requests have none: their runs are durable and adopted.
	ClaimWindow time.Duration
	// Ticker makes the ticker RunExpiry waits on, default time.NewTicker.
	Ticker func(d time.Duration) (c <-chan time.Time, stop func())
	// Sleep waits between attempts to bind a posted card through a
	// store blip, default clock.Sleep.
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger receives operator detail, default discard.
	Logger *slog.Logger
	// OnFinal, when set, is told of every request this process made final
	// (decided, expired, cancelled), after its audit entry and wake-up.
	// Each transition happens in exactly one process, so across replicas
	// it is told once per request. It must return at once (queue any
	// work); the HTTP API's webhooks are sent from it.
	OnFinal func(r *Request)
}

// Lifecycle is the one owner of every request's transitions: create,
// decide (each vote, a cancel or run now in a cancel window), expire (or
// end a cancel window), cancel, claim, finish, lose, record a sampled call,
// and the feedback after the fact (mark as wrong). Whatever the
// source (a click, the agent, the sweeper), each transition goes the same
// way: durable record (atomic) → audit entry → wake-up → card refresh.
// It is safe for concurrent use.
type Lifecycle struct {
	rec         Records
	claimWindow time.Duration
	audit       Auditor
	cards       Cards
	gate        *Gate
	schemas     Schemas
	scopes      Scopes
	dir         Directory
	memory      Memory
	secret      func(string) []string
	now         func() time.Time
	ticker      func(time.Duration) (<-chan time.Time, func())
	sleep       func(context.Context, time.Duration) error
	log         *slog.Logger
	final       func(*Request)
	stepUps     StepUps // approval/stepup.go
}

// NewLifecycle returns the lifecycle owner.
func NewLifecycle(opts LifecycleOptions) (*Lifecycle, error) {
	if err := cmp.Or(
		option.Required("approval: LifecycleOptions.Records", opts.Records == nil),
		option.Required("approval: LifecycleOptions.Audit", opts.Audit == nil),
	); err != nil {
		return nil, err
	}
	l := &Lifecycle{rec: opts.Records, audit: opts.Audit, cards: opts.Cards, gate: opts.Gate, schemas: opts.Schemas, scopes: opts.Scopes, dir: opts.Directory, memory: opts.Memory, secret: opts.Secret,
		now: opts.Now, ticker: opts.Ticker, sleep: opts.Sleep, log: opts.Logger, final: opts.OnFinal, claimWindow: option.PositiveOr(opts.ClaimWindow, DefaultClaimWindow)}
	if l.memory == nil {
		l.memory, _ = opts.Records.(Memory)
	}
	l.secret = option.FuncOr(l.secret, func(string) []string { return nil })
	l.now = option.FuncOr(l.now, time.Now)
	l.ticker = option.FuncOr(l.ticker, clock.NewTicker)
	l.sleep = option.FuncOr(l.sleep, clock.Sleep)
	l.log = cmp.Or(l.log, slog.New(slog.DiscardHandler))
	return l, nil
}

// SetCards sets the card writer. Call it once, before any transition.
func (l *Lifecycle) SetCards(c Cards) { l.cards = c }

// SetDirectory sets the directory a decision's judgement asks
// (LifecycleOptions.Directory; the bot, built after the lifecycle). Call
// it once, before any decision.
func (l *Lifecycle) SetDirectory(d Directory) { l.dir = d }

// Request returns the stored request, or ErrNotFound.
func (l *Lifecycle) Request(ctx context.Context, id string) (*Request, error) {
	return l.rec.Request(ctx, id)
}

// Create saves a new pending request, audits it and has its card posted
// and bound. When the id exists (a run resumed after a restart) the stored
// request is the truth: its card is posted only if it has none. A card
// that cannot be posted cancels the request (fail closed); the returned
// request then says so. An error means the request could not be saved.
func (l *Lifecycle) Create(ctx context.Context, r *Request) (*Request, error) {
	if r.Caller.External() && r.ClaimWindow <= 0 {
		r.ClaimWindow = l.claimWindow
	}
	err := l.rec.CreateRequest(ctx, r)
	switch {
	case errors.Is(err, ErrExists):
		stored, err := l.rec.Request(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		return l.EnsureCard(ctx, stored), nil
	case err != nil:
		return nil, err
	}
	actor := "agent"
	if r.Caller.External() {
		actor = r.Caller.Kind + ":" + r.Caller.Name
	}
	l.append(ctx, r, Record{Event: EventRequested, RequestID: r.ID, RunID: r.RunID, Actor: actor, Tool: r.Tool,
		Data: RequestedEvent{CallID: r.CallID, Args: r.Args, Digest: r.Digest, Deadline: r.Deadline, Quorum: r.Quorum,
			Signals: r.Signals, Preview: r.Preview, PreviewError: r.Preview.Error, Decisions: r.Decisions,
			Created: r.Created, Reason: r.Reason, Confidence: r.Confidence, Requester: r.Requester, Requesters: multiple(r.Askers()), Kind: r.Kind, Choices: r.Choices}, Secret: l.secret(r.Tool)})
	if r.Mode == ModeAfter {
		l.append(ctx, r, Record{Event: EventScheduled, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool,
			Data: ScheduledEvent{RunAt: r.Deadline, WindowMS: r.Deadline.Sub(r.Created).Milliseconds()}})
	}
	return l.EnsureCard(ctx, r), nil
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
	err := l.rec.CreateRequest(ctx, r)
	switch {
	case errors.Is(err, ErrExists):
		stored, err := l.rec.Request(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		r = stored
	case err != nil:
		return nil, err
	default:
		l.append(ctx, r, Record{Event: EventSampled, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool,
			Data: SampledEvent{CallID: r.CallID, Args: r.Args, Digest: r.Digest, Preview: r.Preview, Status: r.Status,
				Result: clip.Bytes(r.Result, maxAuditResult), Rate: rate, Created: r.Created, Requester: r.Requester}, Secret: l.secret(r.Tool)})
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
	err := l.rec.CreateRequest(ctx, r)
	switch {
	case errors.Is(err, ErrExists):
		return l.rec.Request(ctx, r.ID)
	case err != nil:
		return nil, err
	}
	l.append(ctx, r, rec)
	return r, nil
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
func (l *Lifecycle) Decide(ctx context.Context, before *Request, d Decision, opts DecideOptions) (*Request, error) {
	d.Quorum, d.Signals = 0, nil
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
	if da, ok := l.audit.(DecidingAuditor); ok && !opts.Allow {
		if st, final := finalWith(before, d); final {
			// Expected to make the request final: the decision, its entry
			// and the wake-up in one round trip. The entry is built from
			// before as the request would be with st, and written only if
			// the decision did make it final (else it is built below from
			// the request as it is).
			then := *before
			then.Status = st
			rec := l.decidedRecord(before, &then, d)
			after, _, appended, woke, err := da.DecideAppendWake(ctx, d, rec, st, d.Digest)
			switch {
			case errors.Is(err, ErrCannotDecide):
				// Recorded below.
			case err == nil && appended:
				if !woke {
					_ = l.wake(ctx, after) // logged; waiters re-read records
				}
				l.refresh(after)
				l.told(after)
				return after, nil
			default:
				return l.decided(ctx, before, d, opts, after, err)
			}
		}
	}
	after, err := l.rec.RecordDecision(ctx, d)
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
	if err != nil {
		var de *DecidedError
		switch {
		case errors.As(err, &de) && de.Now && after != nil:
			l.finalised(ctx, after, deadlineRecord(after))
		case after != nil && (errors.Is(err, ErrStaleArgs) || errors.Is(err, ErrAlreadyDecided) || errors.Is(err, ErrExpired)):
			l.refresh(after) // the clicker saw an old card: show the current one
		}
		return after, err
	}
	rec := l.decidedRecord(before, after, d)
	if after.Status == StatusPending {
		l.append(ctx, after, rec)
		l.refresh(after)
		return after, nil
	}
	var werr error
	if opts.Allow && after.Status == StatusApproved {
		l.append(ctx, after, rec)
		// Before the agent wakes, so its next call already sees it.
		after.Grant = l.grant(ctx, after, d)
		werr = l.wake(ctx, after)
	} else {
		werr = l.auditWake(ctx, after, rec)
	}
	l.refresh(after)
	l.told(after)
	if errors.Is(werr, ErrNotReplicated) {
		// Recorded, but perhaps only on a primary a failover is dropping:
		// the clicker is told to decide again rather than that it stands.
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

// ExpireDue expires every pending request whose deadline passed (fail
// closed), lets run every review-after request whose cancel window
// ended (approved, audited window_elapsed), and abandons every approved
// request of an outside caller that nobody claimed within its claim
// window (audited abandoned: nothing ran, a later claim is refused):
// each is recorded, audited, its waiters woken and its card redrawn. Any
// number of processes may sweep at once; each transition happens once.
// It returns how many requests this call changed.
func (l *Lifecycle) ExpireDue(ctx context.Context) (int, error) {
	expired, err := l.rec.RecordExpiries(ctx, l.now())
	for _, r := range expired {
		l.finalised(ctx, r, deadlineRecord(r))
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
	r, err := l.rec.RecordCancel(ctx, id, by, reason)
	if err != nil {
		return r, err
	}
	l.finalised(ctx, r, Record{Event: EventCancelled, RequestID: r.ID, RunID: r.RunID, Actor: by, Tool: r.Tool,
		Data: ReasonEvent{Reason: reason}})
	return r, nil
}

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
	if ca, ok := l.audit.(ClaimingAuditor); ok && r.Digest != "" {
		rec := l.executingRecord(r, owner, false)
		got, _, appended, err := ca.ClaimAppend(ctx, rec, r.ID, owner, tokenHash, r.Digest)
		switch {
		case errors.Is(err, ErrCannotClaim):
			// Claim as below.
		case err != nil:
			return got, err
		case appended:
			l.refresh(got)
			return got, nil
		default:
			l.Executing(ctx, got, owner, false)
			return got, nil
		}
	}
	got, err := l.rec.Claim(ctx, r.ID, owner, tokenHash, r.Digest)
	if err != nil {
		return got, err
	}
	l.Executing(ctx, got, owner, false)
	return got, nil
}

// refuseRun ends r, which the judgement at its claim refused, as refused:
// recorded, audited (call_refused, with the rule), its waiters woken, its
// card and thread told why, OnFinal told. It returns the request as it
// now is and the refusal (or the store's own refusal: r changed first).
func (l *Lifecycle) refuseRun(ctx context.Context, r *Request, e *RefusedError) (*Request, error) {
	cur, err := l.rec.Refuse(ctx, r.ID, r.Digest, e.Reason)
	if err != nil {
		return cur, err
	}
	l.log.WarnContext(ctx, "approved request refused at its claim by the policy in force", "request_id", r.ID, "tool", r.Tool, "code", e.Code, "rule", e.Rule)
	actor := "gate"
	if ed := EditOf(r); ed != nil && e.Code == RefusedInvalidArgs {
		actor = ed.Approver
	}
	l.finalised(ctx, cur, Record{Event: EventCallRefused, RequestID: r.ID, RunID: r.RunID, Actor: actor, Tool: r.Tool,
		Data: CallErrorEvent{CallID: r.CallID, Error: e.Reason, DenyRule: e.Rule, Args: r.Args}, Secret: l.secret(r.Tool)})
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
	cur, err := l.rec.Reopen(ctx, r.ID, r.Digest, ro)
	if err != nil {
		return cur, err
	}
	l.log.InfoContext(ctx, "approved request pending again: the policy in force asks more approvals", "request_id", r.ID, "tool", r.Tool, "need", m.Need, "have", m.Have)
	l.append(ctx, cur, Record{Event: EventReopened, RequestID: r.ID, RunID: r.RunID, Actor: "gate", Tool: r.Tool,
		Data: ReopenedEvent{Need: m.Need, Have: m.Have, Reason: m.Reason, Deadline: ro.Deadline}})
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
	r, err := l.rec.Finish(ctx, id, o.Status, o.Result)
	if err != nil {
		return nil, err
	}
	rec := outcomeRecord(r.ID, r.RunID, r.CallID, owner, r.Tool, o)
	rec.Secret = l.secret(r.Tool)
	l.append(ctx, r, rec)
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
	r, err := l.rec.RecordFeedback(ctx, id, f)
	if err != nil {
		if r != nil {
			l.refresh(r)
		}
		return r, err
	}
	data := FeedbackEvent{Reason: f.Reason, Status: r.Status, Sampled: r.Mode == ModeSampled, Created: r.Created}
	if d := r.Decision; d != nil {
		data.Verdict, data.DecidedBy = d.Verdict, d.Approver
	}
	ev := EventMarkedWrong
	if !f.Wrong {
		ev = EventSampleReviewed
	}
	l.append(ctx, r, Record{Event: ev, RequestID: r.ID, RunID: r.RunID, Actor: f.By, Tool: r.Tool, Data: data})
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
	_, err := l.rec.Claim(ctx, r.ID, owner, "", "")
	for try, wait := 1, notRunPause; try < notRunTries && errors.Is(err, ErrClaimNotConfirmed); try, wait = try+1, wait*2 {
		if l.sleep(ctx, wait) != nil {
			break
		}
		_, err = l.rec.Claim(ctx, r.ID, owner, "", "")
	}
	if err == nil {
		if fin, err := l.rec.Finish(context.WithoutCancel(ctx), r.ID, StatusFailed, why); err == nil {
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

// finalised finishes a transition to a final state: audit, wake-up, card.
func (l *Lifecycle) finalised(ctx context.Context, r *Request, rec Record) {
	_ = l.auditWake(ctx, r, rec) // logged; nobody to tell but the log
	l.refresh(r)
	l.told(r)
}

// auditWake audits rec about r, which became final, then pushes r's
// wake-up: in one round trip when the Auditor can (WakingAuditor: the
// wake-up goes only once the entry is in the stream), else append, then
// wake. The error is the wake-up's (wake).
func (l *Lifecycle) auditWake(ctx context.Context, r *Request, rec Record) error {
	if l.appendThen(ctx, r, rec, true) {
		return nil
	}
	return l.wake(ctx, r)
}

// told hands a request that became final to OnFinal.
func (l *Lifecycle) told(r *Request) {
	if l.final != nil {
		l.final(r)
	}
}

// wake pushes r's wake-up. A failure is logged and returned, but the
// transition is durable already: waiters re-read records periodically.
func (l *Lifecycle) wake(ctx context.Context, r *Request) error {
	err := l.rec.Wake(ctx, r.ID, r.Status)
	if err != nil {
		l.log.WarnContext(ctx, "wake-up not pushed; waiters find the decision at their next re-read", "request_id", r.ID, "err", err)
	}
	return err
}

func (l *Lifecycle) refresh(r *Request) {
	if l.cards != nil {
		l.cards.Refresh(r)
	}
}

// append audits rec, about request r, with a context that outlives the
// caller's: what it describes already happened. The entry carries r's
// trace id unless rec names one.
func (l *Lifecycle) append(ctx context.Context, r *Request, rec Record) {
	l.appendThen(ctx, r, rec, false)
}

// appendThen is append; with wake (r is final) it also pushes r's
// wake-up behind the entry, in the same round trip, when the Auditor can
// (WakingAuditor), and reports whether it did.
func (l *Lifecycle) appendThen(ctx context.Context, r *Request, rec Record, wake bool) (woke bool) {
	if rec.TraceID == "" && r != nil {
		rec.TraceID = r.TraceID
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var err error
	if wa, ok := l.audit.(WakingAuditor); ok && wake && r != nil {
		_, woke, err = wa.AppendWake(actx, rec, r.ID, r.Status)
	} else {
		_, err = l.audit.Append(actx, rec)
	}
	if err != nil {
		l.log.ErrorContext(ctx, "audit append failed", "event", rec.Event, "request_id", rec.RequestID, "run_id", rec.RunID, "err", err)
	}
	return woke
}
