// Package tracing is OpenTelemetry's one home in Countersign: it turns the
// agent's runs into trace spans (Tracer, which implements agent.Tracer),
// exports them over OTLP/HTTP when the standard OTEL_* environment
// variables ask for it (Start), and puts trace ids on log lines
// (LogHandler). Nothing else imports go.opentelemetry.io: the agent speaks
// to it through the small interface it declares, and cmd/countersign only
// wires it.
//
// Spans (attribute names follow the OpenTelemetry GenAI semantic
// conventions where one exists, countersign.* otherwise):
//
//	invoke_agent countersign   one turn of a run worked on by one process
//	├─ chat <model>            one chat completion request
//	└─ execute_tool <tool>     one proposed tool call, from its check to its tool message
//	   └─ approval <tool>      the human (or clock) decision, from the request's creation to the decision
//
// No span carries tool arguments, results, reasons or message text: only
// names, ids, verdicts, outcomes, signal codes and durations.
package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval"
)

// InstrumentationName names the tracer (the instrumentation scope).
const InstrumentationName = "github.com/countersign/countersign/agent"

// Span and attribute names.
const (
	AttrOperation    = "gen_ai.operation.name" // invoke_agent, chat, execute_tool
	AttrAgentName    = "gen_ai.agent.name"
	AttrConversation = "gen_ai.conversation.id" // the run id
	AttrProvider     = "gen_ai.provider.name"
	AttrModel        = "gen_ai.request.model"
	AttrToolName     = "gen_ai.tool.name"
	AttrToolCallID   = "gen_ai.tool.call.id"
	AttrToolType     = "gen_ai.tool.type"

	AttrRunID       = "countersign.run.id"
	AttrRunResumed  = "countersign.run.resumed" // the turn started in another span (often another process)
	AttrRunStatus   = "countersign.run.status"  // done, failed, stopped, max_steps, interrupted
	AttrRequestID   = "countersign.request.id"
	AttrCallOutcome = "countersign.call.outcome" // auto, remembered, preauthorized, approved, edited, rejected, responded, expired, cancelled, refused, unknown, interrupted

	AttrVerdict   = "countersign.approval.verdict" // approve, edit, reject, respond, expire, cancel
	AttrApprover  = "countersign.approval.approver"
	AttrApprovers = "countersign.approval.approvers" // every approval counted toward the quorum
	AttrWaitMS    = "countersign.approval.wait_ms"   // from the request's creation to the decision
	AttrSignals   = "countersign.approval.signals"   // the policy signals' codes
	AttrStatus    = "countersign.request.status"
)

// Tracer records the agent's runs with an OpenTelemetry tracer. It is safe
// for concurrent use.
type Tracer struct {
	t trace.Tracer
}

var _ agent.Tracer = (*Tracer)(nil)

// New returns a Tracer over tp.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{t: tp.Tracer(InstrumentationName)}
}

// StartRun starts the span of a run's turn, continuing the trace in parent
// (a W3C traceparent) when it names one.
func (t *Tracer) StartRun(ctx context.Context, id, parent string) (context.Context, agent.Span) {
	attrs := []attribute.KeyValue{
		attribute.String(AttrOperation, "invoke_agent"),
		attribute.String(AttrAgentName, "countersign"),
		attribute.String(AttrConversation, id),
		attribute.String(AttrRunID, id),
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	var tc propagation.TraceContext
	pctx := tc.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	if parent != "" && trace.SpanContextFromContext(pctx).IsValid() {
		ctx = pctx
		attrs = append(attrs, attribute.Bool(AttrRunResumed, true))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	ctx, s := t.t.Start(ctx, "invoke_agent countersign", opts...)
	return ctx, span{s: s, outcome: AttrRunStatus}
}

// StartModelCall starts the span of one chat completion request.
func (t *Tracer) StartModelCall(ctx context.Context, model string) (context.Context, agent.Span) {
	ctx, s := t.t.Start(ctx, "chat "+model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String(AttrOperation, "chat"),
		attribute.String(AttrProvider, "openai"),
		attribute.String(AttrModel, model),
	))
	return ctx, span{s: s}
}

// StartToolCall starts the span of one proposed tool call.
func (t *Tracer) StartToolCall(ctx context.Context, c approval.ToolCall, requestID string) (context.Context, agent.Span) {
	ctx, s := t.t.Start(ctx, "execute_tool "+c.Tool, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(
		attribute.String(AttrOperation, "execute_tool"),
		attribute.String(AttrToolName, c.Tool),
		attribute.String(AttrToolCallID, c.ID),
		attribute.String(AttrToolType, "function"),
		attribute.String(AttrRequestID, requestID),
	))
	return ctx, span{s: s, outcome: AttrCallOutcome}
}

// Decided records the decision on final request r as a span from its
// creation to the decision, under the span in ctx.
func (t *Tracer) Decided(ctx context.Context, r *approval.Request) {
	end := time.Now()
	attrs := []attribute.KeyValue{
		attribute.String(AttrToolName, r.Tool),
		attribute.String(AttrRequestID, r.ID),
		attribute.String(AttrStatus, string(r.Status)),
	}
	if d := r.Decision; d != nil {
		end = d.At
		attrs = append(attrs, attribute.String(AttrVerdict, string(d.Verdict)))
		if d.Approver != "" {
			attrs = append(attrs, attribute.String(AttrApprover, d.Approver))
		}
	}
	if len(r.Approvals) > 0 {
		who := make([]string, 0, len(r.Approvals))
		for _, a := range r.Approvals {
			who = append(who, a.Approver)
		}
		attrs = append(attrs, attribute.StringSlice(AttrApprovers, who))
	}
	signals := make([]string, 0, len(r.Signals))
	for _, s := range r.Signals {
		signals = append(signals, s.Code)
	}
	attrs = append(attrs, attribute.StringSlice(AttrSignals, signals),
		attribute.Int64(AttrWaitMS, end.Sub(r.Created).Milliseconds()))
	_, s := t.t.Start(ctx, "approval "+r.Tool, trace.WithTimestamp(r.Created),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(end))
}

// TraceID is the trace id of the span in ctx, "" when none.
func (t *Tracer) TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// span is an agent.Span over an OpenTelemetry span; outcome names the
// attribute End sets, "" for none.
type span struct {
	s       trace.Span
	outcome string
}

func (s span) Context() string {
	c := propagation.MapCarrier{}
	var tc propagation.TraceContext
	tc.Inject(trace.ContextWithSpan(context.Background(), s.s), c)
	return c.Get("traceparent")
}

func (s span) End(outcome string, failed bool) {
	if s.outcome != "" && outcome != "" {
		s.s.SetAttributes(attribute.String(s.outcome, outcome))
	}
	if failed {
		s.s.SetStatus(codes.Error, outcome)
	}
	s.s.End()
}
