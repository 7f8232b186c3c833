package agent

// This file: waiting for a gated call's decision and turning it into the
// call's tool message.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
)

// cancelPending cancels the run's pending requests other than except (stop
// on rejection).
func (a *Agent) cancelPending(ctx context.Context, r *run, except *call, why string) {
	r.mu.Lock()
	var ids []*call
	for _, c := range r.rec.Batch.Calls {
		if c != except && c.State == stateAsked {
			ids = append(ids, c)
		}
	}
	r.mu.Unlock()
	for _, c := range ids {
		if _, err := a.proposals.Cancel(ctx, c.RequestID, "countersign", "the run stopped: "+why); err != nil && !errors.Is(err, approval.ErrAlreadyDecided) && !errors.Is(err, approval.ErrExpired) {
			a.log.WarnContext(ctx, "cancel pending request", "run_id", r.id, "request_id", c.RequestID, "err", err)
		}
	}
}

// await waits for a gated call's decision and applies it.
func (a *Agent) await(ctx context.Context, r *run, c *call) error {
	r.mu.Lock()
	last := c.created
	r.mu.Unlock()
	if last == nil {
		// Created before a restart, or posted by a process that stopped
		// before binding its card: the lifecycle finds or posts it.
		if stored, err := a.req.Request(ctx, c.RequestID); err == nil {
			last = a.proposals.EnsureCard(ctx, stored)
		}
	}
	backoff := 100 * time.Millisecond
	for {
		req, err := a.req.Wait(ctx, c.RequestID) // holding no slot (runBatch)
		if err == nil {
			a.tracer.Decided(ctx, req)
			if err := r.slot.take(ctx); err != nil {
				return err // left decided: the run applies it when it resumes
			}
			err = func() error {
				defer r.slot.give()
				return a.apply(ctx, r, c, req)
			}()
			if errors.Is(err, approval.ErrNeedsApprovals) {
				// The claim's judgement found the policy in force asks more
				// approvals: the request is pending again, its card asking
				// for the rest. Wait for them.
				continue
			}
			if !errors.Is(err, approval.ErrClaimNotConfirmed) {
				return err
			}
			// Redis could not confirm the claim on its replicas (failing
			// over): it was withdrawn and nothing ran. Wait again, after
			// the backoff below (the request as it is now, on whichever
			// primary), and claim anew.
		}
		lost := errors.Is(err, approval.ErrNotFound)
		if ctx.Err() != nil {
			if !errors.Is(context.Cause(ctx), errRunLost) {
				return ctx.Err() // left pending: another process resumes the wait
			}
			lost = true
		}
		if lost {
			// The store lost the request (Redis restarted without its
			// data): nothing ran and nothing will. Say so on the card and
			// in the thread rather than leave them waiting. The run's
			// context is cancelled as its lease goes with the same loss,
			// whether before this point or while the card and thread are
			// being told: they are told regardless, within loseTimeout.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loseTimeout)
			defer cancel()
			if last == nil {
				r.mu.Lock()
				last = &approval.Request{ID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool, Origin: r.rec.Origin,
					Requester: r.rec.Requester, Card: c.Card}
				r.mu.Unlock()
			}
			a.proposals.Lose(ctx, last)
			gone := *last
			gone.Status = approval.StatusLost
			a.tellDecided(ctx, &gone)
			a.done(r, c, outCancelled, "Not run: the approval request was lost.", "")
			return a.save(r)
		}
		a.log.WarnContext(ctx, "wait for decision; retrying", "request_id", c.RequestID, "err", err)
		if err := a.sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// decisionLine is the task thread's decision line of an approved call:
// post runs in a goroutine of its own from start on, which execGated
// calls once the call is claimed and its execution audited, right before
// the tool runs, so the Slack call (and, against the local workspace, all
// it sets off) does not share the machine with the claim. wait returns
// once the line is posted, starting it if nothing did. A nil line is one
// told already: both do nothing.
type decisionLine struct {
	once sync.Once
	done chan struct{}
	post func()
}

func (l *decisionLine) start() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		go func() { // exits when the line is posted (or failed: logged)
			defer close(l.done)
			l.post()
		}()
	})
}

func (l *decisionLine) wait() {
	if l == nil {
		return
	}
	l.start()
	<-l.done
}

// loseTimeout bounds telling a lost request's card and task thread.
const loseTimeout = 10 * time.Second

// tellDecided has the task thread told what became of req before the run
// acts on it (Notifier.Decided): the thread's decision line comes before
// the tool's effects and the run's answer, whichever process decided.
func (a *Agent) tellDecided(ctx context.Context, req *approval.Request) {
	if err := a.notify.Decided(ctx, req); err != nil {
		a.log.WarnContext(ctx, "tell the task thread the decision", "run_id", req.RunID, "request_id", req.ID, "err", err)
	}
}

