package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// This file: the probes. /healthz (ReadyHandler with no checks: the
// process serves HTTP) and /readyz (Redis and Slack answer, with the
// degraded parts listed as details) are mounted by Mux.

// Check is one readiness condition; its error says what is wrong.
type Check func(ctx context.Context) error

// readyTimeout bounds a readiness answer: a check that has not answered by
// then has failed.
const readyTimeout = 3 * time.Second

// ReadyHandler answers 200 "ok" when every check passes within 3 s
// (readyTimeout) and 503 with the failures otherwise. With no checks it is
// a liveness probe (/healthz: the process serves HTTP).
func ReadyHandler(checks ...Check) http.Handler { return readyHandler(readyTimeout, checks, nil) }

// Detail lists what a readiness answer tells without failing on it: a
// degraded part (an MCP upstream that is down) the replica still serves
// around. Taking the replica out of service would not bring it back.
type Detail func() []string

// ReadyWithDetails is ReadyHandler whose body also lists details' lines
// after "ok" (or after the failures); they never fail the probe.
func ReadyWithDetails(checks []Check, details ...Detail) http.Handler {
	return readyHandler(readyTimeout, checks, details)
}

// readyHandler is ReadyHandler with its timeout; tests shorten it.
func readyHandler(timeout time.Duration, checks []Check, details []Detail) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Go(func() { errs[i] = c(ctx) })
		}
		wg.Wait() // each check honours ctx, so this ends within the timeout
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := errors.Join(errs...); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready\n%v\n", err)
		} else {
			fmt.Fprintln(w, "ok")
		}
		for _, d := range details {
			for _, line := range d() {
				fmt.Fprintln(w, line)
			}
		}
	})
}

// Named prefixes check's errors with name (e.g. "slack auth.test").
func Named(name string, check Check) Check {
	return func(ctx context.Context) error {
		if err := check(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
}

// Cached remembers a passing result of check for ttl, so that probes
// every few seconds from every replica do not each call Slack's auth.test.
// Failures are not cached: a recovering dependency is seen at the next
// probe.
func Cached(check Check, ttl time.Duration, now func() time.Time) Check {
	var (
		mu     sync.Mutex // guards okAt
		okAt   time.Time
		hasRun bool
	)
	return func(ctx context.Context) error {
		mu.Lock()
		fresh := hasRun && now().Sub(okAt) < ttl
		mu.Unlock()
		if fresh {
			return nil
		}
		if err := check(ctx); err != nil {
			return err
		}
		mu.Lock()
		okAt, hasRun = now(), true
		mu.Unlock()
		return nil
	}
}
