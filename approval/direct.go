package approval

// This file: the audit of calls that run without a request to claim — the
// gate let them through, ask-once memory remembered them, or a
// pre-authorisation covered them. Their entries come from the lifecycle
// like every other execution's (Executing, Finish), never from the
// executor.

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/countersign/countersign/approval/clip"
)

// DirectCall is a call that runs without a request to claim.
type DirectCall struct {
	// RequestID is the id the call runs under (its idempotency key).
	RequestID string
	RunID     string
	CallID    string
	Tool      string
	Args      json.RawMessage
	// Owner is who runs it (the executing process).
	Owner string
	// Secret names argument properties audited redacted, besides the
	// policy's for the tool (LifecycleOptions.Secret).
	Secret []string
	// TraceID is the trace of the run, "" when traces are off.
	TraceID string
	// Retry says it runs again after a process stopped mid-execution
	// (retry-safe tools only).
	Retry bool
}

// RunningDirect audits that c starts running: executing (with Retry, run
// again after a process stopped mid-execution).
func (l *Lifecycle) RunningDirect(ctx context.Context, c DirectCall) {
	l.append(ctx, nil, Record{Event: EventExecuting, RequestID: c.RequestID, RunID: c.RunID, Actor: c.Owner, Tool: c.Tool,
		Data: ExecutingEvent{CallID: c.CallID, Args: c.Args, Retry: c.Retry}, Secret: l.directSecret(c), TraceID: c.TraceID})
}

// RanDirect audits what became of c: executed, failed, or outcome_unknown
// (a process stopped while it ran, and its tool is not retry-safe).
func (l *Lifecycle) RanDirect(ctx context.Context, c DirectCall, o Outcome) {
	rec := outcomeRecord(c.RequestID, c.RunID, c.CallID, c.Owner, c.Tool, o)
	rec.Secret, rec.TraceID = l.directSecret(c), c.TraceID
	l.append(ctx, nil, rec)
}

func (l *Lifecycle) directSecret(c DirectCall) []string {
	s := l.secret(c.Tool)
	if len(c.Secret) == 0 {
		return s
	}
	return append(slices.Clip(s), c.Secret...)
}

// outcomeRecord is the audit record of what became of a call, gated
// (Finish) or direct (RanDirect): executed, failed, or outcome_unknown.
func outcomeRecord(requestID, runID, callID, owner, tool string, o Outcome) Record {
	ev := EventExecuted
	var data any = ExecutedEvent{CallID: callID, Result: clip.Bytes(o.Result, maxAuditResult), DurationMS: o.Took.Milliseconds()}
	switch o.Status {
	case StatusFailed:
		ev = EventFailed
	case StatusUnknown:
		ev, data = EventOutcomeUnknown, CallEvent{CallID: callID}
	}
	return Record{Event: ev, RequestID: requestID, RunID: runID, Actor: owner, Tool: tool, Data: data}
}
