package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/agent/tracing"
	"github.com/countersign/countersign/approval"
)

// traces is an in-memory span exporter behind a real SDK tracer provider.
type traces struct {
	exp *tracetest.InMemoryExporter
	tr  *tracing.Tracer
}

func newTraces(tb testing.TB) *traces {
	tb.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &traces{exp: exp, tr: tracing.New(tp)}
}

func (tr *traces) option() processOption {
	return func(o *agent.Options) { o.Tracer = tr.tr }
}

// named returns the exported spans called name.
func (tr *traces) named(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only exported span called name.
func (tr *traces) one(tb testing.TB, name string) tracetest.SpanStub {
	tb.Helper()
	got := tr.named(name)
	if len(got) != 1 {
		var names []string
		for _, s := range tr.exp.GetSpans() {
			names = append(names, s.Name)
		}
		tb.Fatalf("spans named %q = %d, want 1 (spans: %v)", name, len(got), names)
	}
	return got[0]
}

func attrOf(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs checks string attributes of s.
func wantAttrs(tb testing.TB, s tracetest.SpanStub, want map[string]string) {
	tb.Helper()
	for k, v := range want {
		got, ok := attrOf(s, k)
		if !ok || got.Emit() != v {
			tb.Errorf("span %q attribute %s = %q (set %v), want %q", s.Name, k, got.Emit(), ok, v)
		}
	}
}

func childOf(tb testing.TB, child, parent tracetest.SpanStub) {
	tb.Helper()
	if child.Parent.SpanID() != parent.SpanContext.SpanID() || child.SpanContext.TraceID() != parent.SpanContext.TraceID() {
		tb.Errorf("span %q has parent %s in trace %s, want %q (%s in trace %s)", child.Name, child.Parent.SpanID(),
			child.SpanContext.TraceID(), parent.Name, parent.SpanContext.SpanID(), parent.SpanContext.TraceID())
	}
}

// TestTraces runs approve, reject and auto-run flows through the agent with
// the real go-openai client and asserts the span tree, the GenAI
// attributes, the approval span, and the trace id on the request record
// and on every audit entry of the run (the chain still verifying).
func TestTraces(t *testing.T) {
	tests := []struct {
		name        string
		call        scripted.Call
		verdict     approval.Verdict // "" for a call the gate lets through
		text        string
		wantOutcome string
		wantStatus  approval.Status
		wantError   bool // the tool call span's status
	}{
		{name: "approve", call: call("call_1", "issue_refund", refundArgs), verdict: approval.VerdictApprove,
			wantOutcome: "approved", wantStatus: approval.StatusApproved},
		{name: "reject", call: call("call_1", "issue_refund", refundArgs), verdict: approval.VerdictReject,
			text: "ask for a photo first", wantOutcome: "rejected", wantStatus: approval.StatusRejected},
		{name: "auto", call: call("call_1", "lookup_order", `{"order_id":"1234"}`), wantOutcome: "auto"},
		{name: "approved, tool fails", call: call("call_1", "issue_refund", `{"order_id":"1234","amount":9999,"reason":"x"}`),
			verdict: approval.VerdictApprove, wantOutcome: "approved", wantStatus: approval.StatusApproved, wantError: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			tr := newTraces(t)
			p := w.start(tr.option())
			w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{tc.call}}, scripted.Reply{Content: "All done."})
			p.handle(t, task("please handle it"))
			var card *approval.Request
			if tc.verdict != "" {
				card = recv(t, p.notify.cards, "the approval card")
				w.decide(card, tc.verdict, tc.text, nil)
			}
			res := recv(t, p.notify.results, "the run result")
			// The run's spans end when its worker does.
			if err := p.agent.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}

			run := tr.one(t, "invoke_agent countersign")
			if run.Parent.IsValid() {
				t.Errorf("run span has parent %s, want a new trace", run.Parent.SpanID())
			}
			wantAttrs(t, run, map[string]string{"gen_ai.operation.name": "invoke_agent", "countersign.run.id": res.RunID,
				"gen_ai.conversation.id": res.RunID, "countersign.run.status": "done"})
			chats := tr.named("chat scripted")
			if len(chats) != 2 {
				t.Fatalf("chat spans = %d, want 2", len(chats))
			}
			for _, c := range chats {
				childOf(t, c, run)
				wantAttrs(t, c, map[string]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "scripted"})
			}
			tool := tr.one(t, "execute_tool "+tc.call.Tool)
			childOf(t, tool, run)
			wantAttrs(t, tool, map[string]string{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tc.call.Tool,
				"gen_ai.tool.call.id": "call_1", "gen_ai.tool.type": "function", "countersign.call.outcome": tc.wantOutcome})
			if got := tool.Status.Code == codes.Error; got != tc.wantError {
				t.Errorf("tool call span status = %v, want error %v", tool.Status, tc.wantError)
			}
			reqID, _ := attrOf(tool, "countersign.request.id")
			approvals := tr.named("approval " + tc.call.Tool)
			if tc.verdict == "" {
				if len(approvals) != 0 {
					t.Errorf("approval spans = %d for a call the gate let through, want 0", len(approvals))
				}
			} else {
				if reqID.AsString() != card.ID {
					t.Errorf("tool span request id = %q, want %q", reqID.AsString(), card.ID)
				}
				ap := tr.one(t, "approval "+tc.call.Tool)
				childOf(t, ap, tool)
				wantAttrs(t, ap, map[string]string{"countersign.approval.verdict": string(tc.verdict),
					"countersign.approval.approver": "U_APPROVER", "countersign.request.status": string(tc.wantStatus),
					"countersign.request.id": card.ID, "gen_ai.tool.name": tc.call.Tool})
				final := w.request(card.ID)
				var wantSignals []string
				for _, s := range final.Signals {
					wantSignals = append(wantSignals, s.Code)
				}
				if sig, _ := attrOf(ap, "countersign.approval.signals"); len(wantSignals) == 0 || !slices.Equal(sig.AsStringSlice(), wantSignals) {
					t.Errorf("approval signals = %v, want %v (non-empty)", sig.AsStringSlice(), wantSignals)
				}
				wait, _ := attrOf(ap, "countersign.approval.wait_ms")
				if want := final.Decision.At.Sub(final.Created).Milliseconds(); wait.AsInt64() != want {
					t.Errorf("approval wait_ms = %d, want %d (decision time - creation)", wait.AsInt64(), want)
				}
				if !ap.StartTime.Equal(final.Created) || !ap.EndTime.Equal(final.Decision.At) {
					t.Errorf("approval span %v → %v, want %v → %v", ap.StartTime, ap.EndTime, final.Created, final.Decision.At)
				}
				if final.TraceID != run.SpanContext.TraceID().String() {
					t.Errorf("request trace id = %q, want the run's %s", final.TraceID, run.SpanContext.TraceID())
				}
			}
			// Every span is in one trace, and so is every audit entry of the run.
			traceID := run.SpanContext.TraceID().String()
			for _, s := range tr.exp.GetSpans() {
				if s.SpanContext.TraceID().String() != traceID {
					t.Errorf("span %q in trace %s, want %s", s.Name, s.SpanContext.TraceID(), traceID)
				}
			}
			n := 0
			for _, e := range w.events() {
				if e.RunID != res.RunID {
					continue
				}
				n++
				if e.TraceID != traceID {
					t.Errorf("audit %s trace_id = %q, want %s", e.Event, e.TraceID, traceID)
				}
			}
			if n < 5 {
				t.Errorf("audit entries of the run = %d, want at least 5", n)
			}
			if _, err := w.audit.Verify(context.Background()); err != nil {
				t.Errorf("Verify with trace ids: %v", err)
			}
		})
	}
}

