package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
)

// Notifier is what the agent needs of the chat bot. bot.Bot implements it.
// Approval cards are not the agent's: the lifecycle owner has them posted
// and redrawn.
type Notifier interface {
	// PostRunResult posts the answer and counts in the task thread. Errors
	// are logged only.
	PostRunResult(ctx context.Context, res approval.RunResult) error
	// Say posts a plain message in the task thread. Errors are logged only.
	Say(ctx context.Context, o approval.Origin, text string) error
	// Decided tells the task thread what became of r, a final request of
	// the run (decided, expired, cancelled, failed or lost), in place of
	// its waiting note. The run calls it before it acts on r, and it
	// returns once the line is posted, so the thread reads in the order
	// things happened: the decision before what follows from it, the
	// run's answer included. Errors are logged only.
	Decided(ctx context.Context, r *approval.Request) error
}

// Gate decides whether a proposed call needs a human. *approval.Gate
// implements it.
type Gate interface {
	// Assess returns an error wrapping approval.ErrUnknownTool or
	// approval.ErrInvalidArgs when the call must not run at all.
	Assess(call approval.ToolCall, requester string) (approval.Assessment, error)
	// Policy returns the resolved rule of a tool, false when unknown.
	Policy(tool string) (approval.ToolPolicy, bool)
}

// Lifecycle is the owner of every request's transitions
// (*approval.Lifecycle): record → audit → wake-up → card, whoever asks. It
// has two roles: proposing a call and waiting for its decision
// (propose.go, decision.go) and running a decided call (execute.go).
type Lifecycle interface {
	Proposals
	Executions
}

// Proposals is what proposing a call and waiting for its decision need of
// the lifecycle.
type Proposals interface {
	// Propose judges a call and, when a person must decide, creates its
	// request and has its card posted. Errors wrap
	// approval.ErrInvalidToolName, ErrConfusableTool, ErrUnknownTool,
	// ErrInvalidArgs, or ErrNotSaved; a deny rule is an outcome.
	Propose(ctx context.Context, p approval.Proposal) (approval.Proposed, error)
	// EnsureCard has a pending request's card posted when it has none.
	EnsureCard(ctx context.Context, r *approval.Request) *approval.Request
	// Cancel ends a pending request; *approval.DecidedError when final.
	Cancel(ctx context.Context, id, by, reason string) (*approval.Request, error)
	// Lose reports a request whose record vanished from the store.
	Lose(ctx context.Context, r *approval.Request)
}

// Executions is what running a decided call needs of the lifecycle: the
// claim that lets it run at most once and the record of what came of it.
type Executions interface {
	// ClaimRequest judges an approved request (r, as the run's wait
	// returned it) against the policy in force and, fit to run, moves it
	// to executing at most once and audits the execution about to start.
	// Otherwise: a *approval.RefusedError (it ends refused: tell the
	// model why), a *approval.MoreApprovalsError (pending again: wait for
	// it), approval.ErrAlreadyClaimed, approval.ErrNotApproved, each with
	// the request as it now is.
	ClaimRequest(ctx context.Context, r *approval.Request, owner string) (*approval.Request, error)
	// Executing audits a retry-safe tool run again after a crash.
	Executing(ctx context.Context, r *approval.Request, owner string, retry bool)
	// Finish records an executing request's outcome:
	// approval.ErrAlreadyClaimed when already finished.
	Finish(ctx context.Context, id, owner string, o approval.Outcome) (*approval.Request, error)
	// NotRun ends an approved request this process cannot run (its tool
	// is not here), audited as failed with why.
	NotRun(ctx context.Context, r *approval.Request, owner, why string) *approval.Request
	// RunningDirect audits that a call without a request to claim (the
	// gate let it through) starts running, or runs again after a crash
	// (DirectCall.Retry: retry-safe tools).
	RunningDirect(ctx context.Context, c approval.DirectCall)
	// RanDirect audits what became of a call without a request to claim.
	RanDirect(ctx context.Context, c approval.DirectCall, o approval.Outcome)
	// Sampled records a call that ran without a human and was picked for
	// review at the given rate, audits it and posts its review card. An
	// error means it could not be saved.
	Sampled(ctx context.Context, r *approval.Request, rate float64) (*approval.Request, error)
}

