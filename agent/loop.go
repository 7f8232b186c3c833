package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/approval"
)

// recordVersion is the version of the run record's JSON.
const recordVersion = 1

// record is a run as checkpointed in Redis after every step: the thread's
// conversation, the current turn's step, the batch in progress with each
// call's state and request id, status, origin, requesters and counts.
type record struct {
	Version int             `json:"version"`
	ID      string          `json:"id"`
	Origin  approval.Origin `json:"origin"`
	// Requester is the author of the latest task (the gate's requester,
	// the key of ask-once and of pre-authorisations).
	Requester string `json:"requester"`
	// Requesters are every author of a task in the thread since the run
	// began, in the order they first posted: the model acts on the whole
	// thread, so each of them counts as having asked for every request
	// the run creates (four-eyes: none of them may approve it).
	Requesters []string                       `json:"requesters,omitempty"`
	Status     approval.RunStatus             `json:"status,omitempty"`
	Step       int                            `json:"step"`
	Messages   []openai.ChatCompletionMessage `json:"messages"`
	Batch      *batch                         `json:"batch,omitempty"`
	// Pending lists the request ids the run waits on (for operators).
	Pending []string `json:"pending,omitempty"`
	// Tally counts the current turn's calls.
	Tally approval.RunResult `json:"tally"`
	// Result is the ended turn's result; Posted says the bot has it.
	Result *approval.RunResult `json:"result,omitempty"`
	Posted bool                `json:"posted,omitempty"`
	// Trace is the current turn's trace context (a W3C traceparent), ""
	// when traces are off: a process that resumes the turn continues its
	// trace.
	Trace   string    `json:"trace,omitempty"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
}

// batch is the tool calls of one model reply.
type batch struct {
	Calls []*call `json:"calls"`
	// Stopped says why the turn ends after this batch (stop on rejection).
	Stopped string `json:"stopped,omitempty"`
}

// callState is where a call of a batch is.
type callState string

const (
	stateNew       callState = ""          // proposed, not yet checked
	stateRun       callState = "run"       // may run without a human
	stateExecuting callState = "executing" // started without a request; no outcome recorded
	stateAsk       callState = "ask"       // left by an older process: needs a human, request not yet created (proposed again)
	stateAsked     callState = "asked"     // request created; its record is the truth
	stateDone      callState = "done"      // Result is the tool message
)

// Call outcomes, counted in the run result.
const (
	outAuto       = "auto"
	outRemembered = "remembered"
	outPreauth    = "preauthorized" // ran under an approver's grant
	outApproved   = "approved"
	outWindow     = "window_elapsed" // ran when its cancel window ended; nobody approved it
	outEdited     = "edited"
	outRejected   = "rejected"
	outResponded  = "responded"
	outExpired    = "expired"
	outCancelled  = "cancelled"
	outRefused    = "refused"
	outDenied     = "denied" // refused by a deny rule
	outUnknown    = "unknown"
)

// call is one tool call of a batch.
type call struct {
	ID   string `json:"id"` // tool_call_id
	Tool string `json:"tool"`
	Raw  string `json:"raw"` // arguments as the model wrote them
	// RequestID is assigned when the batch is recorded: the approval
	// request id for a gated call, the idempotency key for any call.
	RequestID  string               `json:"request_id"`
	Args       json.RawMessage      `json:"args,omitempty"`
	Reason     string               `json:"reason,omitempty"`
	Confidence *float64             `json:"confidence,omitempty"`
	Assessment *approval.Assessment `json:"assessment,omitempty"`
	State      callState            `json:"state"`
	Outcome    string               `json:"outcome,omitempty"`
	Result     string               `json:"result,omitempty"`
	// GrantedBy is who pre-authorised a call that ran under a grant.
	GrantedBy string `json:"granted_by,omitempty"`
	// Card is where the request's card was posted (the lifecycle's answer
	// to Create), kept to show the request as lost if the store loses it.
	Card approval.CardRef `json:"card,omitzero"`

	// span is the call's span while this process works on it, and failed
	// says its tool failed (neither saved); guarded by the run's mu once
	// the batch's goroutines start.
	span   Span
	failed bool
	// created is the request as this process created it (not saved):
	// the wait starts from it rather than reading it back.
	created *approval.Request
}

// run is a run this process owns.
type run struct {
	id       string
	slot     *share      // the run's pool slot, given back while it only waits
	lease    *leaseBound // what the heartbeat and fence know of the run's lease
	mu       sync.Mutex  // guards rec and consumed
	rec      *record
	consumed int // inbox tasks the next save drops
}

func (r *run) origin() approval.Origin {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Origin
}

func (r *run) requester() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Requester
}

// save checkpoints the record, fenced by the lease. It uses a context that
// survives shutdown so an outcome that happened is recorded.
func (a *Agent) save(r *run) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	rec.Updated = a.now().UTC()
	rec.Pending = rec.Pending[:0]
	if rec.Batch != nil {
		for _, c := range rec.Batch.Calls {
			if c.State == stateAsked {
				rec.Pending = append(rec.Pending, c.RequestID)
			}
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode run %s: %w", r.id, err)
	}
	active := rec.Status == approval.RunActive || rec.Status == approval.RunWaiting || rec.Batch != nil ||
		(rec.Result != nil && !rec.Posted)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 10*time.Second)
	defer cancel()
	if err := a.records.Save(ctx, r.id, a.owner, b, r.consumed, active); err != nil {
		return fmt.Errorf("checkpoint run %s: %w", r.id, err)
	}
	r.consumed = 0
	return nil
}

// drive works on run id until it is idle (nothing queued) or ctx ends.
func (a *Agent) drive(ctx context.Context, sh *share, lease *leaseBound, id string) error {
	data, inbox, err := a.records.Load(ctx, id)
	if errors.Is(err, approval.ErrNotFound) {
		// Nothing to do (the run ended long ago, or the store lost it):
		// drop the adoption hint so nobody adopts it again and again.
		return a.adoption.Forget(ctx, id)
	}
	if err != nil {
		return err
	}
	r := &run{id: id, slot: sh, lease: lease}
	persisted := data != nil
	if data != nil {
		var rec record
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("decode run %s: %w", id, err)
		}
		if rec.Version > recordVersion {
			return fmt.Errorf("run %s: record version %d is newer than this process understands (%d)", id, rec.Version, recordVersion)
		}
		r.rec = &rec
	} else {
		r.rec = &record{Version: recordVersion, ID: id, Created: a.now().UTC()}
	}
	err = a.steps(ctx, r, inbox, persisted)
	if err != nil && !errors.Is(err, errRunLost) {
		// A save refused for a lost lease, or a cancelled run: if the run's
		// record is gone too, the store lost its data and nobody adopted
		// the run. Its waiting requests are gone with it: say so.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, _, lerr := a.records.Load(lctx, id); errors.Is(lerr, approval.ErrNotFound) {
			a.loseRun(lctx, r)
			// Nothing of this run writes any more: drop any adoption hint
			// a last save put back, so no process adopts it again.
			if ferr := a.adoption.Forget(lctx, id); ferr != nil {
				a.log.Warn("forget lost run", "run_id", id, "err", ferr)
			}
			return errRunLost
		}
	}
	return err
}

// loseRun reports every request r still waits on as lost (the store lost
// its data): each card and the task thread say that nothing ran.
func (a *Agent) loseRun(ctx context.Context, r *run) {
	r.mu.Lock()
	var lost []*approval.Request
	if b := r.rec.Batch; b != nil {
		for _, c := range b.Calls {
			if c.State == stateAsked {
				lost = append(lost, &approval.Request{ID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool,
					Requester: r.rec.Requester, Requesters: slices.Clone(r.rec.Requesters), Origin: r.rec.Origin, Card: c.Card, Status: approval.StatusLost})
				c.State, c.Outcome, c.Result = stateDone, outCancelled, "Not run: the approval request was lost."
			}
		}
	}
	r.mu.Unlock()
	for _, req := range lost {
		a.proposals.Lose(ctx, req)
		a.tellDecided(ctx, req)
	}
}

// steps drives run r until it is idle or an error stops it. Each turn
// worked on here is a span: started with the turn (a new trace, saved on
// the record) or, for a turn found in progress, continuing the trace the
// record names; ended when its result is posted, or as interrupted when
// the run stops here (it resumes elsewhere).
func (a *Agent) steps(ctx context.Context, r *run, inbox [][]byte, persisted bool) (err error) {
	base := ctx
	var turn Span
	defer func() {
		if turn != nil {
			turn.End("interrupted", false)
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec := r.rec // only this goroutine touches rec outside batches
		inTurn := rec.Batch != nil || (rec.Result != nil && !rec.Posted) ||
			rec.Status == approval.RunActive || rec.Status == approval.RunWaiting
		if inTurn && turn == nil {
			ctx, turn = a.tracer.StartRun(base, r.id, rec.Trace)
			if rec.Trace == "" {
				// A turn started with traces off (or before they existed):
				// later processes continue this trace.
				rec.Trace = turn.Context()
			}
		}
		switch {
		case rec.Batch != nil:
			if err := a.runBatch(ctx, r); err != nil {
				return err
			}
		case rec.Result != nil && !rec.Posted:
			if err := a.post(ctx, r); err != nil {
				return err
			}
			turn.End(string(rec.Status), rec.Status == approval.RunFailed)
			ctx, turn = base, nil
		case rec.Status == approval.RunActive || rec.Status == approval.RunWaiting:
			if err := a.step(ctx, r); err != nil {
				return err
			}
		case len(inbox) > 0:
			ctx, turn = a.tracer.StartRun(base, r.id, "")
			rec.Trace = turn.Context()
			if err := a.startTurn(ctx, r, inbox); err != nil {
				return err
			}
			inbox = nil
		default:
			if persisted {
				// Idle: make sure a stale adoption hint goes away.
				return a.save(r)
			}
			return nil
		}
		persisted = true
	}
}

// startTurn appends the queued tasks to the conversation and starts a turn.
func (a *Agent) startTurn(ctx context.Context, r *run, inbox [][]byte) error {
	rec := r.rec
	if len(rec.Messages) == 0 && a.systemPrompt != "" {
		rec.Messages = append(rec.Messages, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: a.systemPrompt})
	}
	followUp := rec.Status != ""
	for _, raw := range inbox {
		var t approval.Task
		if err := json.Unmarshal(raw, &t); err != nil {
			a.log.ErrorContext(ctx, "drop undecodable task", "run_id", r.id, "err", err)
			continue
		}
		if len(rec.Requesters) == 0 && rec.Requester != "" {
			// A run recorded before the set was kept: its requester
			// asked first.
			rec.Requesters = []string{rec.Requester}
		}
		if t.Requester != "" && !slices.Contains(rec.Requesters, t.Requester) {
			rec.Requesters = append(rec.Requesters, t.Requester)
		}
		rec.Requester = t.Requester
		rec.Origin = t.Origin
		rec.Messages = append(rec.Messages, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: t.Text})
		a.record(ctx, approval.Record{Event: approval.EventRunStarted, RunID: r.id, Actor: t.Requester,
			Data: approval.RunStartedEvent{Origin: t.Origin, Text: t.Text, EventID: t.EventID, FollowUp: followUp}})
		followUp = true
	}
	rec.Status = approval.RunActive
	rec.Step = 0
	rec.Tally = approval.RunResult{}
	rec.Result = nil
	rec.Posted = false
	r.consumed = len(inbox)
	return a.save(r)
}

// step asks the model once and records its reply.
func (a *Agent) step(ctx context.Context, r *run) error {
	rec := r.rec
	if rec.Step >= a.maxSteps {
		return a.finish(ctx, r, approval.RunMaxSteps, fmt.Sprintf(
			"I stopped after %d steps without finishing the task (the limit is max_steps = %d). Nothing further was run; ask again with a narrower task if needed.",
			rec.Step, a.maxSteps))
	}
	mctx, span := a.tracer.StartModelCall(ctx, a.modelName)
	msg, err := a.complete(mctx, openai.ChatCompletionRequest{
		Model:    a.modelName,
		Messages: rec.Messages,
		Tools:    a.tools.offered,
	})
	span.End("", err != nil)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // shutting down or lease lost: the run resumes elsewhere
		}
		a.log.ErrorContext(ctx, "model failed", "run_id", r.id, "err", err)
		return a.finish(ctx, r, approval.RunFailed, fmt.Sprintf(
			"The run failed: %v. Nothing was executed in this step.", err))
	}
	rec.Step++
	msg.Role = openai.ChatMessageRoleAssistant
	msg.FunctionCall = nil
	if len(msg.ToolCalls) == 0 {
		rec.Messages = append(rec.Messages, msg)
		return a.finish(ctx, r, approval.RunDone, msg.Content)
	}
	b := &batch{}
	seen := map[string]bool{}
	for i := range msg.ToolCalls {
		tc := &msg.ToolCalls[i]
		tc.Index = nil
		if tc.ID == "" || seen[tc.ID] {
			tc.ID = fmt.Sprintf("call_%s_%d", approval.NewID("c")[2:14], i)
		}
		seen[tc.ID] = true
		if tc.Type == "" {
			tc.Type = openai.ToolTypeFunction
		}
		b.Calls = append(b.Calls, &call{
			ID: tc.ID, Tool: tc.Function.Name, Raw: tc.Function.Arguments, RequestID: approval.NewID("req"),
		})
	}
	rec.Messages = append(rec.Messages, msg)
	rec.Batch = b
	return a.save(r)
}

// finish ends the turn: the result is checkpointed (unposted) and audited;
// drive posts it.
func (a *Agent) finish(ctx context.Context, r *run, st approval.RunStatus, answer string) error {
	rec := r.rec
	res := rec.Tally
	res.RunID, res.Origin, res.Status, res.Answer = r.id, rec.Origin, st, answer
	rec.Status = st
	rec.Result = &res
	rec.Posted = false
	if err := a.save(r); err != nil {
		return err
	}
	a.record(ctx, approval.Record{Event: approval.EventRunFinished, RunID: r.id, Actor: rec.Requester,
		Data: approval.RunFinishedEvent{Status: st, Steps: rec.Step, Result: res}})
	return nil
}

// post hands the turn's result to the bot (at least once).
func (a *Agent) post(ctx context.Context, r *run) error {
	if err := a.notify.PostRunResult(ctx, *r.rec.Result); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.ErrorContext(ctx, "post run result", "run_id", r.id, "err", err)
	}
	r.rec.Posted = true
	return a.save(r)
}

// runBatch takes every call of the current batch to a tool message, then
// appends the messages in the original order (one per tool_call_id).
func (a *Agent) runBatch(ctx context.Context, r *run) error {
	b := r.rec.Batch
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Every call not yet done is a span while this process works on it;
	// cctx carries it to the call's gate, request, wait and execution.
	cctx := map[*call]context.Context{}
	for _, c := range b.Calls {
		if c.State == stateDone {
			continue
		}
		cctx[c], c.span = a.tracer.StartToolCall(bctx, approval.ToolCall{ID: c.ID, Tool: c.Tool}, c.RequestID)
	}
	defer func() {
		// Calls left undone (the run stops here and resumes elsewhere).
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range b.Calls {
			if c.span != nil {
				c.span.End("interrupted", false)
				c.span = nil
			}
		}
	}()
	// Calls found executing were started by a process that stopped before
	// recording their outcome.
	var orphaned []*call
	for _, c := range b.Calls {
		if c.State == stateExecuting {
			orphaned = append(orphaned, c)
		}
	}
	// 1. Every new call goes to the lifecycle: refused, let through, or
	// a request with its card (a call left asking by an older process is
	// proposed again: the same request id finds its request).
	prepared := false
	for _, c := range b.Calls {
		if c.State == stateNew || c.State == stateAsk {
			if err := a.prepare(cctx[c], r, c); err != nil {
				return err
			}
			prepared = true
		}
	}
	if prepared {
		if err := a.save(r); err != nil {
			return err
		}
	}
	// 2. Everything at once: calls let through run, gated calls are
	// awaited together.
	var toRun []*call
	for _, c := range b.Calls {
		if c.State == stateRun {
			c.State = stateExecuting
			toRun = append(toRun, c)
		}
	}
	waiting := false
	for _, c := range b.Calls {
		if c.State == stateAsked {
			waiting = true
		}
	}
	if waiting {
		r.rec.Status = approval.RunWaiting
	}
	if len(toRun) > 0 || waiting {
		// Checkpoint before any execution: a call marked executing is never
		// run blindly again.
		if err := a.save(r); err != nil {
			return err
		}
	}
	for _, c := range toRun {
		a.execs.RunningDirect(cctx[c], approval.DirectCall{RequestID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool, Args: c.Args,
			Owner: a.owner, Secret: secretOf(c), TraceID: a.tracer.TraceID(cctx[c])})
	}
	if b.Stopped != "" {
		a.cancelPending(ctx, r, nil, b.Stopped)
	}
	var wg sync.WaitGroup
	goDo := func(f func() error) {
		wg.Add(1)
		go func() { // exits when f returns: a tool finished or a wait ended
			defer wg.Done()
			if err := f(); err != nil {
				cancel(err)
			}
		}()
	}
	var asked []*call
	for _, c := range b.Calls {
		if c.State == stateAsked {
			asked = append(asked, c)
		}
	}
	// Tools run in the run's slot; waiting for decisions holds none (await
	// takes the slot again to apply a decision), so while the run only
	// waits its slot serves other runs.
	for _, c := range toRun {
		_ = r.slot.take(ctx) // the run holds its slot: this only counts
		goDo(func() error { defer r.slot.give(); return a.execDirect(cctx[c], r, c, false) })
	}
	for _, c := range orphaned {
		_ = r.slot.take(ctx)
		goDo(func() error { defer r.slot.give(); return a.execDirect(cctx[c], r, c, true) })
	}
	for _, c := range asked {
		goDo(func() error { return a.await(cctx[c], r, c) })
	}
	r.slot.give()
	if len(asked) > 0 {
		a.log.DebugContext(ctx, "run waits for decisions; its worker is free", "run_id", r.id, "waiting", len(asked))
	}
	wg.Wait()
	// Back to model work. Taken even when ctx has ended: the worker gives
	// the slot back when it leaves, and every holder finishes without
	// needing another slot, so this returns.
	_ = r.slot.take(context.WithoutCancel(ctx))
	if err := context.Cause(bctx); err != nil {
		return err
	}
	// 4. Results to the conversation, in the original order.
	for _, c := range b.Calls {
		if c.State != stateDone {
			return fmt.Errorf("run %s: call %s left in state %q", r.id, c.ID, c.State)
		}
	}
	for _, c := range b.Calls {
		r.rec.Messages = append(r.rec.Messages, openai.ChatCompletionMessage{
			Role: openai.ChatMessageRoleTool, ToolCallID: c.ID, Content: c.Result,
		})
	}
	r.rec.Batch = nil
	if b.Stopped != "" {
		return a.finish(ctx, r, approval.RunStopped, "Stopped: "+b.Stopped+". Nothing else was run.")
	}
	r.rec.Status = approval.RunActive
	return a.save(r)
}

// done records a call's tool message and counts it. Callers in batch
// goroutines must not hold r.mu.
func (a *Agent) done(r *run, c *call, outcome, result, rejection string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.State, c.Outcome, c.Result = stateDone, outcome, result
	if c.span != nil {
		c.span.End(outcome, c.failed || outcome == outRefused || outcome == outUnknown)
		c.span = nil
	}
	t := &r.rec.Tally
	switch outcome {
	case outAuto, outRemembered:
		t.AutoRun++
	case outPreauth:
		t.Preauthorized++
		if c.GrantedBy != "" && !slices.Contains(t.PreauthorizedBy, c.GrantedBy) {
			t.PreauthorizedBy = append(t.PreauthorizedBy, c.GrantedBy)
		}
	case outDenied:
		t.Denied++
	case outApproved:
		t.Approved++
	case outWindow:
		t.AfterWindow++
	case outEdited:
		t.Edited++
	case outRejected:
		t.Rejected++
		t.RejectionReasons = append(t.RejectionReasons, rejection)
	case outResponded:
		t.Responded++
	case outExpired, outCancelled:
		t.Expired++
	case outRefused:
		t.Refused++
	}
}

// record appends to the audit stream, with the trace id of the span in
// ctx. A failed append is logged: the action it describes already happened
// (or was refused) and is also in the request or run record.
func (a *Agent) record(ctx context.Context, rec approval.Record) {
	if rec.TraceID == "" {
		rec.TraceID = a.tracer.TraceID(ctx)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := a.audit.Append(actx, rec); err != nil {
		a.log.ErrorContext(ctx, "audit append", "event", rec.Event, "run_id", rec.RunID, "request_id", rec.RequestID, "err", err)
	}
}
