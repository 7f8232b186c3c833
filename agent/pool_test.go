package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
)

// TestWaitingRunsHoldNoWorker: with two workers, five runs waiting for
// approval hold none of them, so a sixth task still gets its card while
// the five wait; the decisions then resume every run and each tool runs
// once.
func TestWaitingRunsHoldNoWorker(t *testing.T) {
	w := newWorld(t) // the default rules: "delete customer C-n" → delete_customer (always reviewed)
	parked := &logSignal{match: "its worker is free", ch: make(chan string, 10)}
	p := w.start(func(o *agent.Options) {
		o.MaxRuns = 2
		o.Logger = slog.New(parked)
	})
	var cards []*approval.Request
	for i := range 5 {
		p.handle(t, task(fmt.Sprintf("delete customer C-10%d", i)))
	}
	for i := range 5 {
		cards = append(cards, recv(t, p.notify.cards, fmt.Sprintf("card %d of the 5 waiting runs", i+1)))
	}
	// Tasks handled before the first runs parked may have been queued
	// (and told so, in Handle); the sixth comes when all five wait.
	for i := range 5 {
		recv(t, parked.ch, fmt.Sprintf("run %d of 5 parked", i+1))
	}
	for len(p.notify.says) > 0 {
		<-p.notify.says
	}
	p.handle(t, task("delete customer C-200"))
	sixth := recv(t, p.notify.cards, "the sixth task's card while 5 runs wait")
	for _, c := range cards {
		if got := w.request(c.ID).Status; got != approval.StatusPending {
			t.Fatalf("request %s status = %s when the sixth card was posted, want pending", c.ID, got)
		}
	}
	select {
	case s := <-p.notify.says:
		t.Fatalf("the sixth task was told %q while five runs only wait", s)
	default:
	}
	for _, c := range append(cards, sixth) {
		w.decide(c, approval.VerdictApprove, "", nil)
	}
	for i := range 6 {
		recv(t, p.notify.results, fmt.Sprintf("result %d", i+1))
	}
	for i := range 5 {
		if n := w.sor.count(fmt.Sprintf("DELETE /customers/C-10%d", i)); n != 1 {
			t.Errorf("DELETE /customers/C-10%d hits = %d, want 1", i, n)
		}
	}
	if n := w.sor.count("DELETE /customers/C-200"); n != 1 {
		t.Errorf("DELETE /customers/C-200 hits = %d, want 1", n)
	}
}

// TestQueuedTaskIsToldItsPlace: when every worker is busy with model work,
// a new task is queued and its thread is told how many are ahead; beyond
// MaxQueued a task is refused with a message and not kept. Queued tasks
// run once the workers are free.
func TestQueuedTaskIsToldItsPlace(t *testing.T) {
	w := newWorld(t)
	p := w.start(func(o *agent.Options) { o.MaxRuns, o.MaxQueued = 2, 2 })
	entered := make(chan struct{}, 10)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the model server closes (cleanups run last first)
	blocking := scripted.Reply{Func: func(openai.ChatCompletionRequest) scripted.Reply {
		entered <- struct{}{}
		<-release
		return scripted.Reply{Content: "done"}
	}}
	w.model.Enqueue(blocking, blocking, blocking, blocking)

	p.handle(t, task("first"))
	p.handle(t, task("second"))
	recv(t, entered, "the first model call")
	recv(t, entered, "the second model call")

	p.handle(t, task("third"))
	if s := recv(t, p.notify.says, "the third task's queue message"); !strings.Contains(s, "Queued — next in line") {
		t.Errorf("third task told %q, want it queued next in line", s)
	}
	p.handle(t, task("fourth"))
	if s := recv(t, p.notify.says, "the fourth task's queue message"); !strings.Contains(s, "Queued — 1 ahead of you") {
		t.Errorf("fourth task told %q, want 1 ahead", s)
	}
	fifth := task("fifth")
	p.handle(t, fifth)
	if s := recv(t, p.notify.says, "the fifth task's refusal"); !strings.Contains(s, "Not started") || !strings.Contains(s, "2 tasks are already queued") {
		t.Errorf("fifth task told %q, want a refusal naming the queue", s)
	}
	if n := len(w.model.Requests()); n != 2 {
		t.Fatalf("model requests = %d while both workers are busy, want 2", n)
	}

	unblock()
	for i := range 4 {
		if res := recv(t, p.notify.results, fmt.Sprintf("result %d", i+1)); res.Answer != "done" {
			t.Errorf("result %d = %+v, want done", i+1, res)
		}
	}
	if n := len(w.model.Requests()); n != 4 {
		t.Errorf("model requests = %d, want 4 (the refused task never runs)", n)
	}
	ctx := context.Background()
	id, err := w.runs.ThreadRun(ctx, fifth.Origin.Channel, fifth.Origin.ThreadTS, "run_unbound")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.runs.Queued(ctx, id); err != nil || n != 0 {
		t.Errorf("refused task's inbox = %d, %v; want 0 (not kept)", n, err)
	}
}