var _ Lifecycle = (*approval.Lifecycle)(nil)

// Requests is what the agent reads of the request store (*store.Store).
// Refusals are wrapped approval sentinels; any other error is Redis failing.
type Requests interface {
	// Request returns the stored request, or approval.ErrNotFound.
	Request(ctx context.Context, id string) (*approval.Request, error)
	// Wait returns the request once it is final (decided, expired,
	// cancelled, or later); an error when ctx ends first.
	Wait(ctx context.Context, id string) (*approval.Request, error)
}

// Runs keeps runs durable (*store.Runs): the four roles below, which one
// store implements together. Records and tasks are opaque bytes. Each part
// of the agent holds only the role it uses (as bot.Slack is split into
// Messages, Views and Directory), so a reader sees at once that, say, the
// heartbeat touches leases and nothing else of the inbox.
type Runs interface {
	Leases
	Records
	Inbox
	Adoption
}

// Leases fence a run to one process at a time: the worker, the heartbeat
// and Resume use them.
type Leases interface {
	// Acquire takes the run's lease when nobody holds it.
	Acquire(ctx context.Context, id, owner string, ttl time.Duration) (bool, error)
	// Extend renews owner's lease; false when it lapsed.
	Extend(ctx context.Context, id, owner string, ttl time.Duration) (bool, error)
	// Release gives the lease up when owner holds it.
	Release(ctx context.Context, id, owner string) (bool, error)
}

// Records are the run records the loop checkpoints and resumes from.
type Records interface {
	// Save writes the record fenced by owner's lease (an error when the
	// lease is not owner's) and drops the first consumed inbox tasks.
	Save(ctx context.Context, id, owner string, data []byte, consumed int, active bool) error
	// Load returns the record (nil when none yet) and queued tasks;
	// approval.ErrNotFound when there is neither.
	Load(ctx context.Context, id string) ([]byte, [][]byte, error)
}

// Inbox is where Handle queues a thread's tasks for its run.
type Inbox interface {
	// Enqueue queues a task for the run and marks it adoptable.
	Enqueue(ctx context.Context, id string, task []byte) error
	// Queued counts the tasks in the run's inbox.
	Queued(ctx context.Context, id string) (int64, error)
	// ThreadRun returns the run bound to a thread, binding newID if none.
	ThreadRun(ctx context.Context, channel, threadTS, newID string) (string, error)
}

// Adoption is the list of runs that may need a process, which Resume
// reads.
type Adoption interface {
	// ActivePage lists at most count runs that may need a process (a
	// hint), from rank start, the oldest first.
	ActivePage(ctx context.Context, start, count int64) ([]string, error)
	// AcquireEach tries to take the lease of each of ids (Leases.Acquire)
	// in one round trip; won[i] reports whether ids[i]'s is now owner's.
	AcquireEach(ctx context.Context, ids []string, owner string, ttl time.Duration) (won []bool, err error)
	// Forget drops run id from the adoption hints when it has neither a
	// record nor queued tasks.
	Forget(ctx context.Context, id string) error
}

// Ticker makes a ticker; stop releases it. Tests pass a channel they drive.
type Ticker func(d time.Duration) (c <-chan time.Time, stop func())

// ErrClosed is returned by Handle and Resume after Close.
var ErrClosed = errors.New("agent: closed")

