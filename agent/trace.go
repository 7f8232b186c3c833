package agent

// This file: what the agent needs of a tracer, and the one it uses when
// traces are off.

import (
	"context"

	"github.com/countersign/countersign/approval"
)

// Tracer records a run's work as trace spans: a span per turn of a run
// worked on by this process, a child per model call and per tool call, and
// a grandchild for the human decision of a gated call (so a rejected call
// that never executed is still visible). agent/tracing implements it with
// OpenTelemetry; the agent speaks to it in its own terms only, so nothing
// but that package knows span or attribute names. Implementations must be
// safe for concurrent use; spans must never carry secrets or arguments.
type Tracer interface {
	// StartRun starts the span of run id's current turn in this process.
	// parent is the trace context saved on the run record (Span.Context)
	// when the turn started, possibly in another process: the span
	// continues that trace; "" starts a new trace.
	StartRun(ctx context.Context, id, parent string) (context.Context, Span)
	// StartModelCall starts the span of one chat completion request.
	StartModelCall(ctx context.Context, model string) (context.Context, Span)
	// StartToolCall starts the span of one proposed tool call, from its
	// check to its tool message (gate, approval wait, execution).
	// requestID is the call's request id (also its idempotency key).
	StartToolCall(ctx context.Context, c approval.ToolCall, requestID string) (context.Context, Span)
	// Decided records the decision on final request r (verdict, approver,
	// wait from creation to decision, the policy signals) under the tool
	// call span in ctx.
	Decided(ctx context.Context, r *approval.Request)
	// TraceID is the trace id of the span in ctx (32 hex digits), "" when
	// there is none: it goes into audit entries and request records.
	TraceID(ctx context.Context) string
}

// Span is a span the agent started and ends.
type Span interface {
	// Context is the span's trace context as a W3C traceparent, saved on
	// the run record so that another process continues the trace; "" when
	// the span records nothing.
	Context() string
	// End ends the span with outcome (a call's outcome, a run's status);
	// failed marks it as an error. Ending twice does nothing.
	End(outcome string, failed bool)
}

// noTracer is the Tracer of an agent without traces.
type noTracer struct{}

func (noTracer) StartRun(ctx context.Context, _, _ string) (context.Context, Span) {
	return ctx, noSpan{}
}

func (noTracer) StartModelCall(ctx context.Context, _ string) (context.Context, Span) {
	return ctx, noSpan{}
}

func (noTracer) StartToolCall(ctx context.Context, _ approval.ToolCall, _ string) (context.Context, Span) {
	return ctx, noSpan{}
}

func (noTracer) Decided(context.Context, *approval.Request) {}

func (noTracer) TraceID(context.Context) string { return "" }

type noSpan struct{}

func (noSpan) Context() string  { return "" }
func (noSpan) End(string, bool) {}
