package bot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// Seeded identities.
const (
	alice     = "U0ALICE01" // asks for things
	bob       = "U0BOB0001" // approver (approvals channel member)
	carol     = "U0CAROL01" // approver (approvals channel member)
	mallory   = "U0MALLORY" // in the task channel, not an approver
	tasks     = "C0TASKS01"
	other     = "C0OTHER01"
	approvals = "G0APPROV1"
	secret    = "test-signing-secret"
)

const refundSchema = `{
  "type": "object",
  "properties": {
    "order_id": {"type": "string", "maxLength": 20},
    "amount":   {"type": "integer", "minimum": 1, "maximum": 500},
    "reason":   {"type": "string", "enum": ["damaged", "late", "other"]},
    "notify":   {"type": "boolean"},
    "email":    {"type": "string", "format": "email"},
    "note":     {"type": "string", "maxLength": 2000},
    "meta":     {"type": "object"}
  },
  "required": ["order_id", "amount"],
  "additionalProperties": false
}`

// notifier lets tests wait for changes without sleeping.
type notifier struct {
	mu sync.Mutex // guards ch
	ch chan struct{}
}

func (n *notifier) changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) bump() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
	}
	n.ch = make(chan struct{})
}

// fakeRunner records tasks.
type fakeRunner struct {
	notifier
	mu    sync.Mutex // guards tasks
	tasks []approval.Task
}

func (r *fakeRunner) Handle(_ context.Context, t approval.Task) error {
	r.mu.Lock()
	r.tasks = append(r.tasks, t)
	r.mu.Unlock()
	r.bump()
	return nil
}

func (r *fakeRunner) Tasks() []approval.Task {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.tasks)
}

// fakeAudit records audit records.
type fakeAudit struct {
	notifier
	mu   sync.Mutex // guards recs
	recs []approval.Record
}

func (a *fakeAudit) Append(_ context.Context, r approval.Record) (approval.Entry, error) {
	a.mu.Lock()
	a.recs = append(a.recs, r)
	n := len(a.recs)
	a.mu.Unlock()
	a.bump()
	return approval.Entry{Seq: int64(n), Event: r.Event}, nil
}

func (a *fakeAudit) all() []approval.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.recs)
}

func (a *fakeAudit) Records(ev approval.Event) []approval.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []approval.Record
	for _, r := range a.recs {
		if r.Event == ev {
			out = append(out, r)
		}
	}
	return out
}

// hangAfter is how long the harness waits for something before calling it
// a hang. It bounds waits, it times nothing: TestCardWithinBlockKitLimits'
// 3 MB request takes 2 s alone and 14 s under -race on a loaded 2-core
// machine, where 10 s failed it once.
const hangAfter = 60 * time.Second

