package main_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/bot/slacksim"
)

// otlpReceiver collects the spans of OTLP/HTTP protobuf export requests.
type otlpReceiver struct {
	mu    sync.Mutex // guards spans
	spans []*tracepb.Span
}

func (rc *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "want an OTLP trace export", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			rc.spans = append(rc.spans, ss.Spans...)
		}
	}
	rc.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (rc *otlpReceiver) named(name string) []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range rc.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// TestDemoTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, the process wired
// by Main exports a run's spans to that OTLP/HTTP endpoint (flushed by
// Close), and the trace id of those spans is on every audit entry of the
// request, including the decision recorded by the approver's click.
func TestDemoTraces(t *testing.T) {
	rc := &otlpReceiver{}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 9012 is late, email the customer an apology", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the email card", func() bool { _, ok := cardFor(d, "send_email"); return ok })
	card, _ := cardFor(d, "send_email")
	if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click(respond): %v", err)
	}
	v := openModal(t, d, cast.Approver.ID)
	if res, err := ws.SubmitView(cast.Approver.ID, v.ID, map[string]map[string]any{"response": {"text": "Called them instead."}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(response) = %+v, %v; want closed", res, err)
	}
	// The run's answer (the decision line, posted at the click, says the
	// same words before the run has ended its spans).
	waitBotReply(t, d, "the answer", root, nil, "here is what happened", "called them instead")
	if err := d.Close(); err != nil { // flushes the spans
		t.Fatalf("Close: %v", err)
	}

	runs, tools, approvals := rc.named("invoke_agent countersign"), rc.named("execute_tool send_email"), rc.named("approval send_email")
	if len(runs) != 1 || len(tools) != 1 || len(approvals) != 1 {
		t.Fatalf("spans received: %d runs, %d send_email calls, %d approvals; want 1 each", len(runs), len(tools), len(approvals))
	}
	if got := spanAttr(tools[0], "countersign.call.outcome"); got != "responded" {
		t.Errorf("tool call outcome = %q, want responded", got)
	}
	if spanAttr(approvals[0], "countersign.approval.verdict") != "respond" || spanAttr(approvals[0], "countersign.approval.approver") != cast.Approver.ID {
		t.Errorf("approval span = %v, want respond by %s", approvals[0].Attributes, cast.Approver.ID)
	}
	traceID := hex.EncodeToString(runs[0].TraceId)
	reqID := spanAttr(tools[0], "countersign.request.id")
	es, err := d.Main.Audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	x := auditreport.NewExporter()
	events := map[string]bool{}
	for _, e := range es {
		x.Add(e)
		if e.RequestID != reqID {
			continue
		}
		events[string(e.Event)] = true
		if e.TraceID != traceID {
			t.Errorf("audit %s trace_id = %q, want %s", e.Event, e.TraceID, traceID)
		}
	}
	for _, ev := range []string{"proposed", "requested", "card_posted", "decided"} {
		if !events[ev] {
			t.Errorf("no %s entry for request %s (entries: %v)", ev, reqID, events)
		}
	}
	// `audit export` names the trace of each request.
	exported := ""
	for _, r := range x.Records(nil) {
		if r.RequestID == reqID {
			exported = r.TraceID
		}
	}
	if exported != traceID {
		t.Errorf("export record trace_id = %q, want %s", exported, traceID)
	}
}
