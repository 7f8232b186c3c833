package approval

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/countersign/countersign/approval/option"
)

// ErrNotSaved wraps the store's error when a proposal needed a person but
// its request could not be saved: nobody can approve it, so it must not
// run (Lifecycle.Propose has cancelled any record written half-way).
var ErrNotSaved = errors.New("approval: request not saved")

// ErrInvalidSchema: the JSON Schema a caller gave for its undeclared tool
// is not usable. Errors wrapping it wrap ErrInvalidArgs too (the call
// cannot be checked, so it cannot run).
var ErrInvalidSchema = errors.New("approval: invalid input schema")

// Memory is what the lifecycle keeps between proposals besides requests:
// approvals to ask about once (a tool's remember) and pre-authorisations
// (store.Store implements it). Lookups that fail ask a person.
type Memory interface {
	// Remember lets an identical call (tool and argument digest) by
	// requester skip the person for ttl.
	Remember(ctx context.Context, requester, tool, digest string, ttl time.Duration) error
	// Remembered reports whether an identical call by requester was
	// approved and ran within its tool's remember time.
	Remembered(ctx context.Context, requester, tool, digest string) (bool, error)
	// ActiveGrant returns the active pre-authorisation of tool for
	// requester in the task thread origin, nil when there is none.
	ActiveGrant(ctx context.Context, tool, requester string, origin Origin) (*Grant, error)
}

// Proposal is one call for a person's decision, as a surface (the agent
// loop, /v1, the HumanLayer endpoints, the MCP gateway through /v1) knows
// it. The surface has checked its own wire format; everything else is
// Lifecycle.Propose's.
type Proposal struct {
	// RequestID is the id of the request, chosen by the surface (random
	// for the agent; derived from the caller's call id for the API, so a
	// retry names the same request).
	RequestID string
	RunID     string
	CallID    string
	Tool      string
	// Args is the call's JSON object of arguments (empty is {}).
	Args       json.RawMessage
	Reason     string
	Confidence *float64
	// Annotations are the tool's own hints (MCP): for a tool the policy
	// does not declare they tighten the external rule.
	Annotations *ToolAnnotations
	// InputSchema is an undeclared tool's schema as its caller gave it.
	InputSchema json.RawMessage
	Requester   string
	// Requesters count as having asked too (four-eyes); see Request.
	Requesters []string
	// Origin is the task thread; zero for a caller outside Slack, which
	// then has no pre-authorisation (a grant is scoped to a thread).
	Origin  Origin
	Caller  Caller
	Kind    Kind
	Choices []Choice
	// CallerState is given back to the caller unchanged.
	CallerState json.RawMessage
	// CallerFacts are shown on the card as the caller's.
	CallerFacts []Fact
	// External lets a tool the policy does not declare be judged by the
	// policy's external rule (Gate.AssessExternal); otherwise it is
	// unknown.
	External bool
	// Settle stores the gate's own answer (auto-approved, refused by a
	// deny rule, remembered) as a final request (ModeSettled), so a
	// caller asking again by call id reads the same answer. A question
	// refused by a deny rule is never settled.
	Settle bool
	// JudgeOnly asks what the policy says without asking anyone: a call
	// the policy lets through or refuses is answered (and audited) as
	// always, but when a person would be asked nothing is created and the
	// outcome is ProposedAsk with Request nil (an AuthZEN evaluation: the
	// access request that follows proposes the call again).
	JudgeOnly bool
	// FindByID says RequestID names the call (the API derives it from the
	// caller's call id): a call sent again finds the request its id
	// names, if one is stored, and Propose answers ProposedFound with it,
	// proposing nothing. A call settled without a request is written only
	// while none has the id (Records.AppendNew), so the look costs it no
	// round trip of its own; anything else is looked up first.
	FindByID bool
	// Timeout is the request's deadline when the tool's policy sets none.
	Timeout time.Duration
	// Risk is the tool's own risk, used when the policy names none.
	Risk Risk
	// Preview fetches the system-of-record facts; called only when a
	// card is needed. Nil shows none.
	Preview func(ctx context.Context) Preview
	// TraceID is the trace of the run that asked, "" when none.
	TraceID string
}

