package agent

// This file: checking a proposed call, asking the gate, and turning a
// gated call into a request (through the lifecycle owner).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/countersign/countersign/approval"
)

// prepare checks a proposed call and asks the gate about it. Anything
// wrong with the call refuses it (never executed, audited).
func (a *Agent) prepare(ctx context.Context, r *run, c *call) {
	rec := r.rec
	pol, _ := a.gate.Policy(c.Tool)
	bt := a.tools.byName[c.Tool]
	props := defaultProps
	if bt != nil {
		props = bt.props
	}
	args, reason, confidence, perr := parseCall(c.Raw, props)
	shown := rawText(c.Raw)
	if perr == nil {
		shown = args
	}
	a.record(ctx, approval.Record{Event: approval.EventProposed, RequestID: c.RequestID, RunID: r.id, Actor: "model", Tool: c.Tool,
		Data: approval.ProposedEvent{CallID: c.ID, Args: shown, Reason: reason, Confidence: confidence}, Secret: pol.Secret})
	switch {
	case bt == nil:
		a.refuse(ctx, r, c, pol.Secret, fmt.Sprintf("unknown tool %q (available: %s)", c.Tool, strings.Join(a.toolNames(), ", ")))
		return
	case perr != nil:
		a.refuse(ctx, r, c, pol.Secret, perr.Error())
		return
	}
	if err := bt.validate(args); err != nil {
		c.Args = args
		a.refuse(ctx, r, c, pol.Secret, err.Error())
		return
	}
	c.Args, c.Reason, c.Confidence = args, reason, confidence
	as, err := a.gate.Assess(approval.ToolCall{ID: c.ID, Tool: c.Tool, Args: args, Reason: reason, Confidence: confidence}, rec.Requester)
	if err != nil {
		why := fmt.Sprintf("the policy could not assess this call: %v", err)
		if errors.Is(err, approval.ErrUnknownTool) {
			why = fmt.Sprintf("tool %q is not declared in the policy", c.Tool)
		}
		a.refuse(ctx, r, c, pol.Secret, why)
		return
	}
	if as.Denied != nil {
		a.deny(ctx, r, c, pol.Secret, as.Denied)
		return
	}
	c.Assessment = &as
	a.record(ctx, approval.Record{Event: approval.EventAssessed, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
		Data: approval.AssessedEvent{CallID: c.ID, NeedsHuman: as.NeedsHuman, Signals: as.Signals, Quorum: as.Policy.Quorum}, Secret: as.Policy.Secret})
	if !as.NeedsHuman {
		c.State, c.Outcome = stateRun, outAuto
		a.record(ctx, approval.Record{Event: approval.EventAutoApproved, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
			Data: approval.CallEvent{CallID: c.ID}})
		return
	}
	if as.Policy.Remember > 0 {
		digest, err := approval.Digest(args)
		if err == nil {
			ok, err := a.req.Remembered(ctx, rec.Requester, c.Tool, digest)
			if err != nil {
				a.log.WarnContext(ctx, "ask-once lookup failed; asking a human", "run_id", r.id, "tool", c.Tool, "err", err)
			}
			if ok {
				c.State, c.Outcome = stateRun, outRemembered
				a.record(ctx, approval.Record{Event: approval.EventRemembered, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
					Data: approval.RememberedEvent{CallID: c.ID, Digest: digest, Requester: rec.Requester}})
				return
			}
		}
	}
	if a.preauthorized(ctx, r, c, as) {
		return
	}
	c.State = stateAsk
}

