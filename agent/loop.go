package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/approval"
)

// recordVersion is the version of the run record's JSON.
const recordVersion = 1

// record is a run as checkpointed in Redis after every step: the thread's
// conversation, the current turn's step, the batch in progress with each
// call's state and request id, status, origin, requester and counts.
type record struct {
	Version   int                            `json:"version"`
	ID        string                         `json:"id"`
	Origin    approval.Origin                `json:"origin"`
	Requester string                         `json:"requester"`
	Status    approval.RunStatus             `json:"status,omitempty"`
	Step      int                            `json:"step"`
	Messages  []openai.ChatCompletionMessage `json:"messages"`
	Batch     *batch                         `json:"batch,omitempty"`
	// Pending lists the request ids the run waits on (for operators).
	Pending []string `json:"pending,omitempty"`
	// Tally counts the current turn's calls.
	Tally approval.RunResult `json:"tally"`
	// Result is the ended turn's result; Posted says the bot has it.
	Result  *approval.RunResult `json:"result,omitempty"`
	Posted  bool                `json:"posted,omitempty"`
	Created time.Time           `json:"created"`
	Updated time.Time           `json:"updated"`
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
	stateAsk       callState = "ask"       // needs a human; request not yet created
	stateAsked     callState = "asked"     // request created; its record is the truth
	stateDone      callState = "done"      // Result is the tool message
)

// Call outcomes, counted in the run result.
const (
	outAuto       = "auto"
	outRemembered = "remembered"
	outPreauth    = "preauthorized" // ran under an approver's grant
	outApproved   = "approved"
	outEdited     = "edited"
	outRejected   = "rejected"
	outResponded  = "responded"
	outExpired    = "expired"
	outCancelled  = "cancelled"
	outRefused    = "refused"
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
	// Card is where the request's card was posted (the lifecycle's answer
	// to Create), kept to show the request as lost if the store loses it.
	Card approval.CardRef `json:"card,omitzero"`
}

// run is a run this process owns.
type run struct {
	id       string
	mu       sync.Mutex // guards rec and consumed
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
	if err := a.runs.Save(ctx, r.id, a.owner, b, r.consumed, active); err != nil {
		return fmt.Errorf("checkpoint run %s: %w", r.id, err)
	}
	r.consumed = 0
	return nil
}

// drive works on run id until it is idle (nothing queued) or ctx ends.
func (a *Agent) drive(ctx context.Context, id string) error {
	data, inbox, err := a.runs.Load(ctx, id)
	if errors.Is(err, approval.ErrNotFound) {
		// Nothing to do (the run ended long ago, or the store lost it):
		// drop the adoption hint so nobody adopts it again and again.
		return a.runs.Forget(ctx, id)
	}
	if err != nil {
		return err
	}
	r := &run{id: id}
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
		if _, _, lerr := a.runs.Load(lctx, id); errors.Is(lerr, approval.ErrNotFound) {
			a.loseRun(lctx, r)
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
					Requester: r.rec.Requester, Origin: r.rec.Origin, Card: c.Card, Status: approval.StatusLost})
				c.State, c.Outcome, c.Result = stateDone, outCancelled, "Not run: the approval request was lost."
			}
		}
	}
	r.mu.Unlock()
	for _, req := range lost {
		a.life.Lose(ctx, req)
	}
}

// steps drives run r until it is idle or an error stops it.
func (a *Agent) steps(ctx context.Context, r *run, inbox [][]byte, persisted bool) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec := r.rec // only this goroutine touches rec outside batches
		switch {
		case rec.Batch != nil:
			if err := a.runBatch(ctx, r); err != nil {
				return err
			}
		case rec.Result != nil && !rec.Posted:
			if err := a.post(ctx, r); err != nil {
				return err
			}
		case rec.Status == approval.RunActive || rec.Status == approval.RunWaiting:
			if err := a.step(ctx, r); err != nil {
				return err
			}
		case len(inbox) > 0:
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
			a.log.Error("drop undecodable task", "run_id", r.id, "err", err)
			continue
		}
		rec.Requester = t.Requester
		rec.Origin = t.Origin
		rec.Messages = append(rec.Messages, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleUser, Content: t.Text})
		a.record(ctx, approval.Record{Event: approval.EventRunStarted, RunID: r.id, Actor: t.Requester,
			Data: map[string]any{"origin": t.Origin, "text": t.Text, "event_id": t.EventID, "follow_up": followUp}})
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
	msg, err := a.complete(ctx, openai.ChatCompletionRequest{
		Model:    a.modelName,
		Messages: rec.Messages,
		Tools:    a.tools.offered,
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // shutting down or lease lost: the run resumes elsewhere
		}
		a.log.Error("model failed", "run_id", r.id, "err", err)
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
		Data: map[string]any{"status": st, "steps": rec.Step, "result": res}})
	return nil
}

