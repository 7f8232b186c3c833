package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// logSignal is a slog handler that sends every message containing match.
type logSignal struct {
	match string
	ch    chan string
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.ch <- r.Message
	}
	return nil
}
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logSignal) WithGroup(string) slog.Handler      { return h }

// TestHeartbeat: the heartbeat extends the lease on every tick of the
// injected ticker; when another process holds the lease the run stops at
// once and never executes what is decided afterwards.
func TestHeartbeat(t *testing.T) {
	w := newWorld(t)
	tick := make(chan time.Time) // unbuffered: a send returns once the heartbeat took it
	stopped := &logSignal{match: "run stopped", ch: make(chan string, 4)}
	p1 := w.start(func(o *agent.Options) {
		o.LeaseTTL = time.Minute
		o.Ticker = func(time.Duration) (<-chan time.Time, func()) { return tick, func() {} }
		o.Logger = slog.New(stopped)
	})
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("hb", "issue_refund", refundArgs)}})
	p1.handle(t, task("refund"))
	card := recv(t, p1.notify.cards, "the card")
	ctx := context.Background()
	lease := w.prefix + ":run:{" + card.RunID + "}:lease"

	w.rdb.PExpire(ctx, lease, 2*time.Second)
	tick <- time.Now()
	tick <- time.Now() // the first tick's extension is done
	if ttl := w.rdb.PTTL(ctx, lease).Val(); ttl < 50*time.Second {
		t.Fatalf("lease TTL after a heartbeat = %v, want it renewed to about 1m", ttl)
	}

	// Another process took the run over (the lease lapsed meanwhile).
	w.rdb.Set(ctx, lease, "other-process", time.Minute)
	// The heartbeat notices at its next extension: the one for this tick,
	// or the one for the previous tick if that is still in flight (then
	// the heartbeat has returned and takes no more ticks).
	select {
	case tick <- time.Now():
		recv(t, stopped.ch, "the run to stop")
	case <-stopped.ch:
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	if err := p1.agent.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Fatalf("refund ran on a process that lost its lease: %d hits", n)
	}
	if got := w.request(card.ID).Status; got != approval.StatusApproved {
		t.Fatalf("request = %s, want approved and unclaimed", got)
	}
	if owner := w.rdb.Get(ctx, lease).Val(); owner != "other-process" {
		t.Fatalf("lease owner = %q, want the other process's (never deleted by the loser)", owner)
	}
	// The other process goes away; a new one finishes the run.
	w.rdb.Del(ctx, lease)
	w.model.Enqueue(scripted.Reply{Content: "finished"})
	p2 := w.start()
	if n, err := p2.agent.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	recv(t, p2.notify.results, "the run result")
	if n := w.sor.count("POST /refunds"); n != 1 {
		t.Fatalf("refund hits = %d, want 1", n)
	}
}

// TestPoolBound: with one worker, a run waiting for approval holds none
// (the second task starts at once), a task that arrives while the worker
// is busy with model work is queued visibly rather than lost, and the
// decided run takes the worker back to execute once the worker is free.
func TestPoolBound(t *testing.T) {
	w := newWorld(t)
	parked := &logSignal{match: "its worker is free", ch: make(chan string, 4)}
	p := w.start(func(o *agent.Options) {
		o.MaxRuns = 1
		o.Logger = slog.New(parked)
	})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the model server closes
	w.model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{call("q1", "issue_refund", refundArgs)}},
		scripted.Reply{Func: func(openai.ChatCompletionRequest) scripted.Reply {
			entered <- struct{}{}
			<-release
			return scripted.Reply{Content: "second"}
		}},
		scripted.Reply{Content: "after"},
		scripted.Reply{Content: "after"},
	)
	p.handle(t, task("first task"))
	card := recv(t, p.notify.cards, "the card")
	recv(t, parked.ch, "the first run parked")
	p.handle(t, task("second task")) // the first run only waits: the worker is free
	recv(t, entered, "the second run's model call")
	p.handle(t, task("third task")) // the worker is busy: queued, not lost
	if s := recv(t, p.notify.says, "the queue message"); !strings.Contains(s, "Queued") {
		t.Fatalf("third task told %q, want it queued", s)
	}
	if n := len(w.model.Requests()); n != 2 {
		t.Fatalf("model requests = %d, want 2 while the worker is busy", n)
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	unblock()
	answers := map[string]int{}
	for i := range 3 {
		answers[recv(t, p.notify.results, fmt.Sprintf("result %d", i+1)).Answer]++
	}
	if answers["second"] != 1 || answers["after"] != 2 {
		t.Errorf("answers = %v, want second once and after twice", answers)
	}
	if n := w.sor.count("POST /refunds"); n != 1 {
		t.Errorf("refund hits = %d, want 1", n)
	}
}

