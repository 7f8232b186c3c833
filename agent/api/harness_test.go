package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// Keys of the harness: full may ask for any tool, narrow only for refund.
const (
	fullKey   = "csk_full_test_key"
	narrowKey = "csk_narrow_test_key"
)

// cards stands in for the bot: it "posts" a card as a made-up message
// (the lifecycle binds it), counts posts and keeps the request each card
// was last redrawn with.
type cards struct {
	store *store.Store
	mu    sync.Mutex // guards posts and drawn
	posts map[string]int
	drawn map[string]approval.Request
}

func (c *cards) Post(_ context.Context, r *approval.Request, _ bool) (approval.CardRef, bool, error) {
	c.mu.Lock()
	c.posts[r.ID]++
	n := len(c.posts)
	c.mu.Unlock()
	return approval.CardRef{Channel: "G0APPROV1", TS: fmt.Sprintf("1700000000.%06d", n)}, false, nil
}

func (c *cards) Posted(context.Context, *approval.Request)                   {}
func (c *cards) Delete(context.Context, *approval.Request, approval.CardRef) {}
func (c *cards) Refresh(r *approval.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drawn[r.ID] = *r
}

// Drawn returns the request the card of id was last redrawn with.
func (c *cards) Drawn(id string) (approval.Request, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.drawn[id]
	return r, ok
}

func (c *cards) Posts(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts[id]
}

// waitingStore is the store as the API reads it, telling the test each
// time a long poll starts waiting on the wake hub.
type waitingStore struct {
	*store.Store
	waits chan string // one id per Wait call; buffered
	// watchErr, when set, fails the next Watch (as a poll whose caller
	// went while its watch was set up), and is then cleared.
	watchErr error
}

func (w *waitingStore) Wait(ctx context.Context, id string) (*approval.Request, error) {
	select {
	case w.waits <- id:
	default:
	}
	return w.Store.Wait(ctx, id)
}

func (w *waitingStore) Watch(ctx context.Context, id string, ready func(*approval.Request, error)) (*approval.Request, func(), error) {
	select {
	case w.waits <- id:
	default:
	}
	if err := w.watchErr; err != nil {
		w.watchErr = nil
		return nil, nil, err
	}
	return w.Store.Watch(ctx, id, ready)
}

// notifyingAudit is the audit stream, closing a channel after each append
// so tests wait for entries without sleeping.
type notifyingAudit struct {
	*store.Audit
	mu sync.Mutex // guards ch
	ch chan struct{}
}

func (a *notifyingAudit) Append(ctx context.Context, r approval.Record) (approval.Entry, error) {
	e, err := a.Audit.Append(ctx, r)
	a.notify()
	return e, err
}

// AppendWake is store.Audit's (which the lifecycle prefers: it would be
// promoted from the embedded Audit without telling the test), telling.
func (a *notifyingAudit) AppendWake(ctx context.Context, r approval.Record, id string, st approval.Status) (approval.Entry, bool, error) {
	e, woke, err := a.Audit.AppendWake(ctx, r, id, st)
	a.notify()
	return e, woke, err
}

// ClaimAppend is store.Audit's (which the lifecycle prefers, as
// AppendWake), telling.
func (a *notifyingAudit) ClaimAppend(ctx context.Context, r approval.Record, id, owner, tokenHash, digest string) (*approval.Request, approval.Entry, bool, error) {
	got, e, appended, err := a.Audit.ClaimAppend(ctx, r, id, owner, tokenHash, digest)
	if appended {
		a.notify()
	}
	return got, e, appended, err
}

// DecideAppendWake is store.Audit's (which the lifecycle prefers, as
// AppendWake), telling.
func (a *notifyingAudit) DecideAppendWake(ctx context.Context, d approval.Decision, r approval.Record, st approval.Status, digest string) (*approval.Request, approval.Entry, bool, bool, error) {
	after, e, appended, woke, err := a.Audit.DecideAppendWake(ctx, d, r, st, digest)
	if appended {
		a.notify()
	}
	return after, e, appended, woke, err
}

func (a *notifyingAudit) notify() {
	a.mu.Lock()
	if a.ch != nil {
		close(a.ch)
	}
	a.ch = make(chan struct{})
	a.mu.Unlock()
}

func (a *notifyingAudit) changed() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ch == nil {
		a.ch = make(chan struct{})
	}
	return a.ch
}