// Defaults for Options.
const (
	DefaultMaxSteps = 8
	DefaultMaxRuns  = 256
	// DefaultMaxQueued bounds the runs queued for a worker in one process.
	DefaultMaxQueued = 10000
	// DefaultLeaseTTL bounds how long a dead process's runs wait for
	// adoption: a run is adopted within LeaseTTL plus one resume interval
	// of its owner's last heartbeat (every LeaseTTL/3). Shorter adopts
	// sooner but lets a Redis stall longer than the TTL hand a live run to
	// another process (which is safe: executions are claimed once and
	// fenced by the lease, see Agent.fence).
	DefaultLeaseTTL       = 6 * time.Second
	DefaultModelAttempts  = 3
	DefaultModelBackoff   = time.Second
	DefaultRequestTimeout = 24 * time.Hour
	DefaultPreviewTimeout = 5 * time.Second
)

// Options configure an Agent. Model, ModelName, Gate, Lifecycle, Requests,
// Runs, Notifier and Auditor are required.
type Options struct {
	Model     Model
	ModelName string // OPENAI_MODEL
	Gate      Gate
	Lifecycle Lifecycle
	Requests  Requests
	Runs      Runs
	Notifier  Notifier
	Auditor   approval.Auditor
	Tools     []Tool

	// SystemPrompt starts every new run's conversation when set.
	SystemPrompt string
	// MaxSteps bounds the model calls of one turn, default 8.
	MaxSteps int
	// StopOnRejection ends a turn at the first rejection, for every tool
	// (approval.ToolPolicy.StopOnRejection does it per tool).
	StopOnRejection bool
	// Templates override what the model is told about decisions.
	Templates policyfile.Templates

	// Owner names this process in leases and claims, default
	// "<hostname>/<random>".
	Owner string
	// MaxRuns bounds the runs doing model or tool work in this process at
	// once, default 256. A run waiting for decisions holds no worker: it
	// takes one again when a decision arrives.
	MaxRuns int
	// MaxQueued bounds the runs queued for a worker when all MaxRuns are
	// busy, default 10,000; a task beyond it is refused with a message in
	// its thread.
	MaxQueued int
	// LeaseTTL is how long a run stays owned without a heartbeat, default
	// DefaultLeaseTTL; the heartbeat renews it every LeaseTTL/3.
	LeaseTTL time.Duration
	// ModelAttempts bounds attempts per model call, default 3; the wait
	// doubles from ModelBackoff (default 1s).
	ModelAttempts int
	ModelBackoff  time.Duration
	// DefaultTimeout is a request's deadline when its tool sets none,
	// default 24h.
	DefaultTimeout time.Duration
	// PreviewTimeout bounds a tool's Preview, default 5s.
	PreviewTimeout time.Duration

	// Now is the clock, default time.Now.
	Now func() time.Time
	// Sleep waits d or until ctx ends (retry backoff), default a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Ticker drives lease heartbeats, default time.NewTicker.
	Ticker Ticker
	// Logger receives operator detail, default discard. Lines about a run
	// are logged with the run's context, so a handler that adds trace ids
	// (tracing.LogHandler) puts them on every line of a run.
	Logger *slog.Logger
	// Tracer records runs as trace spans (agent/tracing); nil records none.
	Tracer Tracer
}

// Agent runs the tool-calling loop behind the gate. It is safe for
// concurrent use. Work happens in a bounded pool of goroutines tied to the
// Agent's own context, which Close cancels.
type Agent struct {
	model     Model
	modelName string
	gate      Gate
	proposals Proposals
	execs     Executions
	req       Requests
	leases    Leases
	records   Records
	inbox     Inbox
	adoption  Adoption
	notify    Notifier
	audit     approval.Auditor
	tools     *toolset
	msgs      *messages

	systemPrompt    string
	maxSteps        int
	stopOnRejection bool
	owner           string
	leaseTTL        time.Duration
	attempts        int
	backoff         time.Duration
	defaultTimeout  time.Duration
	previewTimeout  time.Duration

	now    func() time.Time
	sleep  func(context.Context, time.Duration) error
	ticker Ticker
	log    *slog.Logger
	tracer Tracer

	// ctx is the root of all run work; Close cancels it. It is the pool's
	// lifetime, not a request's.
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{} // pool bound: one token per run doing model or tool work
	wg     sync.WaitGroup

	maxQueued int
	mu        sync.Mutex // guards closed, owned, queue and backlog
	closed    bool
	owned     map[string]bool // runs a worker of this process is on → look at the inbox again
	queue     []string        // runs waiting for a slot, first first (see pool.go)
	backlog   bool            // a run was turned away because the queue was full
}

