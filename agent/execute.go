package agent

// This file: executing calls — approved (claimed once, bound to the
// approved arguments), let through by the gate, or found half-run after a
// crash.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// execGated runs an approved request: claimed at most once, its outcome
// recorded. Whether it may run is the claim's judgement, in the domain
// (approval.Lifecycle.Claim: bound to what was approved, schema, deny
// rules, quorum, as the policy says now), never this executor's.
//
// line is the task thread's decision line (apply's): execGated starts it
// right before the tool runs and waits for it before anything it may say
// in the thread.
func (a *Agent) execGated(ctx context.Context, r *run, c *call, req *approval.Request, line *decisionLine) error {
	if err := a.fence(ctx, r); err != nil {
		return err
	}
	bt := a.tools.byName[req.Tool]
	if bt == nil {
		why := fmt.Sprintf("tool %q is not available in this process", req.Tool)
		line.wait()
		a.execs.NotRun(ctx, req, a.owner, why)
		a.done(r, c, outRefused, "Not run: "+why+".", "")
		return a.save(r)
	}
	claimed, err := a.execs.ClaimRequest(ctx, req, a.owner)
	var refused *approval.RefusedError
	switch {
	case err == nil:
		return a.runGated(ctx, r, c, bt, claimed, false, line)
	case errors.As(err, &refused):
		// Judged and refused: the lifecycle ended it refused, audited why
		// and redrew the card; the thread hears it after the approval.
		line.wait()
		if claimed != nil {
			a.tellDecided(ctx, claimed)
		}
		a.done(r, c, outRefused, "Not run: "+refused.Reason+".", "")
		return a.save(r)
	case errors.Is(err, approval.ErrNeedsApprovals):
		// Pending again, its card asking for the rest: await waits for it.
		return err
	case errors.Is(err, approval.ErrAlreadyClaimed):
		line.wait()
		fresh, ferr := a.req.Request(ctx, req.ID)
		if ferr != nil {
			return ferr
		}
		return a.apply(ctx, r, c, fresh)
	}
	return err
}

// fence confirms, by renewing it, that this process still holds the lease
// of run r, right before a step that cannot be undone: claiming a request
// for execution (or failing it), or deciding what to do with one found
// executing. Run records are fenced by the lease in the save script, but
// requests are not, and the heartbeat notices a lapsed lease only on its
// next tick; a wait that ends in between must not let a process whose run
// was adopted elsewhere claim the request too (the adopter would then find
// it executing and report its outcome unknown, or re-send it).
//
// A lease renewed less than half a TTL ago cannot have lapsed (Redis
// keeps it a whole TTL from when the renewal was sent), so nobody can
// have adopted the run: then fence asks Redis nothing, and the way from a
// decision to its tool call is one round trip shorter. The half TTL left
// covers a pause between here and the claim, and a renewal lost in a
// failover (the heartbeat renews every third of a TTL). The claim itself
// stays atomic either way: nothing runs twice.
func (a *Agent) fence(ctx context.Context, r *run) error {
	if r.lease != nil && r.lease.holds(a.now(), a.leaseTTL/2) {
		return nil
	}
	sent := a.now()
	ok, err := a.leases.Extend(ctx, r.id, a.owner, a.leaseTTL)
	if err != nil {
		return fmt.Errorf("run %s: confirm lease: %w", r.id, err)
	}
	if !ok {
		return fmt.Errorf("run %s: %w", r.id, approval.ErrLeaseLost)
	}
	if r.lease != nil {
		r.lease.renewed(sent, a.leaseTTL)
	}
	return nil
}

// runGated executes a claimed request and records the outcome; line is
// the decision line, started as the tool runs (nil: told already; see
// execGated).
func (a *Agent) runGated(ctx context.Context, r *run, c *call, bt *boundTool, req *approval.Request, retry bool, line *decisionLine) error {
	if retry {
		a.execs.Executing(ctx, req, a.owner, true) // Claim audited the first run
	}
	xctx := context.WithoutCancel(ctx)
	line.start() // claimed and audited: the thread may hear of it now
	o := a.invoke(ctx, bt, req.ID, req.Args)
	st, text := o.Status, o.Result
	a.toolFailed(r, c, st)
	fin, err := a.execs.Finish(xctx, req.ID, a.owner, o)
	if err != nil {
		a.log.ErrorContext(ctx, "record outcome", "request_id", req.ID, "err", err)
		if !errors.Is(err, approval.ErrAlreadyClaimed) && !errors.Is(err, approval.ErrNotApproved) {
			return err
		}
		// Someone else recorded an outcome (a process that adopted this
		// run): theirs stands, and this run no longer owns the call.
		return fmt.Errorf("request %s: outcome already recorded elsewhere", req.ID)
	}
	line.wait()              // the decision line first
	a.tellDecided(xctx, fin) // a failure is a line of its own
	a.done(r, c, gatedOutcome(fin), a.resultText(fin, text), "")
	return a.save(r)
}