// harness is the API on a real store and audit stream (Redis from
// REDIS_URL, else miniredis), the real lifecycle owner and gate, with a
// stand-in card writer, served over HTTP.
type harness struct {
	reads   *waitingStore // the store as the API reads it
	cut     *cutPolls     // the poll counts a test cuts short (TestWithdrawIfGone), or nil
	t       testing.TB
	ctx     context.Context
	clock   *clocktest.Clock
	store   *store.Store
	waits   chan string   // ids of long polls that started waiting
	http    *http.Client  // the client of the server (TLS when http2); nil: the default
	parks   chan struct{} // one per long poll parked (park.go)
	unparks chan struct{} // one per parked long poll ended
	gones   chan string   // one id per poll sent with withdraw_if_gone that ended without the decision
	// replicaParked gets one value per poll parked on the replica (gone_test.go)
	replicaParked chan struct{}
	audit         *notifyingAudit
	life          *approval.Lifecycle
	cards         *cards
	server        *api.Server
	url           string
	hooks         *api.Webhooks
}

type harnessOptions struct {
	rate      int // the full key's calls per minute, default 1000
	maxWait   time.Duration
	maxBody   int64
	endpoints []api.Endpoint
	// writeTimeout, when set, is the test server's http.Server.WriteTimeout
	// (serve sets one for every answer).
	writeTimeout time.Duration
	// policy, when set, replaces testPolicy().
	policy *approval.Policy
	// names, when set, names approvers in views and webhooks.
	names api.Names
	// rdb and prefix, when set, are the deployment's Redis and key prefix
	// (default storetest.New's).
	rdb    redis.UniversalClient
	prefix string
	// limiter, when set, makes the server's Limiter from the harness's
	// store (default: the API's own, per process).
	limiter func(*store.Store) api.Limiter
	// reuse, when set, is the server's Reuse (parked polls' connections
	// handed back); default none: closed after the answer.
	reuse func(net.Conn, []byte)
	// http2 serves over TLS with HTTP/2 (h.http is the client that
	// trusts it).
	http2 bool
	// records, when set, makes the lifecycle's records from the
	// harness's store (default: the store itself).
	records func(*store.Ledger) approval.Records
	// logger, when set, is the server's Logger (default: discard).
	logger *slog.Logger
	// polls, when set, makes the server's Polls from the harness's store
	// (default: the API's own, per process).
	polls func(*store.Store) api.Polls
}

func testPolicy() approval.Policy {
	return approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"refund": {Risk: approval.RiskMedium, Review: approval.ReviewAlways, Quorum: 1,
			Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
			Deny:      []approval.DenyRule{{When: "double(args.amount) > 2000.0", Reason: "refunds above $2,000 go through finance"}}},
		"lookup": {Risk: approval.RiskLow, Review: approval.ReviewNever},
	}}
}