// New checks opts and returns an Agent. It starts no goroutine; call Resume
// to adopt runs left by stopped processes.
func New(opts Options) (*Agent, error) {
	if err := cmp.Or(
		option.Required("agent: Options.Model", opts.Model == nil),
		option.Required("agent: Options.Gate", opts.Gate == nil),
		option.Required("agent: Options.Lifecycle", opts.Lifecycle == nil),
		option.Required("agent: Options.Requests", opts.Requests == nil),
		option.Required("agent: Options.Runs", opts.Runs == nil),
		option.Required("agent: Options.Notifier", opts.Notifier == nil),
		option.Required("agent: Options.Auditor", opts.Auditor == nil),
	); err != nil {
		return nil, err
	}
	tools, err := newToolset(opts.Tools)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	msgs, err := newMessages(opts.Templates)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	opts.MaxSteps = option.PositiveOr(opts.MaxSteps, DefaultMaxSteps)
	opts.MaxRuns = option.PositiveOr(opts.MaxRuns, DefaultMaxRuns)
	opts.MaxQueued = option.PositiveOr(opts.MaxQueued, DefaultMaxQueued)
	opts.LeaseTTL = option.PositiveOr(opts.LeaseTTL, DefaultLeaseTTL)
	opts.ModelAttempts = option.PositiveOr(opts.ModelAttempts, DefaultModelAttempts)
	opts.ModelBackoff = option.PositiveOr(opts.ModelBackoff, DefaultModelBackoff)
	opts.DefaultTimeout = option.PositiveOr(opts.DefaultTimeout, DefaultRequestTimeout)
	opts.PreviewTimeout = option.PositiveOr(opts.PreviewTimeout, DefaultPreviewTimeout)
	if opts.Owner == "" { // computed only when needed: it asks the OS
		host, _ := os.Hostname()
		opts.Owner = host + "/" + approval.NewID("agent")
	}
	opts.Now = option.FuncOr(opts.Now, time.Now)
	opts.Sleep = option.FuncOr(opts.Sleep, clock.Sleep)
	opts.Ticker = option.FuncOr(opts.Ticker, clock.NewTicker)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.Tracer = cmp.Or[Tracer](opts.Tracer, noTracer{})
	ctx, cancel := context.WithCancel(context.Background())
	return &Agent{
		model: opts.Model, modelName: opts.ModelName, gate: opts.Gate, proposals: opts.Lifecycle, execs: opts.Lifecycle, req: opts.Requests,
		leases: opts.Runs, records: opts.Runs, inbox: opts.Runs, adoption: opts.Runs, notify: opts.Notifier, audit: opts.Auditor, tools: tools, msgs: msgs,
		systemPrompt: opts.SystemPrompt, maxSteps: opts.MaxSteps, stopOnRejection: opts.StopOnRejection,
		owner: opts.Owner, leaseTTL: opts.LeaseTTL, attempts: opts.ModelAttempts, backoff: opts.ModelBackoff,
		defaultTimeout: opts.DefaultTimeout, previewTimeout: opts.PreviewTimeout,
		now: opts.Now, sleep: opts.Sleep, ticker: opts.Ticker, log: opts.Logger, tracer: opts.Tracer,
		ctx: ctx, cancel: cancel, slots: make(chan struct{}, opts.MaxRuns), maxQueued: opts.MaxQueued,
		owned: map[string]bool{},
	}, nil
}

// Owner is the name this process uses in leases and claims.
func (a *Agent) Owner() string { return a.owner }

