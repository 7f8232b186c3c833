package tracing

// This file: turning export on from the standard OTEL_* environment
// variables, and trace ids on log lines.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Environment variables Start reads itself. The exporter reads the rest of
// the OTEL_EXPORTER_OTLP_* family (headers, timeout, compression,
// certificates), the SDK reads OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*,
// and the resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvExporter       = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// ServiceName is the service.name of the exported spans unless
// OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) says otherwise.
const ServiceName = "countersign"

// Provider exports spans over OTLP/HTTP. Shutdown flushes and stops it.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Enabled reports whether getenv asks for trace export: OTEL_TRACES_EXPORTER
// is "otlp", or it is unset and an OTLP endpoint is set; never when
// OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is "none". An error
// names the variable that holds a value Countersign cannot honour.
func Enabled(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false, nil
	}
	on := false
	switch exp := strings.ToLower(strings.TrimSpace(getenv(EnvExporter))); exp {
	case "none":
		return false, nil
	case "otlp":
		on = true
	case "":
		on = getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != ""
	default:
		return false, fmt.Errorf("%s: %q is not supported (use otlp or none)", EnvExporter, exp)
	}
	if !on {
		return false, nil
	}
	for _, k := range []string{EnvTracesProtocol, EnvProtocol} {
		switch p := strings.TrimSpace(getenv(k)); p {
		case "", "http/protobuf":
		default:
			return false, fmt.Errorf("%s: %q is not supported (traces are exported as http/protobuf)", k, p)
		}
	}
	return true, nil
}

// Start returns a Provider exporting over OTLP/HTTP when getenv asks for
// it (see Enabled), nil and no error when it does not. getenv is the
// process environment's lookup (the exporter reads its own variables from
// the environment too). version goes into service.version.
func Start(ctx context.Context, getenv func(string) string, version string) (*Provider, error) {
	on, err := Enabled(getenv)
	if err != nil || !on {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: OTLP exporter: %w", EnvEndpoint, err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", ServiceName)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	// Later detectors win: OTEL_* settings override the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{tp: tp}, nil
}

// Endpoint is where getenv sends spans, for the start-up log line: the
// traces endpoint, else the OTLP endpoint, else "default" (the exporter's
// own).
func Endpoint(getenv func(string) string) string {
	for _, k := range []string{EnvTracesEndpoint, EnvEndpoint} {
		if v := getenv(k); v != "" {
			return v
		}
	}
	return "default"
}

// Tracer is the agent's tracer over p.
func (p *Provider) Tracer() *Tracer { return New(p.tp) }

// Shutdown exports the spans still buffered and stops the exporter; ctx
// bounds how long it may take. A nil Provider (export off) has nothing to
// do.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// LogHandler returns a handler that adds trace_id and span_id to every
// record logged with a context holding a span, then passes it to next.
func LogHandler(next slog.Handler) slog.Handler { return logHandler{next: next} }

type logHandler struct{ next slog.Handler }

func (h logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.next.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{next: h.next.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{next: h.next.WithGroup(name)}
}

// LogErrors sends OpenTelemetry's internal errors (a failed export, a
// dropped span) to log as one warning each instead of the SDK's default
// plain-text stderr output. It sets a process-wide handler: call it once,
// from main's wiring.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export", "err", err)
	}))
}