func newHarness(t testing.TB, o harnessOptions) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rdb, prefix := o.rdb, o.prefix
	if rdb == nil {
		rdb, prefix = storetest.New(t)
	}
	h := &harness{t: t, ctx: ctx, clock: clocktest.New(clocktest.Opts{Start: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)})}
	h.store = store.New(rdb, store.Options{Prefix: prefix, Now: h.clock.Now})
	t.Cleanup(func() { _ = h.store.Close() })
	// Wakes as cmd/countersign wires it: a decision's wake-up rides with
	// its audit entry (Audit.AppendWake) where the server allows it.
	h.audit = &notifyingAudit{Audit: store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: h.clock.Now, Wakes: h.store})}
	h.waits = make(chan string, 10000)
	h.cards = &cards{store: h.store, posts: map[string]int{}, drawn: map[string]approval.Request{}}
	pol := testPolicy()
	if o.policy != nil {
		pol = *o.policy
	}
	hooks, err := api.NewWebhooks(api.WebhookOptions{Endpoints: o.endpoints, Audit: h.audit, Now: h.clock.Now, Sleep: h.clock.Sleep, Names: o.names,
		Secret: func(tool string) []string { return pol.Tools[tool].Secret }})
	if err != nil {
		t.Fatalf("NewWebhooks: %v", err)
	}
	h.hooks = hooks
	done := make(chan struct{})
	go func() { defer close(done); hooks.Run(ctx) }() // exits when ctx is cancelled
	t.Cleanup(func() { cancel(); <-done })
	gate, err := approval.NewGate(pol)
	if err != nil {
		t.Fatalf("NewGate: %v", err)
	}
	// Schemas: the callers' input schemas (the policy here has no tool
	// specs, so no declared tool has a schema of its own).
	var records approval.Records = store.NewLedger(h.store, h.audit)
	if o.records != nil {
		// Every transition through records: the audit only appends
		// (it would otherwise claim and decide in the store itself).
		records = o.records(store.NewLedger(h.store, struct{ approval.Auditor }{h.audit}))
	}
	h.life, err = approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: records, Cards: h.cards, Gate: gate,
		Schemas: &policyfile.File{Policy: pol}, Now: h.clock.Now, OnFinal: hooks.Notify})
	if err != nil {
		t.Fatalf("NewLifecycle: %v", err)
	}
	rate := o.rate
	if rate == 0 {
		rate = 1000
	}
	secret, err := h.store.Secret(ctx)
	if err != nil {
		t.Fatalf("Secret: %v", err)
	}
	var limiter api.Limiter
	if o.limiter != nil {
		limiter = o.limiter(h.store)
	}
	var polls api.Polls
	if o.polls != nil {
		polls = o.polls(h.store)
	}
	h.reads = &waitingStore{Store: h.store, waits: h.waits}
	h.server, err = api.New(api.Options{IDSecret: secret, Limiter: limiter, Reuse: o.reuse, Polls: polls,
		Lifecycle: h.life, Requests: h.reads, Audit: h.audit, Now: h.clock.Now, MaxWait: o.maxWait, MaxBodyBytes: o.maxBody, Names: o.names, Logger: o.logger,
		Keys: []api.Key{
			{Name: "full", SHA256: api.HashKey(fullKey), Tools: []string{"*"}, SlackUser: "U0ALICE01", RatePerMinute: rate},
			{Name: "narrow", SHA256: api.HashKey(narrowKey), Tools: []string{"refund"}},
		},
	})
	if err != nil {
		t.Fatalf("api.New: %v", err)
	}
	h.parks = make(chan struct{}, 10000)
	h.unparks = make(chan struct{}, 10000)
	api.OnPark(h.server, func(parked bool) {
		ch := h.parks
		if !parked {
			ch = h.unparks
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	h.gones = make(chan string, 10000)
	api.OnGone(h.server, func(id string) { h.gones <- id })
	mux := http.NewServeMux()
	mux.Handle("/v1/", h.server.Handler())
	mux.Handle(api.HumanLayerPrefix, h.server.HumanLayerHandler())
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.WriteTimeout = o.writeTimeout
	if o.http2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		h.http = srv.Client()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	t.Cleanup(func() { // before srv.Close: parked polls are not its
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.server.Release(rctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
	h.url = srv.URL
	return h
}

func (h *harness) client(key string) *client.Client {
	c := client.New(h.url, key)
	if h.http != nil {
		c.HTTP = h.http
	}
	c.PollWait = 10 * time.Second
	return c
}

// decide records a person's decision on id through the lifecycle owner, as
// a click would.
func (h *harness) decide(id string, v approval.Verdict, approver, text string) *approval.Request {
	h.t.Helper()
	r, err := h.store.Request(h.ctx, id)
	if err != nil {
		h.t.Fatalf("Request(%s): %v", id, err)
	}
	after, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: id, Verdict: v, Approver: approver, Text: text, At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{})
	if err != nil {
		h.t.Fatalf("Decide(%s, %s): %v", id, v, err)
	}
	return after
}

// events returns the audit entries of one event, oldest first.
func (h *harness) events(ev approval.Event) []approval.Entry {
	h.t.Helper()
	all, err := h.audit.Range(h.ctx, "", 10000)
	if err != nil {
		h.t.Fatalf("audit Range: %v", err)
	}
	var out []approval.Entry
	for _, e := range all {
		if e.Event == ev {
			out = append(out, e)
		}
	}
	return out
}

// waitPolls waits until n long polls have started waiting on the hub.
func (h *harness) waitPolls(n int) {
	h.t.Helper()
	receiveN(h.t, h.waits, n, "long polls waiting")
}

// waitParked waits until n long polls have been parked.
func (h *harness) waitParked(n int) {
	h.t.Helper()
	receiveN(h.t, h.parks, n, "long polls parked")
}

// waitUnparked waits until n parked long polls have ended.
func (h *harness) waitUnparked(n int) {
	h.t.Helper()
	receiveN(h.t, h.unparks, n, "parked long polls ended")
}

// receiveN receives n values from ch, or fails after 30 s saying what.
func receiveN[T any](t testing.TB, ch <-chan T, n int, what string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for i := range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("%d of %d %s after 30s", i, n, what)
		}
	}
}

// waitAudit waits until cond holds, re-checking after each audit append.
func (h *harness) waitAudit(what string, cond func() bool) {
	h.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		changed := h.audit.changed()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			h.t.Fatalf("waiting for %s: timed out", what)
		}
	}
}