// syncBuffer is a log destination safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTraceIDInRunLogs: a run's log lines carry its trace id (through
// tracing.LogHandler), and a failed run's span is marked as an error.
func TestTraceIDInRunLogs(t *testing.T) {
	w := newWorld(t)
	tr := newTraces(t)
	var logs syncBuffer
	logger := slog.New(tracing.LogHandler(slog.NewJSONHandler(&logs, nil)))
	p := w.start(tr.option(), func(o *agent.Options) { o.Logger = logger })
	w.model.Enqueue(scripted.Reply{Status: 500}, scripted.Reply{Status: 502}, scripted.Reply{Status: 503})
	p.handle(t, task("hello"))
	res := recv(t, p.notify.results, "the run result")
	if err := p.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if res.Status != approval.RunFailed {
		t.Fatalf("result = %+v, want failed", res)
	}
	run := tr.one(t, "invoke_agent countersign")
	if run.Status.Code != codes.Error {
		t.Errorf("failed run span status = %v, want error", run.Status)
	}
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && m["msg"] == "model failed" {
			line = m
		}
	}
	if line == nil {
		t.Fatalf("no \"model failed\" line in the logs:\n%s", logs.String())
	}
	if line["trace_id"] != run.SpanContext.TraceID().String() || line["run_id"] != res.RunID {
		t.Errorf("log line = %v, want trace_id %s and run_id %s", line, run.SpanContext.TraceID(), res.RunID)
	}
}

