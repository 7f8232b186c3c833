package tracing_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/countersign/countersign/agent/tracing"
	"github.com/countersign/countersign/approval"
)

func TestEnabled(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    bool
		wantErr string // the variable the error must name
	}{
		{name: "nothing set", env: nil, want: false},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, want: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, want: true},
		{name: "exporter otlp, default endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: true},
		{name: "exporter none wins over an endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: false},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: false},
		{name: "explicit http/protobuf", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, want: true},
		{name: "unsupported exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "traces json", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, wantErr: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tracing.Enabled(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr+":") {
					t.Errorf("Enabled = %v, %v; want an error naming %s", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Enabled = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// receiver is an OTLP/HTTP trace receiver: it decodes every export request.
type receiver struct {
	srv *httptest.Server

	mu   sync.Mutex // guards reqs and paths
	reqs []*coltracepb.ExportTraceServiceRequest
	path []string
}

func newReceiver(tb testing.TB) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want a protobuf body", http.StatusUnsupportedMediaType)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, &req)
		rc.path = append(rc.path, r.Method+" "+r.URL.Path)
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	tb.Cleanup(rc.srv.Close)
	return rc
}

// spans returns every span received, with its resource's attributes.
func (rc *receiver) spans() ([]*tracepb.Span, map[string]string, []string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	res := map[string]string{}
	for _, req := range rc.reqs {
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				res[kv.Key] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				out = append(out, ss.Spans...)
			}
		}
	}
	return out, res, append([]string(nil), rc.path...)
}

func attrs(s *tracepb.Span) map[string]*commonpb.AnyValue {
	m := map[string]*commonpb.AnyValue{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestOTLPExportFromEnv: with only the standard OTEL_* variables set,
// Start exports the agent's spans over OTLP/HTTP (protobuf) to the
// endpoint they name, with the resource they describe; Shutdown flushes.
func TestOTLPExportFromEnv(t *testing.T) {
	rc := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.srv.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	ctx := context.Background()
	p, err := tracing.Start(ctx, os.Getenv, "1.2.3")
	if err != nil || p == nil {
		t.Fatalf("Start = %v, %v; want a provider", p, err)
	}
	tr := p.Tracer()
	rctx, run := tr.StartRun(ctx, "run_abc", "")
	cctx, tool := tr.StartToolCall(rctx, approval.ToolCall{ID: "call_1", Tool: "issue_refund"}, "req_xyz")
	created := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tr.Decided(cctx, &approval.Request{ID: "req_xyz", Tool: "issue_refund", Status: approval.StatusRejected, Created: created,
		Signals:  []approval.Signal{{Code: "review_always"}, {Code: "sensitive_capability"}},
		Decision: &approval.Decision{Verdict: approval.VerdictReject, Approver: "U_BOB", At: created.Add(90 * time.Second)}})
	tool.End("rejected", false)
	run.End("done", false)
	traceID := tr.TraceID(rctx)
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	spans, res, paths := rc.spans()
	if len(paths) == 0 || paths[0] != "POST /v1/traces" {
		t.Fatalf("export requests = %v, want POST /v1/traces", paths)
	}
	for k, want := range map[string]string{"service.name": "countersign", "service.version": "1.2.3", "deployment.environment.name": "test"} {
		if res[k] != want {
			t.Errorf("resource %s = %q, want %q", k, res[k], want)
		}
	}
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = s
		if got := hex.EncodeToString(s.TraceId); got != traceID {
			t.Errorf("span %q trace id = %s, want %s", s.Name, got, traceID)
		}
	}
	rs, ts, as := byName["invoke_agent countersign"], byName["execute_tool issue_refund"], byName["approval issue_refund"]
	if rs == nil || ts == nil || as == nil || len(spans) != 3 {
		t.Fatalf("spans received = %v, want run, tool call and approval", byName)
	}
	if !bytes.Equal(ts.ParentSpanId, rs.SpanId) || !bytes.Equal(as.ParentSpanId, ts.SpanId) || len(rs.ParentSpanId) != 0 {
		t.Errorf("span tree: tool's parent %x (run %x), approval's parent %x (tool %x), run's parent %x (want none)",
			ts.ParentSpanId, rs.SpanId, as.ParentSpanId, ts.SpanId, rs.ParentSpanId)
	}
	ta := attrs(ts)
	for k, want := range map[string]string{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "issue_refund",
		"gen_ai.tool.call.id": "call_1", "countersign.request.id": "req_xyz", "countersign.call.outcome": "rejected"} {
		if got := ta[k].GetStringValue(); got != want {
			t.Errorf("tool span %s = %q, want %q", k, got, want)
		}
	}
	aa := attrs(as)
	if aa["countersign.approval.verdict"].GetStringValue() != "reject" || aa["countersign.approval.approver"].GetStringValue() != "U_BOB" ||
		aa["countersign.approval.wait_ms"].GetIntValue() != 90000 || len(aa["countersign.approval.signals"].GetArrayValue().GetValues()) != 2 {
		t.Errorf("approval span attributes = %v, want reject by U_BOB after 90000 ms with 2 signals", aa)
	}
	if got := time.Duration(as.EndTimeUnixNano - as.StartTimeUnixNano); got != 90*time.Second {
		t.Errorf("approval span lasts %v, want 90s", got)
	}
}

// TestStartOff: without the variables, nothing is exported and no
// provider is built.
func TestStartOff(t *testing.T) {
	p, err := tracing.Start(context.Background(), func(string) string { return "" }, "dev")
	if p != nil || err != nil {
		t.Errorf("Start with no OTEL_* variables = %v, %v; want nil, nil", p, err)
	}
}

// TestLogHandler: a line logged with a span's context carries its trace
// and span ids; one logged without does not.
func TestLogHandler(t *testing.T) {
	rc := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.srv.URL)
	p, err := tracing.Start(context.Background(), os.Getenv, "dev")
	if err != nil || p == nil {
		t.Fatalf("Start = %v, %v", p, err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	tr := p.Tracer()
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "agent")
	ctx, span := tr.StartRun(context.Background(), "run_1", "")
	defer span.End("done", false)
	log.InfoContext(ctx, "in a run")
	log.InfoContext(context.Background(), "outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log lines = %q", lines)
	}
	var in, out map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &out); err != nil {
		t.Fatal(err)
	}
	if in["trace_id"] != tr.TraceID(ctx) || in["span_id"] == nil || in["component"] != "agent" {
		t.Errorf("line in a run = %v, want trace_id %s, a span_id and the logger's attributes", in, tr.TraceID(ctx))
	}
	if _, has := out["trace_id"]; has {
		t.Errorf("line outside a run = %v, want no trace_id", out)
	}
}

// TestEndpoint: the start-up line names the traces endpoint over the OTLP
// one, and "default" when neither is set; a nil Provider (export off)
// shuts down without error.
func TestEndpoint(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"none", nil, "default"},
		{"otlp", map[string]string{tracing.EnvEndpoint: "http://a:4318"}, "http://a:4318"},
		{"traces first", map[string]string{tracing.EnvEndpoint: "http://a:4318", tracing.EnvTracesEndpoint: "http://b:4318/v1/traces"}, "http://b:4318/v1/traces"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tracing.Endpoint(func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("Endpoint() = %q, want %q", got, tt.want)
			}
		})
	}
	var p *tracing.Provider
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("nil Provider.Shutdown = %v, want nil", err)
	}
}