// post hands the turn's result to the bot (at least once).
func (a *Agent) post(ctx context.Context, r *run) error {
	if err := a.notify.PostRunResult(ctx, *r.rec.Result); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Error("post run result", "run_id", r.id, "err", err)
	}
	r.rec.Posted = true
	return a.save(r)
}

// runBatch takes every call of the current batch to a tool message, then
// appends the messages in the original order (one per tool_call_id).
func (a *Agent) runBatch(ctx context.Context, r *run) error {
	b := r.rec.Batch
	// Calls found executing were started by a process that stopped before
	// recording their outcome.
	var orphaned []*call
	for _, c := range b.Calls {
		if c.State == stateExecuting {
			orphaned = append(orphaned, c)
		}
	}
	// 1. Check every new call and ask the gate.
	prepared := false
	for _, c := range b.Calls {
		if c.State == stateNew {
			a.prepare(ctx, r, c)
			prepared = true
		}
	}
	if prepared {
		if err := a.save(r); err != nil {
			return err
		}
	}
	// 2. One request per gated call, then its card.
	for _, c := range b.Calls {
		if c.State != stateAsk {
			continue
		}
		if err := a.createRequest(ctx, r, c); err != nil {
			return err
		}
	}
	// 3. Everything at once: calls let through run, gated calls are
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
		a.record(ctx, approval.Record{Event: approval.EventExecuting, RequestID: c.RequestID, RunID: r.id,
			Actor: a.owner, Tool: c.Tool, Data: map[string]any{"call_id": c.ID, "args": c.Args, "gated": false}, Secret: secretOf(c)})
	}
	if b.Stopped != "" {
		a.cancelPending(ctx, r, nil, b.Stopped)
	}
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
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
	for _, c := range toRun {
		goDo(func() error { return a.execDirect(bctx, r, c, false) })
	}
	for _, c := range orphaned {
		goDo(func() error { return a.execDirect(bctx, r, c, true) })
	}
	for _, c := range asked {
		goDo(func() error { return a.await(bctx, r, c) })
	}
	wg.Wait()
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
	var shown any = c.Raw
	if perr == nil {
		shown = args
	}
	data := map[string]any{"call_id": c.ID, "args": shown}
	if reason != "" {
		data["reason"] = reason
	}
	if confidence != nil {
		data["confidence"] = *confidence
	}
	a.record(ctx, approval.Record{Event: approval.EventProposed, RequestID: c.RequestID, RunID: r.id, Actor: "model",
		Tool: c.Tool, Data: data, Secret: pol.Secret})
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
		Data: map[string]any{"call_id": c.ID, "needs_human": as.NeedsHuman, "signals": as.Signals, "quorum": as.Policy.Quorum}, Secret: as.Policy.Secret})
	if !as.NeedsHuman {
		c.State, c.Outcome = stateRun, outAuto
		a.record(ctx, approval.Record{Event: approval.EventAutoApproved, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
			Data: map[string]any{"call_id": c.ID}})
		return
	}
	if as.Policy.Remember > 0 {
		digest, err := approval.Digest(args)
		if err == nil {
			ok, err := a.req.Remembered(ctx, rec.Requester, c.Tool, digest)
			if err != nil {
				a.log.Warn("ask-once lookup failed; asking a human", "run_id", r.id, "tool", c.Tool, "err", err)
			}
			if ok {
				c.State, c.Outcome = stateRun, outRemembered
				a.record(ctx, approval.Record{Event: approval.EventRemembered, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
					Data: map[string]any{"call_id": c.ID, "digest": digest, "requester": rec.Requester}})
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
		a.log.Warn("pre-authorisation lookup failed; asking a human", "run_id", r.id, "tool", c.Tool, "err", err)
		return false
	}
	if !g.Covers(c.Tool, rec.Requester, rec.Origin, as.Policy.Quorum, a.now()) {
		return false
	}
	c.State, c.Outcome = stateRun, outPreauth
	a.record(ctx, approval.Record{Event: approval.EventPreauthorized, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
		Data: map[string]any{"call_id": c.ID, "grant_id": g.ID, "granted_by": g.GrantedBy, "grant_request_id": g.RequestID,
			"expires": g.Expires, "signals": as.Signals}})
	// Approvers see in the granting card's thread what runs under it.
	if gr, err := a.req.Request(ctx, g.RequestID); err == nil && gr.Card.TS != "" {
		text := fmt.Sprintf("Running %s without a card under this pre-authorisation: %s (request %s)", c.Tool, truncate(string(c.Args), 1000), c.RequestID)
		if err := a.notify.Say(ctx, approval.Origin{Team: gr.Origin.Team, Channel: gr.Card.Channel, ThreadTS: gr.Card.TS}, text); err != nil {
			a.log.Warn("tell the granting card's thread", "run_id", r.id, "grant_id", g.ID, "err", err)
		}
	}
	return true
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
		Data: map[string]any{"call_id": c.ID, "error": why, "args": argsOrRaw(c)}, Secret: secret})
	a.done(r, c, outRefused, "error: "+why+". The call was not executed.", "")
}