// apply turns a final request into the call's tool message, executing it
// when approved. The task thread is told the decision before anything else
// is said there. An approved call's claim and tool call do not wait for
// that line (a Slack round trip, 100 ms and more against Slack itself, was
// on the way from the click to the tool): it is posted once the call is
// claimed and audited, while the tool runs (decisionLine), and waited for
// before the run says anything more in the thread (the outcome of a failed
// call) and before apply returns (the run's answer comes after).
func (a *Agent) apply(ctx context.Context, r *run, c *call, req *approval.Request) error {
	if req.Status == approval.StatusApproved {
		line := &decisionLine{done: make(chan struct{}), post: func() { a.tellDecided(ctx, req) }}
		err := a.execGated(ctx, r, c, req, line)
		if errors.Is(err, approval.ErrClaimNotConfirmed) || errors.Is(err, approval.ErrNeedsApprovals) {
			return err // nothing ran, nothing was told: await waits (again) and claims anew
		}
		line.wait()
		return err
	}
	a.tellDecided(ctx, req)
	dec := req.Decision
	approver := ""
	text := ""
	if dec != nil {
		approver, text = dec.Approver, dec.Text
	}
	md := messageData{Tool: c.Tool, Approver: approver, Args: string(req.Args)}
	switch req.Status {
	case approval.StatusExecuting:
		return a.orphanedGated(ctx, r, c, req)
	case approval.StatusExecuted, approval.StatusFailed:
		// Finished before a restart: the stored result is the truth.
		a.done(r, c, gatedOutcome(req), a.resultText(req, req.Result), "")
	case approval.StatusUnknown:
		a.done(r, c, outUnknown, a.msgs.Unknown(md), "")
	case approval.StatusRejected:
		md.Reason = text
		if dec != nil && dec.Verdict == approval.VerdictCancel && text == "" {
			md.Reason = "cancelled during its cancel window, no reason given"
		}
		a.done(r, c, outRejected, a.msgs.Rejected(md), fmt.Sprintf("%s: %s (<@%s>)", c.Tool, text, approver))
		if a.stopOnRejection || (c.Assessment != nil && c.Assessment.Policy.StopOnRejection) {
			// A mention, never a bare id: Slack shows the approver's name
			// in the run's answer (and in the cancelled cards' thread lines).
			why := fmt.Sprintf("%s was rejected by <@%s>: %s", c.Tool, approver, text)
			r.mu.Lock()
			first := r.rec.Batch.Stopped == ""
			if first {
				r.rec.Batch.Stopped = why
			}
			r.mu.Unlock()
			if first {
				if err := a.save(r); err != nil {
					return err
				}
				a.cancelPending(ctx, r, c, why)
			}
		}
	case approval.StatusResponded:
		md.Response = text
		a.done(r, c, outResponded, a.msgs.Responded(md), "")
	case approval.StatusExpired:
		md.Reason = "expired without a decision at " + req.Deadline.UTC().Format(time.RFC3339)
		a.done(r, c, outExpired, a.msgs.Expired(md), "")
	case approval.StatusCancelled:
		md.Reason = "was cancelled"
		if text != "" {
			md.Reason += ": " + text
		}
		a.done(r, c, outCancelled, a.msgs.Expired(md), "")
	default:
		return fmt.Errorf("request %s: unexpected status %q after wait", req.ID, req.Status)
	}
	return a.save(r)
}

func gatedOutcome(req *approval.Request) string {
	if editOf(req) != nil {
		return outEdited
	}
	if req.Decision != nil && req.Decision.Verdict == approval.VerdictWindowElapsed {
		return outWindow
	}
	return outApproved
}

// editOf returns the approver's edit that set req.Args, nil when the
// arguments are the model's. With quorum 1 the edit is the final decision;
// with a larger quorum it restarts the approvals and the final decision is
// the approve that completed the quorum, so the edit is found among the
// counted approvals. OriginalArgs is set by any edit: an edited request
// whose edit decision cannot be found still counts as edited (by nobody
// known), so its arguments are never taken for the model's.
func editOf(req *approval.Request) *approval.Decision {
	if ed := approval.EditOf(req); ed != nil {
		return ed
	}
	if len(req.OriginalArgs) > 0 {
		return &approval.Decision{RequestID: req.ID, Verdict: approval.VerdictEdit, Approver: "unknown"}
	}
	return nil
}

// resultText is the tool message of an executed gated call: the output,
// after the edit note when an approver changed the arguments.
func (a *Agent) resultText(req *approval.Request, out string) string {
	ed := editOf(req)
	if ed == nil {
		return out
	}
	note := a.msgs.Edited(messageData{
		Tool: req.Tool, Approver: ed.Approver, Changes: changes(req.OriginalArgs, req.Args), Args: string(req.Args),
	})
	return note + "\n\nResult: " + out
}
