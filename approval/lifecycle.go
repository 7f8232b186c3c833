package approval

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

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
	// Posted is told once the card Post posted is bound (r.Card; r is
	// the record as read once bound, at its revision Request.Rev, when the
	// lifecycle could read it, else the request it posted, Rev 0): the
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

// LifecycleOptions configure a Lifecycle. Records is required;
// Cards may be set later with SetCards (the bot and the lifecycle need each
// other).
type LifecycleOptions struct {
	Records Records
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
	); err != nil {
		return nil, err
	}
	l := &Lifecycle{rec: opts.Records, cards: opts.Cards, gate: opts.Gate, schemas: opts.Schemas, scopes: opts.Scopes, dir: opts.Directory, memory: opts.Memory,
		now: opts.Now, ticker: opts.Ticker, sleep: opts.Sleep, log: opts.Logger, final: opts.OnFinal, claimWindow: option.PositiveOr(opts.ClaimWindow, DefaultClaimWindow)}
	if l.memory == nil {
		l.memory, _ = opts.Records.(Memory)
	}
	// The argument properties audited redacted are the policy's, read
	// from the gate (the policy in memory): no call back into the process.
	l.secret = func(string) []string { return nil }
	if l.gate != nil {
		l.secret = l.gate.Secret
	}
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

// told hands a request that became final to OnFinal.
func (l *Lifecycle) told(r *Request) {
	if l.final != nil {
		l.final(r)
	}
}

// wake pushes the wake-up of r, whose transition held it back
// (Prepared.Hold). A failure is logged and returned, but the transition is
// durable already: waiters re-read records periodically.
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

// entry prepares a transition whose entry rec does not depend on how it
// ends (built from what the lifecycle holds): Prepared.Entry.
func entry(rec Record) func(*Request) Record {
	return func(*Request) Record { return rec }
}

// append audits recs, about request r (nil: none in hand), entries that
// are no transition of r's record, in order and in one round trip where
// the store can, with a context that outlives the caller's: what they
// describe already happened. Each carries r's trace id unless it names
// one.
func (l *Lifecycle) append(ctx context.Context, r *Request, recs ...Record) {
	if r != nil {
		for i := range recs {
			recs[i].TraceID = cmp.Or(recs[i].TraceID, r.TraceID)
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := l.rec.Append(actx, recs...); err != nil {
		for _, rec := range recs {
			l.log.ErrorContext(ctx, "audit append failed", "event", rec.Event, "request_id", rec.RequestID, "run_id", rec.RunID, "err", err)
		}
	}
}