// waitCh waits until cond holds, re-checking whenever changed fires.
func waitCh(tb testing.TB, what string, changed func() <-chan struct{}, cond func() bool) {
	tb.Helper()
	deadline := time.After(hangAfter)
	for {
		ch := changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// countingStore is the real store, counting FirstSeen calls per event id.
type countingStore struct {
	*store.Store
	notifier
	mu      sync.Mutex // guards seen, seenErr, stall, afterRead
	seen    map[string]int
	seenErr error // when set, FirstSeen fails with it (Redis unreachable)
	// stall, when set, holds the next Request call (Redis slow to answer):
	// it is sent the call's release channel and is then cleared.
	stall chan chan struct{}
	// afterRead, when set, holds the next Request call once it has read
	// the record (a process paused between its read and what it does
	// with it): it is sent the call's release channel and is then cleared.
	afterRead chan chan struct{}
	// bindHook, when set, runs once, inside the next BindCard before the
	// binding is recorded: the window between Slack's answer and the
	// binding. It is cleared as it runs, so a BindCard made from inside it
	// (a click binding the card) runs no hook.
	bindHook func(id string, ref approval.CardRef)
	// bindFails makes that many next BindCard calls fail as Redis does in
	// a fail-over.
	bindFails int
}

func (c *countingStore) BindCard(ctx context.Context, id string, ref approval.CardRef) (bool, error) {
	c.mu.Lock()
	hook := c.bindHook
	c.bindHook = nil
	fail := c.bindFails > 0
	if fail {
		c.bindFails--
	}
	c.mu.Unlock()
	if hook != nil {
		hook(id, ref)
	}
	if fail {
		return false, fmt.Errorf("bind card %s: i/o timeout", id)
	}
	return c.Store.BindCard(ctx, id, ref)
}

// countingRecords is the ledger of the counting store: its reads and
// bindings go through the counting store's hooks.
type countingRecords struct {
	*store.Ledger
	c *countingStore
}

func (r countingRecords) Request(ctx context.Context, id string) (*approval.Request, error) {
	return r.c.Request(ctx, id)
}

func (r countingRecords) BindCard(ctx context.Context, id string, ref approval.CardRef) (bool, error) {
	return r.c.BindCard(ctx, id, ref)
}

func (c *countingStore) setBindHook(h func(id string, ref approval.CardRef)) {
	c.mu.Lock()
	c.bindHook = h
	c.mu.Unlock()
}

func (c *countingStore) Request(ctx context.Context, id string) (*approval.Request, error) {
	c.hold(ctx, &c.stall)
	r, err := c.Store.Request(ctx, id)
	c.hold(ctx, &c.afterRead)
	return r, err
}

// hold takes the hold in *h (stall or afterRead), if one is set, and
// waits until the test releases it or ctx ends.
func (c *countingStore) hold(ctx context.Context, h *chan chan struct{}) {
	c.mu.Lock()
	held := *h
	*h = nil
	c.mu.Unlock()
	if held == nil {
		return
	}
	release := make(chan struct{})
	held <- release
	select {
	case <-release:
	case <-ctx.Done():
	}
}

func (c *countingStore) FirstSeen(ctx context.Context, eventID string, ttl time.Duration) (bool, error) {
	c.mu.Lock()
	fail := c.seenErr
	c.mu.Unlock()
	first, err := c.Store.FirstSeen(ctx, eventID, ttl)
	if fail != nil {
		first, err = false, fail
	}
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[eventID]++
	c.mu.Unlock()
	c.bump()
	return first, err
}

func (c *countingStore) Seen(eventID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[eventID]
}

type harness struct {
	requests *countingStore
	t        testing.TB
	ctx      context.Context
	clock    *clocktest.Clock
	ws       *slacksim.Workspace
	api      *slack.Client
	store    *store.Store
	runner   *fakeRunner
	audit    *fakeAudit
	policy   *policyfile.File
	bot      *bot.Bot
	life     *approval.Lifecycle              // the last bot's lifecycle owner
	livesMu  sync.Mutex                       // guards lives
	lives    map[*bot.Bot]*approval.Lifecycle // each bot's lifecycle owner
	rdb      redis.UniversalClient
	prefix   string
	srv      *httptest.Server // the bot's HTTP endpoint (HTTP mode)
	log      *slog.Logger
	// route makes b the process the workspace delivers to over HTTP
	// (another process took over after a crash).
	route func(b *bot.Bot)
}

type harnessConfig struct {
	delivery slacksim.Delivery
	noSocket bool // HTTP mode: true; socket mode: do not connect
	policy   func(*policyfile.File)
	logger   *slog.Logger // the bot's logger, default discard
	store    func(*store.Options)
}

func testPolicy() *policyfile.File {
	return &policyfile.File{
		Version: 1,
		Slack:   policyfile.Slack{ApprovalsChannel: approvals, TaskChannels: []string{tasks}},
		Policy: approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
			"issue_refund": {Name: "issue_refund", Risk: approval.RiskHigh, Quorum: 1,
				Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject, approval.VerdictRespond},
				Deny:      []approval.DenyRule{{When: `args.reason == "other" && args.amount > 100`, Reason: "refunds over $100 need a stated reason"}}},
		}},
		Tools: []policyfile.Tool{{Name: "issue_refund", Description: "Refund an order", Schema: json.RawMessage(refundSchema)}},
	}
}

