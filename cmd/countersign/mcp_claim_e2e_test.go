package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// TestMCPConcurrentIdenticalCallsRunOnce (issue 27, point 1): the go-sdk
// client sends two identical tools/call at once over streamable HTTP
// (different JSON-RPC ids, as parallel tool calls do). Both wait on one
// request and one card; one Approve runs the upstream tool once, and both
// calls are answered with its result. One executing and one executed
// entry are audited.
func TestMCPConcurrentIdenticalCallsRunOnce(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	d, up := rig.d, rig.up
	cs, progress := rig.connect(t)
	const args = `{"order_id":"1234","amount":400}`
	first := callAsync(cs, "orders__refund", args)
	second := callAsync(cs, "orders__refund", args)

	// Both calls are waiting once each has sent its first progress
	// notification (one per tick; a call's own count starts at 1).
	var id string
	for waiting := 0; waiting < 2; {
		select {
		case rig.ticks <- time.Now():
		case <-time.After(30 * time.Second):
			t.Fatal("fewer than two calls wait for the progress ticker")
		}
		select {
		case p := <-progress:
			got := requestIDPattern.FindString(p.Message)
			if id != "" && got != id {
				t.Fatalf("the two identical calls wait on %s and %s, want one request", id, got)
			}
			id = got
			if p.Progress == 1 {
				waiting++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no progress notification")
		}
	}
	card := apiCard(t, d, id)
	if n := len(cardsFor(d, "orders__refund")); n != 1 {
		t.Fatalf("cards = %d, want one for both calls", n)
	}
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	for name, ch := range map[string]<-chan callAnswer{"first": first, "second": second} {
		res := callResult(t, ch)
		if res.IsError || !strings.Contains(resultString(res), "refund done") {
			t.Errorf("%s call = %+v (%q), want the upstream's result", name, res, resultString(res))
		}
	}
	if calls := up.called("refund"); len(calls) != 1 {
		t.Errorf("the upstream refund ran %d times for one approval, want once: %s", len(calls), calls)
	}
	waitAudit(t, d, id, approval.EventExecuted)
	var executing int
	waitAuditN(t, d, 1, func(e approval.Entry) bool {
		if e.RequestID == id && e.Event == approval.EventExecuting {
			executing++
		}
		return e.RequestID == id && e.Event == approval.EventExecuted
	})
	if executing != 1 {
		t.Errorf("executing audited %d times, want 1", executing)
	}
	r, err := d.Main.Store.Request(context.Background(), id)
	if err != nil || r.Status != approval.StatusExecuted {
		t.Errorf("request = %+v, %v; want executed", r, err)
	}
}
