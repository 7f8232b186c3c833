package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// emailArgs is a send_email call confident enough that nothing but the
// tool's review mode decides whether a human looks.
const emailArgs = `{"to":"dana@example.com","subject":"Your refund","body":"It is on its way.","confidence":0.9}`

// afterGate makes send_email a review-after tool with a 5 minute cancel
// window (no sensitive capability, as review: after requires).
func afterGate(tb testing.TB, w *world) processOption {
	tb.Helper()
	pol := w.file.Policy
	tp := pol.Tools["send_email"]
	tp.Capabilities, tp.Review, tp.CancelWindow = nil, approval.ReviewAfter, 5*time.Minute
	pol.Tools["send_email"] = tp
	gate, err := approval.NewGate(pol)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return func(o *agent.Options) { o.Gate = gate }
}

// sweeper is another process's lifecycle owner on w's Redis, with a clock
// the test sets: its ExpireDue is the sweep that ends cancel windows.
func (w *world) sweeper(now *time.Time) *approval.Lifecycle {
	w.tb.Helper()
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(w.store, w.audit),
		Now: func() time.Time { return *now }})
	if err != nil {
		w.tb.Fatalf("NewLifecycle: %v", err)
	}
	return life
}

// TestReviewAfterCancelled: an approver cancels inside the window, with a
// reason: the tool never runs, the model gets the reason, and the window
// ending later changes nothing.
func TestReviewAfterCancelled(t *testing.T) {
	w := newWorld(t)
	p := w.start(afterGate(t, w))
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("a1", "send_email", emailArgs)}}, scripted.Reply{Content: "cancelled"})
	p.handle(t, task("email dana"))
	card := recv(t, p.notify.cards, "the card")
	if card.Mode != approval.ModeAfter || card.Deadline.Sub(card.Created) != 5*time.Minute {
		t.Fatalf("card mode %q, window %v; want after, 5m", card.Mode, card.Deadline.Sub(card.Created))
	}
	now := card.Deadline.Add(-time.Minute)
	life := w.sweeper(&now)
	_, err := life.Decide(context.Background(), card, approval.Decision{RequestID: card.ID, Verdict: approval.VerdictCancel,
		Text: "wrong customer", Approver: "U_APPROVER", At: now, Digest: card.Digest}, approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide(cancel) = %v", err)
	}
	recv(t, p.notify.results, "the run result")
	now = card.Deadline.Add(time.Second)
	if n, err := life.ExpireDue(context.Background()); err != nil || n != 0 {
		t.Errorf("ExpireDue after the cancel = %d, %v; want 0", n, err)
	}
	if n := w.sor.count("POST /emails"); n != 0 {
		t.Errorf("POST /emails hits = %d, want 0", n)
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.Contains(tools[0].Content, "wrong customer") {
		t.Errorf("tool messages = %+v, want the cancel reason", tools)
	}
	for ev, want := range map[approval.Event]int{approval.EventScheduled: 1, approval.EventCancelled: 1,
		approval.EventWindowElapsed: 0, approval.EventExecuted: 0} {
		if got := w.countEvents(ev); got != want {
			t.Errorf("audit %s entries = %d, want %d", ev, got, want)
		}
	}
}

// TestReviewAfterWindowElapses: nobody cancels; the sweep at the window's
// end lets the call run, once, however many sweeps follow; the run's
// counts say it ran when its window ended, not that anyone approved it.
func TestReviewAfterWindowElapses(t *testing.T) {
	w := newWorld(t)
	p := w.start(afterGate(t, w))
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("a2", "send_email", emailArgs)}}, scripted.Reply{Content: "sent"})
	p.handle(t, task("email dana"))
	card := recv(t, p.notify.cards, "the card")
	now := card.Deadline.Add(-time.Millisecond)
	life := w.sweeper(&now)
	if n, err := life.ExpireDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("ExpireDue before the window ends = %d, %v; want 0", n, err)
	}
	now = card.Deadline
	if n, err := life.ExpireDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("ExpireDue at the window's end = %d, %v; want 1", n, err)
	}
	res := recv(t, p.notify.results, "the run result")
	if n, err := life.ExpireDue(context.Background()); err != nil || n != 0 {
		t.Errorf("ExpireDue again = %d, %v; want 0", n, err)
	}
	if n := w.sor.count("POST /emails"); n != 1 {
		t.Errorf("POST /emails hits = %d, want 1 (result %+v)", n, res)
	}
	if got := w.request(card.ID); got.Status != approval.StatusExecuted || got.Decision.Verdict != approval.VerdictWindowElapsed {
		t.Errorf("request status %s, verdict %s; want executed, window_elapsed", got.Status, got.Decision.Verdict)
	}
	if res.Approved != 0 || res.AfterWindow != 1 {
		t.Errorf("run counts approved %d, after window %d; want 0 and 1", res.Approved, res.AfterWindow)
	}
	for ev, want := range map[approval.Event]int{approval.EventScheduled: 1, approval.EventWindowElapsed: 1, approval.EventExecuted: 1} {
		if got := w.countEvents(ev); got != want {
			t.Errorf("audit %s entries = %d, want %d", ev, got, want)
		}
	}
}