// newHarness seeds a slacksim workspace, a store on (mini)redis and a bot
// wired to them with the real slack-go client, in Socket Mode or HTTP mode.
func newHarness(t testing.TB, cfg harnessConfig) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{t: t, ctx: ctx, clock: clocktest.New(clocktest.Opts{Start: time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)}), runner: &fakeRunner{}, audit: &fakeAudit{}, policy: testPolicy(), log: cfg.logger,
		lives: map[*bot.Bot]*approval.Lifecycle{}}
	if cfg.policy != nil {
		cfg.policy(h.policy)
	}

	var handler http.Handler = http.NotFoundHandler()
	var hmu sync.Mutex // guards handler
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hmu.Lock()
		hd := handler
		hmu.Unlock()
		hd.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)

	opts := slacksim.Options{Delivery: cfg.delivery, Now: h.clock.Now, SigningSecret: secret, Manifest: slacksimtest.Manifest(t)}
	if cfg.delivery == slacksim.HTTP {
		opts.EventsURL = h.srv.URL + "/slack/events"
		opts.InteractiveURL = h.srv.URL + "/slack/interactive"
		opts.CommandsURL = h.srv.URL + "/slack/commands"
	}
	h.ws = slacksim.New(opts)
	wsrv := httptest.NewServer(h.ws.Handler())
	h.ws.SetBaseURL(wsrv.URL)
	t.Cleanup(func() { h.ws.Close(); wsrv.Close() })
	h.ws.AddUser(slacksim.User{ID: alice, Name: "alice"})
	h.ws.AddUser(slacksim.User{ID: bob, Name: "bob"})
	h.ws.AddUser(slacksim.User{ID: carol, Name: "carol"})
	h.ws.AddUser(slacksim.User{ID: mallory, Name: "mallory"})
	h.ws.AddChannel(slacksim.Channel{ID: tasks, Name: "tasks", Members: []string{alice, bob, mallory, slacksim.BotUserID}})
	h.ws.AddChannel(slacksim.Channel{ID: other, Name: "other", Members: []string{alice, slacksim.BotUserID}})
	h.ws.AddChannel(slacksim.Channel{ID: approvals, Name: "approvals", IsPrivate: true, Members: []string{alice, bob, carol, slacksim.BotUserID}})

	h.api = slack.New("xoxb-sim", slack.OptionAPIURL(h.ws.APIURL()), slack.OptionAppLevelToken("xapp-sim"))
	rdb, prefix := storetest.New(t)
	h.rdb, h.prefix = rdb, prefix
	sopts := store.Options{Prefix: prefix, Now: h.clock.Now}
	if cfg.store != nil {
		cfg.store(&sopts)
	}
	h.store = store.New(rdb, sopts)
	h.requests = &countingStore{Store: h.store}
	t.Cleanup(func() { _ = h.store.Close() })

	h.route = func(b *bot.Bot) {
		hmu.Lock()
		handler = b.HTTPHandler()
		hmu.Unlock()
	}
	h.bot = h.newBot()
	h.route(h.bot)

	if cfg.delivery == slacksim.SocketMode && !cfg.noSocket {
		smc := socketmode.New(h.api)
		done := make(chan struct{})
		go func() { // exits when ctx is cancelled in Cleanup
			defer close(done)
			_ = h.bot.RunSocketMode(ctx, smc)
		}()
		t.Cleanup(func() { cancel(); <-done })
		h.waitWS("socket connection", func() bool { return h.ws.Connections() > 0 })
	}
	return h
}

