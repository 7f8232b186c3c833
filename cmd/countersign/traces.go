package main

import (
	"context"
	"fmt"
	"os"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/tracing"
)

// startTraces turns trace export on when the OTEL_* variables ask for it
// (see tracing.Enabled) and returns the agent's tracer, nil when export is
// off. Close flushes the spans still buffered.
func (m *Main) startTraces(ctx context.Context) (agent.Tracer, error) {
	getenv := m.OTelEnv
	if getenv == nil {
		getenv = os.Getenv
	}
	p, err := tracing.Start(ctx, getenv, version)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, nil
	}
	m.traces = p
	tracing.LogErrors(m.Logger.With("component", "tracing"))
	m.Logger.Info("trace export on (OTLP/HTTP)", "endpoint", firstSet(getenv, tracing.EnvTracesEndpoint, tracing.EnvEndpoint))
	return p.Tracer(), nil
}

// stopTraces exports what is buffered; ctx bounds it.
func (m *Main) stopTraces(ctx context.Context) error {
	if m.traces == nil {
		return nil
	}
	if err := m.traces.Shutdown(ctx); err != nil {
		return fmt.Errorf("traces: %w", err)
	}
	return nil
}

// firstSet is the value of the first of keys that is set, "default" when
// none is.
func firstSet(getenv func(string) string, keys ...string) string {
	for _, k := range keys {
		if v := getenv(k); v != "" {
			return v
		}
	}
	return "default"
}