// Outcome of a proposal: what the surface tells its caller.
const (
	// ProposedAsk: a person decides; Proposed.Request is pending (or
	// already cancelled, when its card could not be posted).
	ProposedAsk = "ask"
	// ProposedAuto: the gate lets the call run without a person.
	ProposedAuto = "auto"
	// ProposedRemembered: the same call by the same requester was
	// approved and ran recently (the tool's remember).
	ProposedRemembered = "remembered"
	// ProposedPreauthorized: an approver's grant lets the call run
	// (Proposed.Grant, as now used).
	ProposedPreauthorized = "preauthorized"
	// ProposedDenied: a deny rule refused it (Proposed.Denial); it must
	// not run and nobody is asked.
	ProposedDenied = "denied"
	// ProposedFound: a request has the proposal's id already
	// (Proposal.FindByID); Proposed.Request is it, as stored, and nothing
	// was judged or written. Whether it is the same call is the
	// surface's to check.
	ProposedFound = "found"
)

// Proposed is what became of a proposal.
type Proposed struct {
	// Outcome is one of ProposedAsk, ProposedAuto, ProposedRemembered,
	// ProposedPreauthorized, ProposedDenied, ProposedFound.
	Outcome string
	// Request is the request created (ProposedAsk, unless
	// Proposal.JudgeOnly) or settled (Proposal.Settle); nil otherwise.
	Request *Request
	// Args are the arguments as judged (compact) and Digest theirs.
	Args   json.RawMessage
	Digest string
	// Assessment is the gate's.
	Assessment Assessment
	// Denial is the deny rule's refusal (ProposedDenied).
	Denial *Denial
	// Grant is the pre-authorisation that let the call run, as now used
	// (ProposedPreauthorized).
	Grant *Grant
	// Created is when the lifecycle judged it.
	Created time.Time
}