// newBot returns a started bot sharing the harness's Slack, store and
// fakes; edits adjust its options.
func (h *harness) newBot(edits ...func(*bot.Options)) *bot.Bot {
	h.t.Helper()
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Records: countingRecords{store.NewLedger(h.requests.Store, h.audit), h.requests}, Now: h.clock.Now,
		Sleep: h.clock.Sleep, Gate: mustGate(h.t, h.policy), Schemas: h.policy})
	if err != nil {
		h.t.Fatalf("NewLifecycle: %v", err)
	}
	opts := bot.Options{
		Slack: h.api, Requests: h.requests, Lifecycle: life, Runner: h.runner, Policy: h.policy,
		Now: h.clock.Now, Sleep: h.clock.Sleep, Workers: 4, SigningSecret: secret, Logger: h.log,
	}
	for _, edit := range edits {
		edit(&opts)
	}
	b, err := bot.New(opts)
	if err != nil {
		h.t.Fatalf("bot.New: %v", err)
	}
	life.SetCards(b)
	life.SetDirectory(b)
	h.life = life
	h.livesMu.Lock()
	h.lives[b] = life
	h.livesMu.Unlock()
	if err := b.Start(h.ctx); err != nil {
		h.t.Fatalf("Start: %v", err)
	}
	h.t.Cleanup(func() { _ = b.Close() })
	return b
}

// mustGate is the gate of policy file pf, as serve builds it: the
// lifecycle judges every edit with it.
func mustGate(tb testing.TB, pf *policyfile.File) *approval.Gate {
	tb.Helper()
	g, err := approval.NewGate(pf.Policy)
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	return g
}

func (h *harness) waitWS(what string, cond func() bool) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.ctx, hangAfter)
	defer cancel()
	if err := h.ws.WaitFor(ctx, cond); err != nil {
		h.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// request stores a pending request for alice's refund and posts its card,
// as the agent would.
func (h *harness) request(mod func(r *approval.Request)) *approval.Request {
	h.t.Helper()
	threadTS, err := h.ws.PostMessage(alice, tasks, "please refund order 1234", "")
	if err != nil {
		h.t.Fatalf("PostMessage: %v", err)
	}
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: alice,
		Origin: approval.Origin{Channel: tasks, ThreadTS: threadTS},
		Tool:   "issue_refund", Risk: approval.RiskHigh,
		Args:   json.RawMessage(`{"order_id":"1234","amount":64,"reason":"damaged","notify":true,"email":"a@example.com"}`),
		Reason: "The customer says it arrived broken.",
		Preview: approval.Preview{Summary: "Refund $64.00 to Dana for order 1234", Source: "shop",
			Facts: []approval.Fact{{Label: "Order total", Value: "$64.00"}, {Label: "Customer", Value: "Dana"}}},
		Signals:   []approval.Signal{{Code: "risk_high", Text: "tool risk is high"}},
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject, approval.VerdictRespond},
		Quorum:    1,
		Deadline:  h.clock.Now().Add(time.Hour),
	}
	if mod != nil {
		mod(r)
	}
	if err := h.store.CreateRequest(h.ctx, r); err != nil {
		h.t.Fatalf("CreateRequest: %v", err)
	}
	if _, err := h.post(h.ctx, h.bot, r); err != nil {
		h.t.Fatalf("post: %v", err)
	}
	r.Card = h.load(r.ID).Card
	return r
}

// post has process b post r's card the way production does
// (Lifecycle.EnsureCard: the lifecycle notes the attempt, b posts, the
// lifecycle binds) and returns where r's card is; an error when no card
// is bound (the request was cancelled, failing closed, or ctx ended).
func (h *harness) post(ctx context.Context, b *bot.Bot, r *approval.Request) (approval.CardRef, error) {
	h.livesMu.Lock()
	life := h.lives[b]
	h.livesMu.Unlock()
	cur := life.EnsureCard(ctx, r)
	if !cur.Card.Bound() {
		return approval.CardRef{}, fmt.Errorf("card of %s not bound (%s, ctx %v)", r.ID, cur.Status, ctx.Err())
	}
	return cur.Card, nil
}

// redraw asks the bot to redraw r's card and waits until it is drawn.
func (h *harness) redraw(r *approval.Request) {
	h.t.Helper()
	h.bot.Refresh(r)
	h.cardsIdle()
}