// Tools returns the tool definitions offered to the model (each schema
// with the optional confidence and reason properties).
func (a *Agent) Tools() []openai.Tool { return append([]openai.Tool(nil), a.tools.offered...) }

// Handle queues a task durably for the run of its thread (starting one, or
// continuing it as a follow-up) and returns. The run proceeds in the pool;
// when all MaxRuns workers are busy the run is queued in this process and
// the task thread is told "Queued — N ahead of you" (the task is also in
// Redis, so another process may adopt it); when MaxQueued runs are queued
// already the task is refused with a message in its thread and not kept. A
// follow-up that arrives while the run waits for decisions is taken once
// the current turn ends.
func (a *Agent) Handle(ctx context.Context, t approval.Task) error {
	if a.isClosed() {
		return ErrClosed
	}
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("agent: handle task: %w", err)
	}
	thread := t.Origin.ThreadTS
	id, err := a.inbox.ThreadRun(ctx, t.Origin.Channel, thread, approval.NewID("run"))
	if err != nil {
		return fmt.Errorf("agent: handle task: %w", err)
	}
	how, ahead := a.admit(id)
	switch how {
	case admitClosed:
		return ErrClosed
	case admitFull:
		a.log.WarnContext(ctx, "run queue full; task refused", "run_id", id, "max_queued", a.maxQueued)
		text := fmt.Sprintf("⛔ Not started: all %d workers are busy and %d tasks are already queued. Nothing was run; please ask again later.", cap(a.slots), a.maxQueued)
		if err := a.notify.Say(ctx, t.Origin, text); err != nil {
			a.log.WarnContext(ctx, "say refused", "run_id", id, "err", err)
		}
		return nil
	}
	if err := a.inbox.Enqueue(ctx, id, b); err != nil {
		a.unadmit(id, how)
		return fmt.Errorf("agent: handle task: %w", err)
	}
	if how != admitStarted {
		// Admitted before the task was in the inbox: the worker on the run
		// (or one launched from the queue meanwhile) may have looked at the
		// inbox before it landed and be leaving. Admit again now that it is
		// there: a worker still on the run looks once more; a run no longer
		// owned is started or queued anew.
		how, ahead = a.admit(id)
	}
	switch how {
	case admitStarted:
		a.launchAdmitted(id, false)
	case admitQueued:
		a.queued(ctx, id, &t.Origin, ahead)
	case admitFull:
		// The task is in the inbox and the run marked adoptable: Resume
		// starts it when the queue drains (or any process's, sooner).
		a.mu.Lock()
		a.backlog = true
		a.mu.Unlock()
		a.log.WarnContext(ctx, "run queue full; task left for adoption", "run_id", id)
	case admitClosed:
		// Closing: the task is durable, and the process that adopts the
		// run next works on it.
	}
	return nil
}

// Resume adopts runs that need a process and have no owner (their lease
// lapsed, was released, or they only have queued tasks), and returns how
// many it started. Call it at start and periodically. Runs are adopted with
// SET NX, so two processes never both resume one run.
func (a *Agent) Resume(ctx context.Context) (int, error) {
	if a.isClosed() {
		return 0, ErrClosed
	}
	n, full := 0, 0
	defer func() {
		if full > 0 {
			a.log.Warn("run queue full; runs left for later", "count", full, "max_queued", a.maxQueued)
		}
	}()
	for start := int64(0); ; start += adoptPage {
		ids, err := a.adoption.ActivePage(ctx, start, adoptPage)
		if err != nil {
			return n, fmt.Errorf("agent: resume: %w", err)
		}
		got := int64(len(ids))
		others := slices.DeleteFunc(ids, a.isOwned)
		won, err := a.adoption.AcquireEach(ctx, others, a.owner, a.leaseTTL)
		if err != nil {
			return n, fmt.Errorf("agent: resume: %w", err)
		}
		for i, id := range others {
			if !won[i] {
				continue // a live process holds it
			}
			admitted, wasFull := a.adopt(ctx, id)
			if admitted {
				n++
			}
			if wasFull {
				full++
			}
		}
		if got < adoptPage {
			return n, nil
		}
	}
}