// deny ends a call a deny rule refused: nobody is asked, the model is told
// the policy's reason.
func (a *Agent) deny(ctx context.Context, r *run, c *call, secret []string, d *approval.Denial) {
	why := "refused by policy: " + d.Reason
	a.record(ctx, approval.Record{Event: approval.EventCallRefused, RequestID: c.RequestID, RunID: r.id, Actor: "gate", Tool: c.Tool,
		Data: map[string]any{"call_id": c.ID, "error": why, "deny_rule": d.Rule, "args": argsOrRaw(c)}, Secret: secret})
	a.done(r, c, outRefused, "Not run: "+why+". Nobody was asked to approve it.", "")
	// The requester hears it from the policy, not only from the model.
	if err := a.notify.Say(ctx, r.origin(), fmt.Sprintf("⛔ %s was refused by policy: %s. Nobody was asked and nothing ran.", c.Tool, d.Reason)); err != nil {
		a.log.Warn("tell the task thread about a denial", "run_id", r.id, "tool", c.Tool, "err", err)
	}
}

func argsOrRaw(c *call) any {
	if len(c.Args) > 0 {
		return c.Args
	}
	return c.Raw
}

// done records a call's tool message and counts it. Callers in batch
// goroutines must not hold r.mu.
func (a *Agent) done(r *run, c *call, outcome, result, rejection string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.State, c.Outcome, c.Result = stateDone, outcome, result
	t := &r.rec.Tally
	switch outcome {
	case outAuto, outRemembered, outPreauth:
		t.AutoRun++
	case outApproved:
		t.Approved++
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
	timeout := pol.Timeout
	if timeout <= 0 {
		timeout = a.defaultTimeout
	}
	now := a.now().UTC()
	req := &approval.Request{
		ID: c.RequestID, RunID: r.id, CallID: c.ID, Requester: rec.Requester, Origin: rec.Origin,
		Tool: c.Tool, Risk: risk, Args: c.Args, Reason: c.Reason, Confidence: c.Confidence,
		Preview: a.preview(ctx, bt, c.Args), Signals: as.Signals,
		Decisions: pol.Decisions, Quorum: pol.Quorum, Approvers: pol.Approvers, Preauthorize: pol.Preauthorize,
		Created: now, Deadline: now.Add(timeout), Status: approval.StatusPending,
	}
	created, err := a.life.Create(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.log.Error("create request", "run_id", r.id, "request_id", c.RequestID, "err", err)
		// The record may have been written before the error (the store's
		// indexes are separate commands): close it, so no card, reminder
		// or late click can act on a request whose call was reported as
		// not run. Not found (never written) is the usual answer.
		if _, cerr := a.life.Cancel(ctx, c.RequestID, "countersign", "the approval request could not be saved"); cerr != nil && !errors.Is(cerr, approval.ErrNotFound) {
			a.log.Warn("cancel unsaved request", "request_id", c.RequestID, "err", cerr)
		}
		a.record(ctx, approval.Record{Event: approval.EventFailed, RequestID: c.RequestID, RunID: r.id, Actor: "agent", Tool: c.Tool,
			Data: map[string]any{"call_id": c.ID, "error": "the approval request could not be saved"}})
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
	p, err := t.Preview(pctx, args)
	if err != nil {
		p.Error = "preview unavailable: " + err.Error()
	}
	return p
}

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
		if _, err := a.life.Cancel(ctx, c.RequestID, "countersign", "the run stopped: "+why); err != nil && !errors.Is(err, approval.ErrAlreadyDecided) && !errors.Is(err, approval.ErrExpired) {
			a.log.Warn("cancel pending request", "run_id", r.id, "request_id", c.RequestID, "err", err)
		}
	}
}

