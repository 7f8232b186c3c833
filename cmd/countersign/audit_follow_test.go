package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
)

// TestAuditTailFollowStopsPromptly: Ctrl-C ends `audit tail -f` within the
// XREAD block time (250 ms), with exit 0, while it waits for new entries.
func TestAuditTailFollowStopsPromptly(t *testing.T) {
	env := mustAuditEnv(t)
	env.append(t, time.Now(), approval.Record{Event: approval.EventRunStarted, RunID: "run_before", Actor: alice})
	ctx, cancel := context.WithCancel(t.Context())
	out := &lineWriter{wrote: make(chan struct{}, 1)}
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- main.Run(ctx, []string{"audit", "tail", "-f"}, main.Stdio{Stdout: out, Stderr: &errOut})
	}()
	out.waitFor(t, "run_before") // printed the backlog: now following
	cancel()
	at := time.Now()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("audit tail -f = %d after cancel, want 0; stderr %q", code, errOut.String())
		}
		if took := time.Since(at); took > 2500*time.Millisecond {
			t.Errorf("audit tail -f took %v to stop after cancel, want about the 250 ms block time (+ slack)", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("audit tail -f did not stop after cancel")
	}
}

// waitFor waits (on workspace changes, not sleeps) until cond holds.
func waitFor(t *testing.T, ws *slacksim.Workspace, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ws.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