// TestResumedRunContinuesTrace: a run stopped while it waits and adopted
// by another process continues the trace saved on its run record: the
// second process's run span is a child of the first's.
func TestResumedRunContinuesTrace(t *testing.T) {
	w := newWorld(t)
	tr := newTraces(t)
	p1 := w.start(tr.option())
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("k1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "done later"})
	p1.handle(t, task("refund it"))
	card := recv(t, p1.notify.cards, "the card")
	if err := p1.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	first := tr.one(t, "invoke_agent countersign")
	wantAttrs(t, first, map[string]string{"countersign.run.status": "interrupted"})
	wantAttrs(t, tr.one(t, "execute_tool issue_refund"), map[string]string{"countersign.call.outcome": "interrupted"})
	w.decide(card, approval.VerdictApprove, "", nil)

	p2 := w.start(tr.option())
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v, want 1 run adopted", n, err)
	}
	recv(t, p2.notify.results, "the run result")
	if err := p2.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	runs := tr.named("invoke_agent countersign")
	if len(runs) != 2 {
		t.Fatalf("run spans = %d, want 2 (one per process)", len(runs))
	}
	second := runs[1]
	childOf(t, second, first)
	wantAttrs(t, second, map[string]string{"countersign.run.resumed": "true", "countersign.run.status": "done"})
	tools := tr.named("execute_tool issue_refund")
	if len(tools) != 2 {
		t.Fatalf("tool spans = %d, want 2 (one per process)", len(tools))
	}
	childOf(t, tools[1], second)
	wantAttrs(t, tools[1], map[string]string{"countersign.call.outcome": "approved"})
	childOf(t, tr.one(t, "approval issue_refund"), tools[1])
	if got := w.request(card.ID).TraceID; got != first.SpanContext.TraceID().String() {
		t.Errorf("request trace id = %q, want %s", got, first.SpanContext.TraceID())
	}
}

// TestTraceStartsOnResume: a turn begun with traces off gets its trace
// from the first process that works on it with traces on, and the
// process after that continues it.
func TestTraceStartsOnResume(t *testing.T) {
	w := newWorld(t)
	tr := newTraces(t)
	p1 := w.start() // traces off
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("k1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "done"})
	p1.handle(t, task("refund it"))
	card := recv(t, p1.notify.cards, "the card")
	if err := p1.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	resume := func(p *process) {
		t.Helper()
		if n, err := p.agent.Resume(context.Background()); err != nil || n != 1 {
			t.Fatalf("Resume = %d, %v, want 1 run adopted", n, err)
		}
	}
	waiting := make(chan string, 10)
	p2 := w.start(tr.option(), func(o *agent.Options) { o.Requests = waitSignal{Requests: o.Requests, ch: waiting} })
	resume(p2)
	recv(t, waiting, "p2 waiting for the decision") // its turn's trace is saved by then
	if err := p2.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	p3 := w.start(tr.option())
	resume(p3)
	recv(t, p3.notify.results, "the run result")
	if err := p3.agent.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	runs := tr.named("invoke_agent countersign")
	if len(runs) != 2 {
		t.Fatalf("run spans = %d, want 2 (the processes with traces on)", len(runs))
	}
	if runs[0].Parent.IsValid() {
		t.Errorf("first traced span has a parent; want the trace to start there")
	}
	childOf(t, runs[1], runs[0])
}