// adoptPage is how many runs of the adoption set Resume reads per round
// trip, and tries to lease per round trip: a pass over 10,000 active runs
// is 20 reads of O(500) for Redis and at most 20 pipelines, where one
// ZRANGE of the whole set held Redis for milliseconds (every other
// client's command waited behind it) and each run another process owns
// cost a round trip of its own.
const adoptPage = 500

// adopt starts or queues run id, whose lease Resume has just taken:
// admitted when a worker started or the run was queued, full when the
// queue turned it away. The lease is released unless a worker started
// (queued runs take their lease when they start).
func (a *Agent) adopt(ctx context.Context, id string) (admitted, full bool) {
	how, ahead := a.admit(id)
	switch how {
	case admitStarted:
		if a.launchAdmitted(id, true) {
			return true, false
		}
	case admitQueued:
		// Queued runs take their lease when they start.
		a.queued(ctx, id, nil, ahead)
		admitted = true
	case admitFull:
		full = true
		a.mu.Lock()
		a.backlog = true
		a.mu.Unlock()
	}
	a.release(id)
	return admitted, full
}

// ResumeEvery calls Resume at once and then on every tick of the injected
// ticker (every d) until ctx ends, logging errors. It returns ctx's error.
func (a *Agent) ResumeEvery(ctx context.Context, d time.Duration) error {
	c, stop := a.ticker(d)
	defer stop()
	for {
		if n, err := a.Resume(ctx); err != nil {
			if errors.Is(err, ErrClosed) {
				return err
			}
			if ctx.Err() == nil {
				a.log.Warn("resume runs", "err", err)
			}
		} else if n > 0 {
			a.log.Info("resumed runs", "count", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c:
		}
	}
}

// Close stops taking work, cancels the runs' context and waits for the
// workers until ctx ends. Waiting requests are left pending (never
// rejected): their runs' leases are released so any process can adopt
// them. A tool already executing is allowed to finish; when ctx ends first,
// Close returns ctx.Err() and the abandoned runs are adopted after their
// leases lapse.
func (a *Agent) Close(ctx context.Context) error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	done := make(chan struct{})
	go func() { // exits when every worker has returned
		a.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("agent: close: %w", ctx.Err())
	}
}

func (a *Agent) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// isOwned reports whether a worker of this process is on run id or it is
// queued here.
func (a *Agent) isOwned(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, on := a.owned[id]
	return on || a.queuedAt(id) >= 0
}

// launchAdmitted launches run id, for which admit reserved a slot, unless
// the agent closed meanwhile. It reports whether a worker started.
func (a *Agent) launchAdmitted(id string, leased bool) bool {
	a.mu.Lock()
	if a.closed {
		delete(a.owned, id)
		a.mu.Unlock()
		a.freeSlot()
		return false
	}
	a.launch(id, leased)
	a.mu.Unlock()
	return true
}

// work owns run id while it has something to do. It acquires the lease
// (unless leased), drives the run with a heartbeat, releases the lease and
// looks again for tasks queued meanwhile: a task enqueued while another
// worker held the lease is always seen by that worker or by this loop.
func (a *Agent) work(sh *share, id string, leased bool) {
	for {
		var acquired time.Time // when the lease this loop took was asked for; zero when taken before
		if !leased {
			acquired = a.now()
			ok, err := a.leases.Acquire(a.ctx, id, a.owner, a.leaseTTL)
			if err != nil {
				a.log.Error("acquire run lease", "run_id", id, "err", err)
				return
			}
			if !ok {
				return // its owner will see the queued task
			}
		}
		leased = false
		err := a.driveLeased(sh, id, acquired)
		a.release(id)
		if errors.Is(err, errRunLost) {
			a.log.Error("run lost with the store's data; its cards and task thread were told that nothing ran", "run_id", id)
			return
		}
		if err != nil {
			if a.ctx.Err() == nil {
				a.log.Error("run stopped; it will be adopted again", "run_id", id, "err", err)
			}
			return
		}
		if a.ctx.Err() != nil {
			return
		}
		n, err := a.inbox.Queued(a.ctx, id)
		if err != nil || n == 0 {
			return
		}
	}
}