// TestPolicyFileURLTemplate: a tools file with a bad URL template is
// refused by policyfile.Parse naming the key, and HTTPTools refuses a
// hand-built file the same way.
func TestPolicyFileURLTemplate(t *testing.T) {
	bad := strings.Replace(testPolicy, `url: '{{env "SOR_URL"}}/emails'`, `url: '{{env "SOR_URL"}/emails'`, 1)
	_, err := policyfile.Parse([]byte(bad))
	if err == nil || !strings.Contains(err.Error(), "tools[1].http.url") {
		t.Errorf("Parse(bad url template) = %v, want an error naming tools[1].http.url", err)
	}
	f, err := policyfile.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	f.Tools[1].HTTP.URL = "http://sor.example/{{.Args.to"
	if _, err := agent.HTTPTools(f, nil, nil); err == nil || !strings.Contains(err.Error(), "tools[1] (send_email).http.url") {
		t.Errorf("HTTPTools(bad url template) = %v, want an error naming the key", err)
	}
}

// TestExpiredIsNotRun: a request whose deadline passes is expired by the
// store's sweep; the waiting run does not run the tool and tells the model.
func TestExpiredIsNotRun(t *testing.T) {
	w := newWorld(t)
	p := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("ex", "issue_refund", refundArgs)}}, scripted.Reply{Content: "expired"})
	p.handle(t, task("refund"))
	card := recv(t, p.notify.cards, "the card")
	now := card.Deadline.Add(time.Second)
	if n, err := w.sweeper(&now).ExpireDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("ExpireDue = %d, %v; want 1", n, err)
	}
	res := recv(t, p.notify.results, "the run result")
	if res.Expired != 1 || w.sor.count("POST /refunds") != 0 {
		t.Errorf("result = %+v, refunds = %d; want expired and not run", res, w.sor.count("POST /refunds"))
	}
	tools := toolMessages(w.lastRequest())
	want := "Not run: the approval request for this issue_refund call expired without a decision at " + card.Deadline.UTC().Format(time.RFC3339) + "."
	if len(tools) != 1 || tools[0].Content != want {
		t.Errorf("tool messages = %+v, want %q", tools, want)
	}
}

// TestUngatedCallOrphaned: a call the gate let through, cut off by a crash
// mid-execution, is tracked in the run record and reported as outcome
// unknown by the process that adopts the run — not run again.
func TestUngatedCallOrphaned(t *testing.T) {
	w := newWorld(t)
	pol := w.file.Policy
	tp := pol.Tools["wire_money"]
	tp.Risk, tp.Capabilities, tp.Review = approval.RiskLow, nil, approval.ReviewNever
	pol.Tools["wire_money"] = tp
	gate, err := approval.NewGate(pol)
	if err != nil {
		t.Fatal(err)
	}
	tool := &blockingTool{started: make(chan struct{}, 4), release: make(chan struct{})}
	useGate := func(o *agent.Options) { o.Gate = gate }
	p1 := w.start(withTools(tool), useGate)
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("o1", "wire_money", `{"amount":5,"confidence":1}`)}})
	th := task("wire five")
	p1.handle(t, th)
	recv(t, tool.started, "the tool to start")
	_ = p1.rdb.Close() // crash: nothing more reaches Redis
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p1.agent.Close(ctx)
	runID, err := w.runs.ThreadRun(context.Background(), th.Origin.Channel, th.Origin.ThreadTS, "unused")
	if err != nil {
		t.Fatal(err)
	}
	w.rdb.Del(context.Background(), w.prefix+":run:{"+runID+"}:lease")

	w.model.Enqueue(scripted.Reply{Content: "unknown reported"})
	p2 := w.start(withTools(tool), useGate)
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	recv(t, p2.notify.says, "the outcome-unknown note")
	recv(t, p2.notify.results, "the run result")
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.HasPrefix(tools[0].Content, "Outcome unknown: wire_money") {
		t.Errorf("tool messages = %+v", tools)
	}
	close(tool.release)
	if got := tool.count(); got != 1 {
		t.Errorf("wire_money ran %d times, want 1", got)
	}
}

// TestBoundToWhatWasShown: arguments changed in the record after the
// approval (tampering, a bug) do not run: the approval applied to the
// digest on the card.
func TestBoundToWhatWasShown(t *testing.T) {
	w := newWorld(t)
	p1 := w.start()
	w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("b1", "issue_refund", refundArgs)}})
	p1.handle(t, task("refund"))
	card := recv(t, p1.notify.cards, "the card")
	if err := p1.agent.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.decide(card, approval.VerdictApprove, "", nil)
	// Someone rewrites the stored arguments behind the approval's back.
	w.rdb.HSet(context.Background(), w.prefix+":req:{"+card.ID+"}", "args", `{"order_id":"1234","amount":6400,"reason":"damaged in transit"}`)

	w.model.Enqueue(scripted.Reply{Content: "refused"})
	p2 := w.start()
	if n, err := p2.agent.Resume(context.Background()); err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v", n, err)
	}
	recv(t, p2.notify.results, "the run result")
	if n := w.sor.count("POST /refunds"); n != 0 {
		t.Fatalf("POST /refunds hits = %d, want 0", n)
	}
	tools := toolMessages(w.lastRequest())
	if len(tools) != 1 || !strings.Contains(tools[0].Content, "Not run: the arguments differ from the ones the approver saw") {
		t.Errorf("tool messages = %+v", tools)
	}
	if got := w.request(card.ID).Status; got != approval.StatusRefused {
		t.Errorf("status = %s, want refused (final, never runs later)", got)
	}
}