// Propose is the one way a call reaches a person, whatever the surface:
// the tool's identity (CheckToolName against the policy's tools), Judge
// (schema, deny rules, the assessment; audited assessed), then in order:
// refused by a deny rule (call_refused), let through by the gate
// (auto_approved), by ask-once memory (remembered) or by a
// pre-authorisation (preauthorized, counted against its limits), or else
// a request for a person: approvers, quorum and decisions from the rule,
// a cancel window for review after, then Create (record → requested →
// card). Remember and pre-authorisation never cover a call that needs
// more than one approval. With Settle, the gate's own answer is stored as
// a final request.
//
// Errors: ErrInvalidToolName, ErrConfusableTool, ErrUnknownTool,
// ErrInvalidArgs (the message says what is wrong), wrapped; ErrNotSaved
// when the request could not be saved; anything else is the system
// failing. A refusal by policy is not an error (ProposedDenied).
func (l *Lifecycle) Propose(ctx context.Context, p Proposal) (Proposed, error) {
	if l.gate == nil {
		return Proposed{}, errNoGate
	}
	if err := CheckToolName(p.Tool, l.gate.Tools()); err != nil {
		return l.findOr(ctx, p, err)
	}
	args, digest, err := compactArgs(p.Args)
	if err != nil {
		return l.findOr(ctx, p, fmt.Errorf("propose %s: %w", p.Tool, err))
	}
	call := ToolCall{ID: p.CallID, Tool: p.Tool, Args: args, Reason: p.Reason, Confidence: p.Confidence, Annotations: p.Annotations}
	as, err := l.Judge(call, p.InputSchema, p.Requester, p.External)
	if err != nil {
		return l.findOr(ctx, p, err)
	}
	now := l.now().UTC()
	out := Proposed{Args: args, Digest: digest, Assessment: as, Created: now}
	pol := as.Policy
	base := Record{RequestID: p.RequestID, RunID: p.RunID, Actor: "gate", Tool: p.Tool, TraceID: p.TraceID}
	assessed := base
	assessed.Event, assessed.Secret = EventAssessed, pol.Secret
	assessed.Data = AssessedEvent{CallID: p.CallID, NeedsHuman: as.NeedsHuman, Signals: as.Signals, Quorum: pol.Quorum}

	// unstored writes the entries of a call settled without a request:
	// for a call whose id names it, only while no request has the id, and
	// then not without them (the call is refused when they cannot be
	// written).
	unstored := func(recs ...Record) (Proposed, error) {
		if !p.FindByID {
			l.append(ctx, nil, recs...)
			return out, nil
		}
		stored, err := l.rec.AppendNew(ctx, p.RequestID, recs...)
		switch {
		case errors.Is(err, ErrExists):
			return Proposed{Outcome: ProposedFound, Request: stored}, nil
		case err != nil:
			return Proposed{}, fmt.Errorf("propose %s: the audit: %w", p.RequestID, err)
		}
		return out, nil
	}
	// settled ends a call the gate (or memory) let through or refused:
	// the assessment and rec are its entries, in one round trip when
	// nothing is stored.
	settled := func(st Status, result string, rec Record) (Proposed, error) {
		if !p.Settle {
			return unstored(assessed, rec)
		}
		if f, ok, err := l.find(ctx, p); ok || err != nil {
			return f, err
		}
		l.append(ctx, nil, assessed)
		r := l.request(p, as, args, digest, now)
		r.Status, r.Result, r.Quorum, r.Mode = st, result, 1, ModeSettled
		r.Decisions, r.Approvers, r.Deadline, r.Preauthorize = nil, Approvers{}, time.Time{}, 0
		got, err := l.Settle(ctx, r, rec)
		if err != nil {
			return Proposed{}, fmt.Errorf("propose %s: %w: %w", p.RequestID, ErrNotSaved, err)
		}
		out.Request = got
		return out, nil
	}
	switch {
	case as.Denied != nil:
		out.Outcome, out.Denial = ProposedDenied, as.Denied
		why := "refused by policy: " + as.Denied.Reason
		rec := base
		rec.Event, rec.Secret = EventCallRefused, pol.Secret
		rec.Data = CallErrorEvent{CallID: p.CallID, Error: why, DenyRule: as.Denied.Rule, Args: args}
		if p.Kind == KindContact {
			return unstored(assessed, rec) // a refused question is asked again, and refused again
		}
		return settled(StatusRejected, why, rec)
	case !as.NeedsHuman && p.Kind == KindCall:
		out.Outcome = ProposedAuto
		rec := base
		rec.Event, rec.Data = EventAutoApproved, CallEvent{CallID: p.CallID}
		return settled(StatusApproved, "", rec)
	}
	oneApproval := p.Kind == KindCall && max(pol.Quorum, 1) == 1
	if oneApproval && l.remembered(ctx, p, pol, digest) {
		out.Outcome = ProposedRemembered
		rec := base
		rec.Event, rec.Data = EventRemembered, RememberedEvent{CallID: p.CallID, Digest: digest, Requester: p.Requester}
		return settled(StatusApproved, "", rec)
	}
	if f, ok, err := l.find(ctx, p); ok || err != nil {
		return f, err
	}
	l.append(ctx, nil, assessed) // a person may be asked: the assessment first, whatever follows
	if oneApproval {
		if g := l.preauthorized(ctx, p, as, args); g != nil {
			out.Outcome, out.Grant = ProposedPreauthorized, g
			return out, nil
		}
	}

	if p.JudgeOnly {
		out.Outcome = ProposedAsk // a person would be asked: nothing created
		return out, nil
	}
	r := l.request(p, as, args, digest, now)
	if p.Preview != nil && p.Kind == KindCall {
		r.Preview = p.Preview(ctx)
	}
	r.Preview.CallerFacts = p.CallerFacts
	created, err := l.Create(ctx, r)
	if err != nil {
		if ctx.Err() != nil {
			return Proposed{}, ctx.Err()
		}
		// The record may have been written before the error (the store's
		// indexes are separate commands): close it, so no card, reminder
		// or late click can act on a request reported as not saved. Not
		// found (never written) is the usual answer.
		if _, cerr := l.Cancel(ctx, r.ID, "countersign", "the approval request could not be saved"); cerr != nil && !errors.Is(cerr, ErrNotFound) {
			l.log.WarnContext(ctx, "cancel unsaved request", "request_id", r.ID, "err", cerr)
		}
		return Proposed{}, fmt.Errorf("propose %s: %w: %w", r.ID, ErrNotSaved, err)
	}
	out.Outcome, out.Request = ProposedAsk, created
	return out, nil
}

