package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// TestFollowUpLandingAsTheWorkerLeaves: a follow-up admitted while a
// worker is on its run, whose task lands in the inbox only after that
// worker took its last look, still runs (the worker used to leave and
// the task sat in the inbox until the next adoption). Hooks hold the
// first result and the follow-up's enqueue to reach the window.
func TestFollowUpLandingAsTheWorkerLeaves(t *testing.T) {
	w := newWorld(t)
	w.model.Enqueue(scripted.Reply{Content: "first answer"}, scripted.Reply{Content: "second answer"})
	hold := &holdFirstResult{held: make(chan struct{}), release: make(chan struct{})}
	gate := &gatedEnqueue{reached: make(chan struct{}), proceed: make(chan struct{}), queued: make(chan struct{}, 16)}
	p := w.start(func(o *agent.Options) {
		hold.Notifier, o.Notifier = o.Notifier, hold
		gate.Runs, o.Runs = o.Runs, gate
	})
	first := task("first question")
	p.handle(t, first)
	recv(t, hold.held, "the worker posting the first result")

	gate.armed.Store(true)
	follow := first
	follow.Text = "and a follow-up"
	handled := make(chan error, 1)
	go func() { handled <- p.agent.Handle(context.Background(), follow) }()
	recv(t, gate.reached, "the follow-up admitted while the worker is on the run, its enqueue held")

	close(hold.release)
	if res := recv(t, p.notify.results, "first result"); res.Answer != "first answer" {
		t.Fatalf("first = %+v", res)
	}
	// The worker looks at the inbox (empty: the enqueue is held), looks
	// once more for the admission's flag, and leaves.
	recv(t, gate.queued, "the worker's first look at the inbox")
	recv(t, gate.queued, "the worker's look again")
	close(gate.proceed)
	if err := recv(t, handled, "Handle to return"); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if res := recv(t, p.notify.results, "the follow-up's result"); res.Answer != "second answer" {
		t.Fatalf("second = %+v", res)
	}
}

// holdFirstResult holds the first PostRunResult until release is closed.
type holdFirstResult struct {
	agent.Notifier
	held, release chan struct{}
	once          sync.Once
}

func (h *holdFirstResult) PostRunResult(ctx context.Context, res approval.RunResult) error {
	h.once.Do(func() {
		close(h.held)
		<-h.release
	})
	return h.Notifier.PostRunResult(ctx, res)
}

// gatedEnqueue, once armed, holds Enqueue until proceed is closed and
// signals each Queued after it returned.
type gatedEnqueue struct {
	agent.Runs
	armed            atomic.Bool
	reached, proceed chan struct{}
	queued           chan struct{}
}

func (g *gatedEnqueue) Enqueue(ctx context.Context, id string, task []byte) error {
	if g.armed.Load() {
		close(g.reached)
		<-g.proceed
	}
	return g.Runs.Enqueue(ctx, id, task)
}

func (g *gatedEnqueue) Queued(ctx context.Context, id string) (int64, error) {
	n, err := g.Runs.Queued(ctx, id)
	if g.armed.Load() {
		select {
		case g.queued <- struct{}{}:
		default:
		}
	}
	return n, err
}
