package agent

// This file: parsing a proposed call and handing it to the lifecycle
// owner (Lifecycle.Propose), which judges it and asks a person when one
// must decide.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// prepare parses a proposed call and hands it to the lifecycle
// (Lifecycle.Propose: the tool's identity, schema, deny rules, the gate,
// ask-once memory, pre-authorisation, the request and its card), then
// sets the call's state from what became of it. A call that never
// reaches the lifecycle (unknown to this agent, arguments that do not
// parse or do not match the tool) is refused here (never executed,
// audited). An error means the run must stop (ctx ended, or the run
// could not be saved).
func (a *Agent) prepare(ctx context.Context, r *run, c *call) error {
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
		return nil
	case perr != nil:
		a.refuse(ctx, r, c, pol.Secret, perr.Error())
		return nil
	}
	c.Args, c.Reason, c.Confidence = args, reason, confidence
	if err := bt.validate(args); err != nil {
		a.refuse(ctx, r, c, pol.Secret, err.Error())
		return nil
	}
	got, err := a.proposals.Propose(ctx, approval.Proposal{
		RequestID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool, Args: args, Reason: reason, Confidence: confidence,
		Requester: rec.Requester, Requesters: rec.Requesters, Origin: rec.Origin, Timeout: a.defaultTimeout, Risk: bt.Risk(),
		Preview: func(ctx context.Context) approval.Preview { return a.preview(ctx, bt, args) },
		TraceID: a.tracer.TraceID(ctx),
	})
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, approval.ErrNotSaved):
		a.log.ErrorContext(ctx, "create request", "run_id", r.id, "request_id", c.RequestID, "err", err)
		a.record(ctx, approval.Record{Event: approval.EventFailed, RequestID: c.RequestID, RunID: r.id, Actor: "agent", Tool: c.Tool,
			Data: approval.CallErrorEvent{CallID: c.ID, Error: "the approval request could not be saved"}})
		a.done(r, c, outCancelled, "Not run: the approval request could not be saved, so no one could approve it.", "")
		return nil
	case errors.Is(err, approval.ErrUnknownTool):
		a.refuse(ctx, r, c, pol.Secret, fmt.Sprintf("tool %q is not declared in the policy", c.Tool))
		return nil
	case errors.Is(err, approval.ErrInvalidArgs), errors.Is(err, approval.ErrInvalidToolName), errors.Is(err, approval.ErrConfusableTool):
		a.refuse(ctx, r, c, pol.Secret, err.Error())
		return nil
	default:
		a.refuse(ctx, r, c, pol.Secret, fmt.Sprintf("the policy could not assess this call: %v", err))
		return nil
	}
	as := got.Assessment
	c.Args, c.Assessment = got.Args, &as
	switch got.Outcome {
	case approval.ProposedDenied:
		a.deny(ctx, r, c, got.Denial)
	case approval.ProposedAuto:
		c.State, c.Outcome = stateRun, outAuto
	case approval.ProposedRemembered:
		c.State, c.Outcome = stateRun, outRemembered
	case approval.ProposedPreauthorized:
		c.State, c.Outcome, c.GrantedBy = stateRun, outPreauth, got.Grant.GrantedBy
		a.tellGrantor(ctx, r, c, got.Grant)
	default: // asked: its card is up, or the request was cancelled, failing closed (the wait tells)
		r.mu.Lock()
		c.Card, c.State, c.created = got.Request.Card, stateAsked, got.Request
		r.mu.Unlock()
	}
	return nil
}

// tellGrantor says in the granting card's thread what runs under its
// pre-authorisation, so approvers see it.
func (a *Agent) tellGrantor(ctx context.Context, r *run, c *call, g *approval.Grant) {
	gr, err := a.req.Request(ctx, g.RequestID)
	if err != nil || gr.Card.TS == "" {
		return
	}
	text := fmt.Sprintf("Running %s without a card under this pre-authorisation: %s (request %s)", c.Tool, clip.Bytes(string(c.Args), 1000), c.RequestID)
	if err := a.notify.Say(ctx, approval.Origin{Team: gr.Origin.Team, Channel: gr.Card.Channel, ThreadTS: gr.Card.TS}, text); err != nil {
		a.log.WarnContext(ctx, "tell the granting card's thread", "run_id", r.id, "grant_id", g.ID, "err", err)
	}
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

// deny ends a call a deny rule refused (the lifecycle audited it):
// nobody is asked, the model is told the policy's reason.
func (a *Agent) deny(ctx context.Context, r *run, c *call, d *approval.Denial) {
	why := "refused by policy: " + d.Reason
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

// preview asks the tool for system-of-record facts; failure is said
// plainly on the card, which still goes out.
func (a *Agent) preview(ctx context.Context, t Tool, args json.RawMessage) approval.Preview {
	pctx, cancel := context.WithTimeout(ctx, a.previewTimeout)
	defer cancel()
	return previewOf(pctx, t, args)
}