// preauthorized lets c run when an approver pre-authorised its tool for
// this requester in this task thread (approval.Grant) and the call needs
// no more than one approval. A failed lookup asks a human.
func (a *Agent) preauthorized(ctx context.Context, r *run, c *call, as approval.Assessment) bool {
	if as.Policy.Preauthorize <= 0 || as.Policy.Quorum > 1 {
		return false
	}
	rec := r.rec
	g, err := a.req.ActiveGrant(ctx, c.Tool, rec.Requester, rec.Origin)
	if err != nil {
		a.log.WarnContext(ctx, "pre-authorisation lookup failed; asking a human", "run_id", r.id, "tool", c.Tool, "err", err)
		return false
	}
	if !g.Covers(c.Tool, rec.Requester, rec.Origin, as.Policy.Quorum, a.now()) || slices.Contains(rec.Requesters, g.GrantedBy) {
		// Not this call's grant, or its grantor asked for the call too
		// (posted in the thread since): four-eyes, a human decides.
		return false
	}
	amount := 0.0
	if g.Limits.Budgeted() {
		n, ok := numberArg(c.Args, g.Limits.Argument)
		if !ok || n < 0 {
			a.log.InfoContext(ctx, "pre-authorisation has a budget but the call has no usable amount; asking a human",
				"run_id", r.id, "tool", c.Tool, "grant_id", g.ID, "argument", g.Limits.Argument)
			return false
		}
		amount = n
	}
	// Counted atomically against the grant's limits, audited, and shown
	// on the card that granted it.
	_, ok, err := a.proposals.UseGrant(ctx, g, c.RequestID, amount, approval.Record{Event: approval.EventPreauthorized,
		RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool, TraceID: a.tracer.TraceID(ctx),
		Data: approval.PreauthorizedEvent{CallID: c.ID, GrantID: g.ID, GrantedBy: g.GrantedBy, GrantRequestID: g.RequestID,
			Expires: g.Expires, Signals: as.Signals}})
	switch {
	case err != nil:
		a.log.WarnContext(ctx, "pre-authorisation use not recorded; asking a human", "run_id", r.id, "tool", c.Tool, "grant_id", g.ID, "err", err)
		return false
	case !ok:
		a.log.InfoContext(ctx, "pre-authorisation used up; asking a human", "run_id", r.id, "tool", c.Tool, "grant_id", g.ID)
		return false
	}
	c.State, c.Outcome, c.GrantedBy = stateRun, outPreauth, g.GrantedBy
	// Approvers see in the granting card's thread what runs under it.
	if gr, err := a.req.Request(ctx, g.RequestID); err == nil && gr.Card.TS != "" {
		text := fmt.Sprintf("Running %s without a card under this pre-authorisation: %s (request %s)", c.Tool, truncate(string(c.Args), 1000), c.RequestID)
		if err := a.notify.Say(ctx, approval.Origin{Team: gr.Origin.Team, Channel: gr.Card.Channel, ThreadTS: gr.Card.TS}, text); err != nil {
			a.log.WarnContext(ctx, "tell the granting card's thread", "run_id", r.id, "grant_id", g.ID, "err", err)
		}
	}
	return true
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

func (a *Agent) toolNames() []string {
	names := make([]string, 0, len(a.tools.byName))
	for n := range a.tools.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// refuse ends a call that may not run.
func (a *Agent) refuse(ctx context.Context, r *run, c *call, secret []string, why string) {
	a.record(ctx, approval.Record{Event: approval.EventCallRefused, RequestID: c.RequestID, RunID: r.id, Actor: "agent", Tool: c.Tool,
		Data: approval.CallErrorEvent{CallID: c.ID, Error: why, Args: argsOrRaw(c)}, Secret: secret})
	a.done(r, c, outRefused, "error: "+why+". The call was not executed.", "")
}

// deny ends a call a deny rule refused: nobody is asked, the model is told
// the policy's reason.
func (a *Agent) deny(ctx context.Context, r *run, c *call, secret []string, d *approval.Denial) {
	why := "refused by policy: " + d.Reason
	a.record(ctx, approval.Record{Event: approval.EventCallRefused, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
		Data: approval.CallErrorEvent{CallID: c.ID, Error: why, DenyRule: d.Rule, Args: argsOrRaw(c)}, Secret: secret})
	a.done(r, c, outDenied, "Not run: "+why+". Nobody was asked to approve it.", "")
	// The requester hears it from the policy, not only from the model.
	if err := a.notify.Say(ctx, r.origin(), fmt.Sprintf("⛔ %s was refused by policy: %s. Nobody was asked and nothing ran.", c.Tool, d.Reason)); err != nil {
		a.log.WarnContext(ctx, "tell the task thread about a denial", "run_id", r.id, "tool", c.Tool, "err", err)
	}
}

// argsOrRaw is what the audit shows of c's arguments: the parsed ones, or
// the model's text when they did not parse.
func argsOrRaw(c *call) json.RawMessage {
	if len(c.Args) > 0 {
		return c.Args
	}
	return rawText(c.Raw)
}

// rawText is s as a JSON string, for arguments that did not parse.
func rawText(s string) json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		return nil
	}
	return b
}