// find looks for the request proposal p's id names, when it names the
// call (Proposal.FindByID): ok with ProposedFound when one is stored. An
// error is the store failing to say.
func (l *Lifecycle) find(ctx context.Context, p Proposal) (Proposed, bool, error) {
	if !p.FindByID {
		return Proposed{}, false, nil
	}
	stored, err := l.rec.Request(ctx, p.RequestID)
	switch {
	case errors.Is(err, ErrNotFound):
		return Proposed{}, false, nil
	case err != nil:
		return Proposed{}, false, fmt.Errorf("propose %s: %w", p.RequestID, err)
	}
	return Proposed{Outcome: ProposedFound, Request: stored}, true, nil
}

// findOr is a proposal refused as it was judged (why): the request its id
// names when it has one (the call was asked before and is answered as
// before, whatever it would be judged now), else why.
func (l *Lifecycle) findOr(ctx context.Context, p Proposal, why error) (Proposed, error) {
	f, ok, err := l.find(ctx, p)
	switch {
	case err != nil:
		return Proposed{}, err
	case ok:
		return f, nil
	}
	return Proposed{}, why
}

// request builds the pending request of proposal p judged as as.
func (l *Lifecycle) request(p Proposal, as Assessment, args json.RawMessage, digest string, now time.Time) *Request {
	pol := as.Policy
	decisions, quorum := pol.Decisions, pol.Quorum
	switch {
	case p.Kind == KindContact:
		// A question is answered, by one person; nothing runs.
		decisions, quorum = []Verdict{VerdictRespond}, 1
	case !p.Caller.AppliesEdits():
		// An edit could not be honoured (HumanLayer's SDKs, an ext_authz
		// gateway), so it is not offered (docs/api.md, docs/gateways.md).
		decisions = slices.DeleteFunc(slices.Clone(decisions), func(v Verdict) bool { return v == VerdictEdit })
	}
	risk := pol.Risk
	if risk == "" {
		risk = p.Risk
	}
	r := &Request{
		ID: p.RequestID, RunID: p.RunID, CallID: p.CallID, Requester: p.Requester, Requesters: p.Requesters, Origin: p.Origin,
		Caller: p.Caller, Kind: p.Kind, Choices: p.Choices, CallerState: p.CallerState,
		Tool: p.Tool, Risk: risk, Args: args, InputSchema: p.InputSchema, Digest: digest, Reason: p.Reason, Confidence: p.Confidence,
		Signals: as.Signals, Decisions: decisions, Quorum: quorum, Approvers: pol.Approvers,
		Confirm: pol.Confirm, Formats: pol.Formats,
		Created: now, Deadline: now.Add(option.PositiveOr(pol.Timeout, p.Timeout)), Status: StatusPending, TraceID: p.TraceID,
	}
	if _, declared := l.gate.Policy(p.Tool); !declared && p.Kind == KindCall {
		r.Undeclared = true
	}
	r.StepUp = l.gate.StepUpFor(r, r.Args) // what the card says; Decide judges again
	if p.Origin.Channel != "" && max(quorum, 1) == 1 {
		// A grant is scoped to a task thread (a caller outside Slack has
		// none to offer it in) and never covers a call that needs more
		// than one approval.
		r.Preauthorize, r.PreauthorizeLimits = pol.Preauthorize, pol.PreauthorizeLimits
	}
	if as.Window > 0 {
		// review: after — the call runs when the window ends unless an
		// approver cancels it; the deadline is the window's end.
		r.Mode, r.Deadline, r.Decisions = ModeAfter, now.Add(as.Window), nil
	}
	return r
}

// remembered reports whether ask-once memory lets p through: its tool
// remembers approvals and the same requester's identical call was
// approved and ran recently. A failed lookup asks a person.
func (l *Lifecycle) remembered(ctx context.Context, p Proposal, pol ToolPolicy, digest string) bool {
	if pol.Remember <= 0 || l.memory == nil {
		return false
	}
	ok, err := l.memory.Remembered(ctx, p.Requester, p.Tool, digest)
	if err != nil {
		l.log.WarnContext(ctx, "ask-once lookup failed; asking a human", "run_id", p.RunID, "tool", p.Tool, "err", err)
		return false
	}
	return ok
}