// await waits for a gated call's decision and applies it.
func (a *Agent) await(ctx context.Context, r *run, c *call) error {
	last, err := a.req.Request(ctx, c.RequestID)
	if err == nil {
		// Created before a restart, or posted by a process that stopped
		// before binding its card: the lifecycle finds or posts it.
		last = a.life.EnsureCard(ctx, last)
	}
	backoff := 100 * time.Millisecond
	for {
		req, err := a.req.Wait(ctx, c.RequestID)
		if err == nil {
			return a.apply(ctx, r, c, req)
		}
		lost := errors.Is(err, approval.ErrNotFound)
		if ctx.Err() != nil {
			if !errors.Is(context.Cause(ctx), errRunLost) {
				return ctx.Err() // left pending: another process resumes the wait
			}
			lost, ctx = true, context.WithoutCancel(ctx)
		}
		if lost {
			// The store lost the request (Redis restarted without its
			// data): nothing ran and nothing will. Say so on the card and
			// in the thread rather than leave them waiting.
			if last == nil {
				r.mu.Lock()
				last = &approval.Request{ID: c.RequestID, RunID: r.id, CallID: c.ID, Tool: c.Tool, Origin: r.rec.Origin,
					Requester: r.rec.Requester, Card: c.Card}
				r.mu.Unlock()
			}
			a.life.Lose(ctx, last)
			a.done(r, c, outCancelled, "Not run: the approval request was lost.", "")
			return a.save(r)
		}
		a.log.Warn("wait for decision; retrying", "request_id", c.RequestID, "err", err)
		if err := a.sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

// apply turns a final request into the call's tool message, executing it
// when approved.
func (a *Agent) apply(ctx context.Context, r *run, c *call, req *approval.Request) error {
	dec := req.Decision
	approver := ""
	text := ""
	if dec != nil {
		approver, text = dec.Approver, dec.Text
	}
	md := messageData{Tool: c.Tool, Approver: approver, Args: string(req.Args)}
	switch req.Status {
	case approval.StatusApproved:
		return a.execGated(ctx, r, c, req)
	case approval.StatusExecuting:
		return a.orphanedGated(ctx, r, c, req)
	case approval.StatusExecuted, approval.StatusFailed:
		// Finished before a restart: the stored result is the truth.
		a.done(r, c, gatedOutcome(req), a.resultText(req, req.Result), "")
	case approval.StatusUnknown:
		a.done(r, c, outUnknown, a.msgs.Unknown(md), "")
	case approval.StatusRejected:
		md.Reason = text
		a.done(r, c, outRejected, a.msgs.Rejected(md), fmt.Sprintf("%s: %s (%s)", c.Tool, text, approver))
		if a.stopOnRejection || (c.Assessment != nil && c.Assessment.Policy.StopOnRejection) {
			why := fmt.Sprintf("%s was rejected by %s: %s", c.Tool, approver, text)
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
		a.done(r, c, outResponded, text, "")
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
	if req.Decision != nil && req.Decision.Verdict == approval.VerdictEdit {
		return req.Decision
	}
	for i := len(req.Approvals) - 1; i >= 0; i-- {
		if req.Approvals[i].Verdict == approval.VerdictEdit {
			return &req.Approvals[i]
		}
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

// execGated runs an approved request: bound to what was shown, claimed at
// most once, its outcome recorded.
func (a *Agent) execGated(ctx context.Context, r *run, c *call, req *approval.Request) error {
	if err := a.fence(ctx, r); err != nil {
		return err
	}
	bt := a.tools.byName[req.Tool]
	dec := req.Decision
	// notRun ends the request as failed (so it never runs later), audits
	// rec and tells the model why.
	notRun := func(why string, rec approval.Record) error {
		a.life.NotRun(ctx, req, a.owner, why, rec)
		a.done(r, c, outRefused, "Not run: "+why+".", "")
		return a.save(r)
	}
	if bt == nil {
		why := fmt.Sprintf("tool %q is not available in this process", req.Tool)
		return notRun(why, approval.Record{Event: approval.EventFailed, RequestID: req.ID, RunID: r.id, Actor: "agent", Tool: req.Tool,
			Data: map[string]any{"call_id": c.ID, "error": why}})
	}
	digest, err := approval.Digest(req.Args)
	bound := err == nil && digest == req.Digest && dec != nil && dec.Digest == req.Digest
	for _, ap := range req.Approvals {
		// Every approval counted toward the quorum was for these arguments.
		bound = bound && ap.Digest == req.Digest
	}
	if !bound {
		return notRun("the arguments differ from the ones the approver saw, so the approval does not apply",
			approval.Record{Event: approval.EventFailed, RequestID: req.ID, RunID: r.id, Actor: "agent", Tool: req.Tool,
				Data: map[string]any{"call_id": c.ID, "error": "arguments differ from the approved ones"}, Secret: secretOf(c)})
	}
	// The arguments about to run are validated again whoever wrote them:
	// an approver's edit (final, or followed by the approvals completing a
	// quorum) was never checked by the agent, and the model's were checked
	// against this process's schema only if it proposed them.
	if err := bt.validate(req.Args); err != nil {
		why, actor := fmt.Sprintf("the stored arguments are invalid: %v", err), "agent"
		if ed := editOf(req); ed != nil {
			why, actor = fmt.Sprintf("the arguments %s entered are invalid: %v", ed.Approver, err), ed.Approver
		}
		return notRun(why, approval.Record{Event: approval.EventCallRefused, RequestID: req.ID, RunID: r.id, Actor: actor, Tool: req.Tool,
			Data: map[string]any{"call_id": c.ID, "error": why, "args": req.Args}, Secret: secretOf(c)})
	}
	// Deny rules hold for what runs, not only for what the model proposed:
	// an approver's edit cannot take a call into refused ground.
	if as, err := a.gate.Assess(approval.ToolCall{ID: c.ID, Tool: req.Tool, Args: req.Args}, r.requester()); err == nil && as.Denied != nil {
		denied := as.Denied
		why, actor := "refused by policy: "+denied.Reason, "gate"
		if ed := editOf(req); ed != nil {
			why = fmt.Sprintf("the arguments %s entered are %s", ed.Approver, why)
		}
		return notRun(why, approval.Record{Event: approval.EventCallRefused, RequestID: req.ID, RunID: r.id, Actor: actor, Tool: req.Tool,
			Data: map[string]any{"call_id": c.ID, "error": why, "deny_rule": denied.Rule, "args": req.Args}, Secret: secretOf(c)})
	}
	claimed, err := a.life.Claim(ctx, req.ID, a.owner)
	if err != nil {
		if errors.Is(err, approval.ErrAlreadyClaimed) {
			fresh, ferr := a.req.Request(ctx, req.ID)
			if ferr != nil {
				return ferr
			}
			return a.apply(ctx, r, c, fresh)
		}
		return err
	}
	return a.runGated(ctx, r, c, bt, claimed, false)
}

// fence confirms, by renewing it, that this process still holds the lease
// of run r, right before a step that cannot be undone: claiming a request
// for execution (or failing it), or deciding what to do with one found
// executing. Run records are fenced by the lease in the save script, but
// requests are not, and the heartbeat notices a lapsed lease only on its
// next tick; a wait that ends in between must not let a process whose run
// was adopted elsewhere claim the request too (the adopter would then find
// it executing and report its outcome unknown, or re-send it).
func (a *Agent) fence(ctx context.Context, r *run) error {
	ok, err := a.runs.Extend(ctx, r.id, a.owner, a.leaseTTL)
	if err != nil {
		return fmt.Errorf("run %s: confirm lease: %w", r.id, err)
	}
	if !ok {
		return fmt.Errorf("run %s: %w", r.id, errLeaseLost)
	}
	return nil
}

// runGated executes a claimed request and records the outcome.
func (a *Agent) runGated(ctx context.Context, r *run, c *call, bt *boundTool, req *approval.Request, retry bool) error {
	if retry {
		a.life.Executing(ctx, req, a.owner, true) // Claim audited the first run
	}
	// The tool finishes even when the run is stopping: an execution that
	// started is carried to a recorded outcome.
	xctx := context.WithoutCancel(ctx)
	started := a.now()
	out, runErr := bt.Run(xctx, Invocation{RequestID: req.ID, Args: req.Args})
	took := a.now().Sub(started)
	st, text := approval.StatusExecuted, out
	if runErr != nil {
		st, text = approval.StatusFailed, "error: "+runErr.Error()
	}
	fin, err := a.life.Finish(xctx, req.ID, a.owner, approval.Outcome{Status: st, Result: text, Took: took})
	if err != nil {
		a.log.Error("record outcome", "request_id", req.ID, "err", err)
		if !errors.Is(err, approval.ErrAlreadyClaimed) && !errors.Is(err, approval.ErrNotApproved) {
			return err
		}
		// Someone else recorded an outcome (a process that adopted this
		// run): theirs stands, and this run no longer owns the call.
		return fmt.Errorf("request %s: outcome already recorded elsewhere", req.ID)
	}
	if st == approval.StatusExecuted && c.Assessment != nil && c.Assessment.Policy.Remember > 0 {
		if err := a.req.Remember(xctx, req.Requester, req.Tool, req.Digest, c.Assessment.Policy.Remember); err != nil {
			a.log.Warn("remember approval", "request_id", req.ID, "err", err)
		}
	}
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
		return a.runGated(ctx, r, c, bt, req, true)
	}
	md := messageData{Tool: req.Tool, Args: string(req.Args)}
	text := a.msgs.Unknown(md)
	_, err := a.life.Finish(context.WithoutCancel(ctx), req.ID, a.owner, approval.Outcome{Status: approval.StatusUnknown,
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

// unknown tells the model and the task thread that c's outcome is unknown.
func (a *Agent) unknown(ctx context.Context, r *run, c *call, text string) {
	a.done(r, c, outUnknown, text, "")
	if err := a.notify.Say(ctx, r.origin(), fmt.Sprintf(
		"The outcome of %s (%s) is unknown: it was started but the process stopped before recording a result. It was not run again; please check the system of record.",
		c.Tool, c.RequestID)); err != nil {
		a.log.Warn("say outcome unknown", "run_id", r.id, "err", err)
	}
}

// execDirect runs a call the gate let through (or ask-once remembered). It
// was checkpointed as executing before it started; orphaned says a
// previous process did that and stopped without an outcome.
func (a *Agent) execDirect(ctx context.Context, r *run, c *call, orphaned bool) error {
	bt := a.tools.byName[c.Tool]
	if orphaned && (bt == nil || !isRetrySafe(bt.Tool)) {
		a.record(ctx, approval.Record{Event: approval.EventOutcomeUnknown, RequestID: c.RequestID, RunID: r.id, Actor: a.owner, Tool: c.Tool,
			Data: map[string]any{"call_id": c.ID}, Secret: secretOf(c)})
		a.unknown(ctx, r, c, a.msgs.Unknown(messageData{Tool: c.Tool, Args: string(c.Args)}))
		return a.save(r)
	}
	if orphaned {
		a.record(ctx, approval.Record{Event: approval.EventExecuting, RequestID: c.RequestID, RunID: r.id, Actor: a.owner, Tool: c.Tool,
			Data: map[string]any{"call_id": c.ID, "args": c.Args, "gated": false, "retry": true}, Secret: secretOf(c)})
	}
	xctx := context.WithoutCancel(ctx)
	started := a.now()
	out, err := bt.Run(xctx, Invocation{RequestID: c.RequestID, Args: c.Args})
	took := a.now().Sub(started)
	ev, text := approval.EventExecuted, out
	if err != nil {
		ev, text = approval.EventFailed, "error: "+err.Error()
	}
	a.record(xctx, approval.Record{Event: ev, RequestID: c.RequestID, RunID: r.id, Actor: a.owner, Tool: c.Tool,
		Data: map[string]any{"call_id": c.ID, "result": truncate(text, 2000), "duration_ms": took.Milliseconds()}, Secret: secretOf(c)})
	outcome := c.Outcome
	if outcome == "" {
		outcome = outAuto
	}
	a.done(r, c, outcome, text, "")
	return a.save(r)
}

// record appends to the audit stream. A failed append is logged: the
// action it describes already happened (or was refused) and is also in the
// request or run record.
func (a *Agent) record(ctx context.Context, rec approval.Record) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := a.audit.Append(actx, rec); err != nil {
		a.log.Error("audit append", "event", rec.Event, "run_id", rec.RunID, "request_id", rec.RequestID, "err", err)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("… [truncated, %d bytes in all]", len(s))
}