// orphanedGated handles a request found executing with no outcome: the
// process that claimed it stopped. Retry-safe tools run again with the same
// idempotency key; any other tool's outcome is unknown and it never runs
// again.
func (a *Agent) orphanedGated(ctx context.Context, r *run, c *call, req *approval.Request) error {
	if err := a.fence(ctx, r); err != nil {
		return err
	}
	bt := a.tools.byName[req.Tool]
	if bt != nil && isRetrySafe(bt.Tool) {
		return a.runGated(ctx, r, c, bt, req, true, nil) // apply told the thread
	}
	md := messageData{Tool: req.Tool, Args: string(req.Args)}
	text := a.msgs.Unknown(md)
	_, err := a.execs.Finish(context.WithoutCancel(ctx), req.ID, a.owner, approval.Outcome{Status: approval.StatusUnknown,
		Result: "outcome unknown: the process running it stopped before recording a result"})
	if err != nil {
		if errors.Is(err, approval.ErrAlreadyClaimed) {
			fresh, ferr := a.req.Request(ctx, req.ID)
			if ferr != nil {
				return ferr
			}
			return a.apply(ctx, r, c, fresh) // the outcome arrived meanwhile
		}
		return err
	}
	a.unknown(ctx, r, c, text) // the lifecycle audited it
	return a.save(r)
}

// toolFailed marks c's span as an error when its tool failed (the call's
// outcome stays what let it run: the model is told the error).
func (a *Agent) toolFailed(r *run, c *call, st approval.Status) {
	if st != approval.StatusFailed {
		return
	}
	r.mu.Lock()
	c.failed = true
	r.mu.Unlock()
}

// unknown tells the model and the task thread that c's outcome is unknown.
func (a *Agent) unknown(ctx context.Context, r *run, c *call, text string) {
	a.done(r, c, outUnknown, text, "")
	if err := a.notify.Say(ctx, r.origin(), fmt.Sprintf(
		"The outcome of %s (%s) is unknown: it was started but the process stopped before recording a result. It was not run again; please check the system of record.",
		c.Tool, c.RequestID)); err != nil {
		a.log.WarnContext(ctx, "say outcome unknown", "run_id", r.id, "err", err)
	}
}

// execDirect runs a call the gate let through (or ask-once remembered). It
// was checkpointed as executing before it started; orphaned says a
// previous process did that and stopped without an outcome. Its audit
// entries are the lifecycle's (RunningDirect, RanDirect).
func (a *Agent) execDirect(ctx context.Context, r *run, c *call, orphaned bool) error {
	bt := a.tools.byName[c.Tool]
	dc := approval.DirectCall{RequestID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool, Args: c.Args, Owner: a.owner,
		Secret: secretOf(c), TraceID: a.tracer.TraceID(ctx)}
	if orphaned && (bt == nil || !isRetrySafe(bt.Tool)) {
		a.execs.RanDirect(ctx, dc, approval.Outcome{Status: approval.StatusUnknown})
		a.unknown(ctx, r, c, a.msgs.Unknown(messageData{Tool: c.Tool, Args: string(c.Args)}))
		return a.save(r)
	}
	if orphaned {
		dc.Retry = true
		a.execs.RunningDirect(ctx, dc)
	}
	o := a.invoke(ctx, bt, c.RequestID, c.Args)
	a.toolFailed(r, c, o.Status)
	a.execs.RanDirect(ctx, dc, o)
	outcome := c.Outcome
	if outcome == "" {
		outcome = outAuto
	}
	if outcome == outAuto {
		a.sample(ctx, r, c, bt, o)
	}
	a.done(r, c, outcome, o.Result, "")
	return a.save(r)
}

// sample posts c, which the gate let run without a human, for review after
// the fact when its tool samples calls and approval.Sampled picks its
// request id (the same choice on every replica and replay). A sample that
// cannot be recorded is logged: the call already ran.
func (a *Agent) sample(ctx context.Context, r *run, c *call, bt *boundTool, o approval.Outcome) {
	as := c.Assessment
	if as == nil || as.Policy.Sample <= 0 || !approval.Sampled(c.RequestID, as.Policy.Sample) {
		return
	}
	rec := r.rec
	risk := as.Policy.Risk
	if risk == "" && bt != nil {
		risk = bt.Risk()
	}
	req := &approval.Request{
		ID: c.RequestID, RunID: r.id, CallID: c.ID, Requester: rec.Requester, Requesters: slices.Clone(rec.Requesters), Origin: rec.Origin,
		Tool: c.Tool, Risk: risk, Args: c.Args, Reason: c.Reason, Confidence: c.Confidence,
		Approvers: as.Policy.Approvers, Quorum: 1, Mode: approval.ModeSampled,
		Status: o.Status, Result: clip.Bytes(o.Result, 2000), Created: a.now().UTC(),
	}
	if bt != nil {
		req.Preview = a.preview(ctx, bt, c.Args)
	}
	if _, err := a.execs.Sampled(context.WithoutCancel(ctx), req, as.Policy.Sample); err != nil {
		a.log.Error("sampled call not posted for review", "run_id", r.id, "request_id", c.RequestID, "tool", c.Tool, "err", err)
	}
}

// invoke runs the tool once with id as its idempotency key: the one place
// where any call (gated, granted, let through, or retried after a crash)
// executes. The tool finishes even when the run is stopping: an execution
// that started is carried to a recorded outcome.
func (a *Agent) invoke(ctx context.Context, bt *boundTool, id string, args json.RawMessage) approval.Outcome {
	started := a.now()
	out, err := bt.Run(context.WithoutCancel(ctx), Invocation{RequestID: id, Args: args})
	o := approval.Outcome{Status: approval.StatusExecuted, Result: out, Took: a.now().Sub(started)}
	if err != nil {
		o.Status, o.Result = approval.StatusFailed, "error: "+err.Error()
	}
	return o
}