// decided plays r's run once r is final: it has the task thread told
// (Bot.Decided, as the agent does before it goes on) and returns the
// record told.
func (h *harness) decided(r *approval.Request) *approval.Request {
	h.t.Helper()
	cur := h.load(r.ID)
	if err := h.bot.Decided(h.ctx, cur); err != nil {
		h.t.Fatalf("Decided(%s): %v", r.ID, err)
	}
	return cur
}

// waitCardFinal waits until r's card has lost its buttons and the card
// writer is done (the task thread told).
func (h *harness) waitCardFinal(r *approval.Request) {
	h.t.Helper()
	h.waitWS("card of "+r.ID+" final", func() bool { return !hasAction(h.card(r).Blocks, "cs_approve") })
	h.cardsIdle()
}

// cardsIdle waits until the bot's card writer has nothing left to draw.
func (h *harness) cardsIdle() {
	h.t.Helper()
	h.cardsIdleOf(h.bot)
}

// cardsIdleOf waits until b's card writer has nothing left to draw (b: a
// process other than h.bot, newBot).
func (h *harness) cardsIdleOf(b *bot.Bot) {
	h.t.Helper()
	select {
	case <-b.CardsIdle():
	case <-time.After(hangAfter):
		h.t.Fatalf("card writer still busy after %v", hangAfter)
	}
}

func (h *harness) load(id string) *approval.Request {
	h.t.Helper()
	r, err := h.store.Request(h.ctx, id)
	if err != nil {
		h.t.Fatalf("Request(%s): %v", id, err)
	}
	return r
}

// cardPermalink is the link to r's card, as chat.getPermalink gives it.
func (h *harness) cardPermalink(r *approval.Request) string {
	return h.ws.BaseURL() + "/archives/" + r.Card.Channel + "/p" + strings.Replace(r.Card.TS, ".", "", 1)
}

// card returns the card message as the workspace shows it.
func (h *harness) card(r *approval.Request) slacksim.Message {
	h.t.Helper()
	m, ok := h.ws.Message(r.Card.Channel, r.Card.TS)
	if !ok {
		h.t.Fatalf("card %s/%s not found", r.Card.Channel, r.Card.TS)
	}
	return m
}

// ephemeralContaining waits for an ephemeral to user containing text.
func (h *harness) ephemeralContaining(user, text string) slacksim.Message {
	h.t.Helper()
	var got slacksim.Message
	h.waitWS("ephemeral to "+user+" containing "+text, func() bool {
		for _, m := range h.ws.Ephemerals(user) {
			if strings.Contains(m.Text, text) || strings.Contains(allText(m.Blocks), text) {
				got = m
				return true
			}
		}
		return false
	})
	return got
}

// openView waits for user's modal with callbackID.
func (h *harness) openView(user, callbackID string) slacksim.View {
	h.t.Helper()
	var got slacksim.View
	h.waitWS("modal "+callbackID+" for "+user, func() bool {
		for _, v := range h.ws.OpenViews(user) {
			if v.CallbackID == callbackID {
				got = v
				return true
			}
		}
		return false
	})
	return got
}

// waitStatus waits until the stored request reaches st.
func (h *harness) waitStatus(id string, st approval.Status) *approval.Request {
	h.t.Helper()
	var r *approval.Request
	waitCh(h.t, "request "+id+" "+string(st), h.audit.changed, func() bool {
		r = h.load(id)
		return r.Status == st
	})
	return r
}

// blockTexts returns every text string in a Block Kit JSON array.
func blockTexts(raw json.RawMessage) []string {
	var blocks []any
	_ = json.Unmarshal(raw, &blocks)
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if s, ok := x["text"].(string); ok {
				out = append(out, s)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(blocks)
	return out
}

func hasAction(raw json.RawMessage, actionID string) bool {
	return strings.Contains(string(raw), `"action_id":"`+actionID+`"`)
}

// allText joins every text in a Block Kit JSON array (unescaped, unlike the
// raw JSON where encoding/json writes < as \u003c).
func allText(raw json.RawMessage) string { return strings.Join(blockTexts(raw), "\n") }