// driveLeased drives the run while this process holds its lease, with a
// heartbeat that cancels the run's context when the lease is lost.
//
// The heartbeat outlives the Agent's context: during shutdown the run
// winds down (waits end at once, a tool already running finishes) and the
// lease must stay ours until its outcome is recorded.
// acquired, when not zero, is when the lease was asked for: Redis keeps it
// a TTL from then (leaseBound).
func (a *Agent) driveLeased(sh *share, id string, acquired time.Time) error {
	ctx, cancel := context.WithCancelCause(a.ctx)
	defer cancel(nil)
	hbCtx, hbStop := context.WithCancel(context.WithoutCancel(a.ctx))
	var hb sync.WaitGroup
	hb.Add(1)
	lease := &leaseBound{}
	if !acquired.IsZero() {
		lease.renewed(acquired, a.leaseTTL)
	}
	go func() { // exits when hbStop is called, or the lease is lost
		defer hb.Done()
		a.heartbeat(hbCtx, cancel, id, lease)
	}()
	err := a.drive(ctx, sh, lease, id)
	hbStop()
	hb.Wait()
	cancel(nil)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// errRunLost is the cause of a run context cancelled because the run's
// record vanished with its lease (Redis lost its data): nobody adopted it,
// so this process tells its cards and thread that nothing ran.
var errRunLost = errors.New("agent: run lost from the store")

// leaseBound is what this process knows of its lease on a run: Redis
// keeps the lease (SET PX) at least until a successful renewal was sent
// plus the TTL. fence trusts it instead of asking Redis again while more
// than half a TTL of it is left.
type leaseBound struct {
	mu    sync.Mutex // guards until
	until time.Time
}

// renewed records a renewal of ttl sent at sent that succeeded.
func (l *leaseBound) renewed(sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := sent.Add(ttl); u.After(l.until) {
		l.until = u
	}
}

// holds reports whether the lease is certainly ours until at least now +
// margin.
func (l *leaseBound) holds(now time.Time, margin time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Add(margin).Before(l.until)
}

func (a *Agent) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, id string, lease *leaseBound) {
	c, stop := a.ticker(a.leaseTTL / 3)
	defer stop()
	renewed := a.now() // the lease was taken or extended at least this late
	for {
		select {
		case <-ctx.Done():
			return
		case <-c:
			at := a.now()
			ok, err := a.leases.Extend(ctx, id, a.owner, a.leaseTTL)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				a.log.Warn("extend run lease", "run_id", id, "err", err)
				if a.now().Sub(renewed) >= a.leaseTTL {
					// No renewal for a whole TTL: the lease has lapsed and
					// another process may have adopted the run.
					cancel(fmt.Errorf("%w: not renewed for %v: %w", approval.ErrLeaseLost, a.leaseTTL, err))
					return
				}
				continue // a transient error; the lease is still ours
			}
			if !ok {
				if _, _, lerr := a.records.Load(ctx, id); errors.Is(lerr, approval.ErrNotFound) {
					cancel(errRunLost)
					return
				}
				cancel(approval.ErrLeaseLost)
				return
			}
			renewed = at
			lease.renewed(at, a.leaseTTL)
		}
	}
}

// release gives up the lease with a context that outlives shutdown, so a
// clean stop hands the run over at once.
func (a *Agent) release(id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 5*time.Second)
	defer cancel()
	if _, err := a.leases.Release(ctx, id, a.owner); err != nil {
		a.log.Warn("release run lease", "run_id", id, "err", err)
	}
}