// TestReviewAfterProcessKilled: the process that scheduled the call dies
// during the window. Another process's sweep ends the window on time and
// the process that adopts the run runs the call, once.
func TestReviewAfterProcessKilled(t *testing.T) {
	w := newWorld(t)
	gate := afterGate(t, w)
	p1 := w.start(gate)
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("a3", "send_email", emailArgs)}})
	th := task("email dana")
	p1.handle(t, th)
	card := recv(t, p1.notify.cards, "the card")
	_ = p1.rdb.Close() // killed: nothing more reaches Redis
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p1.agent.Close(ctx)
	runID, err := w.runs.ThreadRun(context.Background(), th.Origin.Channel, th.Origin.ThreadTS, "unused")
	if err != nil {
		t.Fatal(err)
	}
	w.rdb.Del(context.Background(), w.prefix+":run:{"+runID+"}:lease")

	now := card.Deadline
	if n, err := w.sweeper(&now).ExpireDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("another process's ExpireDue at the window's end = %d, %v; want 1", n, err)
	}
	if got := w.request(card.ID).Status; got != approval.StatusApproved {
		t.Fatalf("status after the window = %s, want approved", got)
	}
	w.model.Enqueue(scripted.Reply{Content: "sent"})
	p2 := w.start(gate)
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	recv(t, p2.notify.results, "the run result")
	if n := w.sor.count("POST /emails"); n != 1 {
		t.Errorf("POST /emails hits = %d, want 1", n)
	}
}

// sampleGate makes lookup_order (never reviewed) sample calls at rate.
func sampleGate(tb testing.TB, w *world, rate float64) processOption {
	tb.Helper()
	pol := w.file.Policy
	tp := pol.Tools["lookup_order"]
	tp.Sample = rate
	pol.Tools["lookup_order"] = tp
	gate, err := approval.NewGate(pol)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return func(o *agent.Options) { o.Gate = gate }
}

// TestSampledCallPostedAfterRunning: a call the gate lets through runs at
// once, and when sampled is then posted as a review card showing what ran;
// an unsampled call gets no card.
func TestSampledCallPostedAfterRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64
		card bool
	}{{"sampled", 1, true}, {"not sampled", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			p := w.start(sampleGate(t, w, tc.rate))
			w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("s1", "lookup_order", `{"order_id":"1234"}`)}}, scripted.Reply{Content: "found"})
			p.handle(t, task("look up 1234"))
			recv(t, p.notify.results, "the run result")
			if n := w.sor.count("GET /orders/1234"); n != 1 {
				t.Fatalf("GET /orders/1234 hits = %d, want 1 (it runs without waiting)", n)
			}
			if got := w.countEvents(approval.EventSampled); got != btoi(tc.card) {
				t.Fatalf("audit sampled entries = %d, want %d", got, btoi(tc.card))
			}
			if !tc.card {
				if len(p.notify.cards) != 0 {
					t.Errorf("a card was posted for an unsampled call")
				}
				return
			}
			card := recv(t, p.notify.cards, "the review card")
			if card.Mode != approval.ModeSampled || card.Status != approval.StatusExecuted || !strings.Contains(card.Result, "Dana Whitfield") {
				t.Errorf("review card = mode %q, status %s, result %q; want sampled, executed, the lookup's output", card.Mode, card.Status, card.Result)
			}
			if got := w.request(card.ID); !got.Markable() || got.Card != card.Card {
				t.Errorf("stored sampled request = %+v, want markable and bound to its card", got)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