// preauthorized lets p run when an approver pre-authorised its tool for
// its requester in its task thread (Grant) and the grant's limits allow
// it: the use is counted and audited (UseGrant). It returns the grant as
// now used, nil to ask a person (also when a lookup fails).
func (l *Lifecycle) preauthorized(ctx context.Context, p Proposal, as Assessment, args json.RawMessage) *Grant {
	pol := as.Policy
	if pol.Preauthorize <= 0 || l.memory == nil || p.Origin.Channel == "" {
		return nil
	}
	g, err := l.memory.ActiveGrant(ctx, p.Tool, p.Requester, p.Origin)
	if err != nil {
		l.log.WarnContext(ctx, "pre-authorisation lookup failed; asking a human", "run_id", p.RunID, "tool", p.Tool, "err", err)
		return nil
	}
	if !g.Covers(p.Tool, p.Requester, p.Origin, pol.Quorum, l.now()) || slices.Contains(p.Requesters, g.GrantedBy) {
		// Not this call's grant, or its grantor asked for the call too
		// (posted in the task thread since): four-eyes, a human decides.
		return nil
	}
	amount := 0.0
	if g.Limits.Budgeted() {
		n, ok := numberArg(args, g.Limits.Argument)
		if !ok || n < 0 {
			l.log.InfoContext(ctx, "pre-authorisation has a budget but the call has no usable amount; asking a human",
				"run_id", p.RunID, "tool", p.Tool, "grant_id", g.ID, "argument", g.Limits.Argument)
			return nil
		}
		amount = n
	}
	used, ok, err := l.UseGrant(ctx, g, p.RequestID, amount, Record{Event: EventPreauthorized,
		RequestID: p.RequestID, RunID: p.RunID, Actor: "gate", Tool: p.Tool, TraceID: p.TraceID,
		Data: PreauthorizedEvent{CallID: p.CallID, GrantID: g.ID, GrantedBy: g.GrantedBy, GrantRequestID: g.RequestID,
			Expires: g.Expires, Signals: as.Signals}})
	switch {
	case err != nil:
		l.log.WarnContext(ctx, "pre-authorisation use not recorded; asking a human", "run_id", p.RunID, "tool", p.Tool, "grant_id", g.ID, "err", err)
		return nil
	case !ok:
		l.log.InfoContext(ctx, "pre-authorisation used up; asking a human", "run_id", p.RunID, "tool", p.Tool, "grant_id", g.ID)
		return nil
	}
	return used
}

// remember lets an identical call by r's requester skip the person for
// its tool's remember time, once r ran: never for a call that needed
// more than one approval. A failure is logged (the next call asks).
func (l *Lifecycle) remember(ctx context.Context, r *Request) {
	if l.memory == nil || l.gate == nil || r.Status != StatusExecuted || r.Kind != KindCall {
		return
	}
	if max(r.Quorum, 1) > 1 || len(r.Approvals) > 1 {
		return
	}
	pol, ok := l.gate.Policy(r.Tool)
	if !ok || pol.Remember <= 0 {
		return
	}
	if err := l.memory.Remember(ctx, r.Requester, r.Tool, r.Digest, pol.Remember); err != nil {
		l.log.WarnContext(ctx, "remember approval", "request_id", r.ID, "err", err)
	}
}

// compactArgs returns a call's arguments without insignificant space ({}
// when empty) and their digest; ErrInvalidArgs when they are not JSON.
func compactArgs(raw json.RawMessage) (json.RawMessage, string, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		raw = json.RawMessage("{}")
	}
	args, err := Compact(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%w: not valid JSON: %v", ErrInvalidArgs, err)
	}
	digest, err := Digest(args)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrInvalidArgs, err)
	}
	return args, digest, nil
}

// numberArg reads the numeric argument name of args.
func numberArg(args json.RawMessage, name string) (float64, bool) {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var all map[string]any
	if dec.Decode(&all) != nil {
		return 0, false
	}
	n, ok := all[name].(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}