func secretOf(c *call) []string {
	if c.Assessment == nil {
		return nil
	}
	return c.Assessment.Policy.Secret
}

// createRequest saves the request of a gated call and posts its card. A
// card that cannot be posted cancels the request (fail closed); the wait
// then reports the cancellation.
func (a *Agent) createRequest(ctx context.Context, r *run, c *call) error {
	rec := r.rec
	bt := a.tools.byName[c.Tool]
	as := c.Assessment
	pol := as.Policy
	risk := pol.Risk
	if risk == "" {
		risk = bt.Risk()
	}
	timeout := approval.PositiveOr(pol.Timeout, a.defaultTimeout)
	now := a.now().UTC()
	req := &approval.Request{
		ID: c.RequestID, RunID: r.id, CallID: c.ID, Requester: rec.Requester, Requesters: slices.Clone(rec.Requesters), Origin: rec.Origin,
		Tool: c.Tool, Risk: risk, Args: c.Args, Reason: c.Reason, Confidence: c.Confidence,
		Preview: a.preview(ctx, bt, c.Args), Signals: as.Signals,
		Decisions: pol.Decisions, Quorum: pol.Quorum, Approvers: pol.Approvers, Preauthorize: pol.Preauthorize, PreauthorizeLimits: pol.PreauthorizeLimits, Confirm: pol.Confirm, Formats: pol.Formats,
		Created: now, Deadline: now.Add(timeout), Status: approval.StatusPending,
		TraceID: a.tracer.TraceID(ctx),
	}
	if as.Window > 0 {
		// review: after — the call runs when the window ends unless an
		// approver cancels it; the deadline is the window's end.
		req.Mode, req.Deadline, req.Decisions = approval.ModeAfter, now.Add(as.Window), nil
	}
	created, err := a.proposals.Create(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.ErrorContext(ctx, "create request", "run_id", r.id, "request_id", c.RequestID, "err", err)
		// The record may have been written before the error (the store's
		// indexes are separate commands): close it, so no card, reminder
		// or late click can act on a request whose call was reported as
		// not run. Not found (never written) is the usual answer.
		if _, cerr := a.proposals.Cancel(ctx, c.RequestID, "countersign", "the approval request could not be saved"); cerr != nil && !errors.Is(cerr, approval.ErrNotFound) {
			a.log.WarnContext(ctx, "cancel unsaved request", "request_id", c.RequestID, "err", cerr)
		}
		a.record(ctx, approval.Record{Event: approval.EventFailed, RequestID: c.RequestID, RunID: r.id, Actor: "agent", Tool: c.Tool,
			Data: approval.CallErrorEvent{CallID: c.ID, Error: "the approval request could not be saved"}})
		a.done(r, c, outCancelled, "Not run: the approval request could not be saved, so no one could approve it.", "")
		return a.save(r)
	}
	// Its card is up (or the request was cancelled, failing closed: the
	// wait tells).
	r.mu.Lock()
	c.Card = created.Card
	c.State = stateAsked
	r.mu.Unlock()
	return a.save(r)
}

// preview asks the tool for system-of-record facts; failure is said
// plainly on the card, which still goes out.
func (a *Agent) preview(ctx context.Context, t Tool, args json.RawMessage) approval.Preview {
	pctx, cancel := context.WithTimeout(ctx, a.previewTimeout)
	defer cancel()
	return previewOf(pctx, t, args)
}
