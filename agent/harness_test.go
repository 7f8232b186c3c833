package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// testPolicy is the policy and tools file of the acceptance tests.
// {{env "SOR_URL"}} is the test's system of record.
const testPolicy = `version: 1
slack:
  approvals_channel: C0APPROVALS
agent:
  max_steps: 8
defaults:
  risk: medium
  review: auto
  decisions: [approve, reject]
  timeout: 24h
  approvers: {channel_members: true}
tools:
  - name: lookup_order
    description: Look up an order and its customer.
    risk: low
    capabilities: [read]
    review: never
    schema:
      type: object
      properties:
        order_id: {type: string}
      required: [order_id]
      additionalProperties: false
    http:
      method: GET
      url: '{{env "SOR_URL"}}/orders/{{urlquery .Args.order_id}}'
  - name: send_email
    description: Send an email to a customer.
    risk: medium
    capabilities: [send_email]
    review: always
    decisions: [approve, edit, reject, respond]
    schema:
      type: object
      properties:
        to: {type: string}
        subject: {type: string, minLength: 1}
        body: {type: string, minLength: 1}
      required: [to, subject, body]
      additionalProperties: false
    http:
      method: POST
      url: '{{env "SOR_URL"}}/emails'
    preview:
      url: '{{env "SOR_URL"}}/preview/customers?email={{urlquery .Args.to}}'
      fields:
        - {label: Customer, path: name}
  - name: issue_refund
    description: Refund part of an order.
    risk: medium
    capabilities: [spend_money]
    review: always
    decisions: [approve, edit, reject]
    secret: [reason]
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number, exclusiveMinimum: 0, maximum: 10000}
        reason: {type: string}
      required: [order_id, amount, reason]
      additionalProperties: false
    preauthorize: 1h
    deny:
      - when: args.reason.contains("chargeback")
        reason: refunds on a disputed charge go through finance
    http:
      method: POST
      url: '{{env "SOR_URL"}}/refunds'
      headers:
        Authorization: 'Bearer {{env "SOR_TOKEN"}}'
    preview:
      label: the order system
      url: '{{env "SOR_URL"}}/preview/orders/{{urlquery .Args.order_id}}'
      summary: 'Refund {{.Args.amount}} to {{.Data.customer.name}}'
      fields:
        - {label: Customer, path: customer.name}
        - {label: Shipping paid, path: shipping}
        - {label: Missing, path: no.such.field}
  - name: delete_customer
    description: Delete a customer record.
    risk: high
    capabilities: [delete]
    review: always
    schema:
      type: object
      properties:
        customer_id: {type: string, pattern: '^C-[0-9]+$'}
      required: [customer_id]
      additionalProperties: false
    http:
      method: DELETE
      url: '{{env "SOR_URL"}}/customers/{{urlquery .Args.customer_id}}'
  - name: wire_money
    description: Wire money (a library tool that is not idempotent).
    risk: high
    capabilities: [spend_money]
    review: always
    schema:
      type: object
      properties:
        amount: {type: number}
      required: [amount]
`

// sorHit is one request the system of record received.
type sorHit struct {
	Method, Path, Query, Key, Auth string
	Body                           string
}

// sor is the test's system of record: it answers like an order system and
// counts every request.
type sor struct {
	srv *httptest.Server

	mu          sync.Mutex // guards hits, previewDown and calls
	hits        []sorHit
	previewDown bool
	// calls, when set before the run, gets each call that is not a
	// preview (a tool call) as it arrives.
	calls chan sorHit
}

func newSOR(tb testing.TB) *sor {
	s := &sor{}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.srv.Close)
	return s
}

func (s *sor) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.hits = append(s.hits, sorHit{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Key: r.Header.Get("Idempotency-Key"), Auth: r.Header.Get("Authorization"), Body: string(body)})
	down := s.previewDown
	hit, calls := s.hits[len(s.hits)-1], s.calls
	s.mu.Unlock()
	if calls != nil && !strings.HasPrefix(r.URL.Path, "/preview/") {
		calls <- hit
	}
	w.Header().Set("Content-Type", "application/json")
	order := `{"id":"1234","customer":{"name":"Dana Whitfield","email":"dana@example.com"},"total":1289.00,"shipping":64.00}`
	switch {
	case strings.HasPrefix(r.URL.Path, "/preview/") && down:
		w.WriteHeader(http.StatusServiceUnavailable)
	case r.Method == "GET" && (r.URL.Path == "/orders/1234" || r.URL.Path == "/preview/orders/1234"):
		_, _ = io.WriteString(w, order)
	case r.Method == "GET" && r.URL.Path == "/orders/5678":
		_, _ = io.WriteString(w, `{"id":"5678","customer":{"name":"Lee Park","email":"lee@example.com"},"shipping":49}`)
	case r.Method == "GET" && r.URL.Path == "/preview/customers":
		_, _ = io.WriteString(w, `{"id":"C-100","name":"Dana Whitfield"}`)
	case r.Method == "POST" && r.URL.Path == "/refunds":
		if strings.Contains(string(body), `"amount":9999`) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"error":"amount exceeds refundable"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"RF-1","status":"refunded"}`)
	case r.Method == "POST" && r.URL.Path == "/emails":
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"EM-1","status":"sent"}`)
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/customers/"):
		_, _ = io.WriteString(w, `{"deleted":true}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"not found"}`)
	}
}

// count returns how many requests matched "METHOD /path".
func (s *sor) count(methodPath string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.hits {
		if h.Method+" "+h.Path == methodPath {
			n++
		}
	}
	return n
}

func (s *sor) requests(methodPath string) []sorHit {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sorHit
	for _, h := range s.hits {
		if h.Method+" "+h.Path == methodPath {
			out = append(out, h)
		}
	}
	return out
}

func (s *sor) setPreviewDown(down bool) {
	s.mu.Lock()
	s.previewDown = down
	s.mu.Unlock()
}

// notifier is a hand-written Notifier and card writer (approval.Cards):
// everything it is given arrives on a channel the test reads. Post binds
// the card in the store as the bot does.
type notifier struct {
	store   *store.Store
	cards   chan *approval.Request
	updates chan *approval.Request
	results chan approval.RunResult
	says    chan string
	n       atomic.Int64
	// failCard, when set, makes PostCard fail.
	failCard func(*approval.Request) error

	mu      sync.Mutex          // guards decided
	decided []*approval.Request // what Decided was told, in order

	// holdApproved, when set before the run, makes Decided about an
	// approved request return only once it is closed (a slow Slack).
	holdApproved chan struct{}
	// onDecided, when set before the run, is called first by Decided.
	onDecided func(*approval.Request)
}

func newNotifier() *notifier {
	return &notifier{
		cards:   make(chan *approval.Request, 100),
		updates: make(chan *approval.Request, 100),
		results: make(chan approval.RunResult, 100),
		says:    make(chan string, 100),
	}
}

func (n *notifier) Post(ctx context.Context, r *approval.Request, _ bool) (approval.CardRef, bool, error) {
	if n.failCard != nil {
		if err := n.failCard(r); err != nil {
			return approval.CardRef{}, false, err
		}
	}
	return approval.CardRef{Channel: "C0APPROVALS", TS: fmt.Sprintf("1700000000.%06d", n.n.Add(1))}, false, nil
}

// Posted hands the card, bound by the lifecycle, to the test.
func (n *notifier) Posted(_ context.Context, r *approval.Request) { n.cards <- r }

func (n *notifier) Delete(context.Context, *approval.Request, approval.CardRef) {}

func (n *notifier) Refresh(r *approval.Request) {
	select {
	case n.updates <- r:
	default: // a test that reads no updates does not block the run
	}
}

var _ approval.Cards = (*notifier)(nil)

func (n *notifier) PostRunResult(ctx context.Context, res approval.RunResult) error {
	n.results <- res
	return nil
}

func (n *notifier) Say(ctx context.Context, o approval.Origin, text string) error {
	n.says <- text
	return nil
}

func (n *notifier) Decided(ctx context.Context, r *approval.Request) error {
	if n.onDecided != nil {
		n.onDecided(r)
	}
	if n.holdApproved != nil && r.Status == approval.StatusApproved {
		select {
		case <-n.holdApproved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.decided = append(n.decided, r)
	return nil
}

var _ agent.Notifier = (*notifier)(nil)

// recv returns the next value of ch, failing the test after a generous
// deadline (a guard against hangs, not a synchronisation sleep).
func recv[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		tb.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// world is one test's system: Redis, the system of record, the scripted
// model behind the real go-openai client, the policy and gate, and the
// approver's view of the store.
type world struct {
	tb       testing.TB
	redisOpt redis.UniversalOptions
	rdb      redis.UniversalClient
	prefix   string
	sor      *sor
	model    *scripted.Model
	modelSrv *httptest.Server
	file     *policyfile.File
	gate     *approval.Gate
	store    *store.Store // the approvers' side (as the bot would use it)
	audit    *store.Audit
	life     *approval.Lifecycle // the approvers' lifecycle owner (as the bot's): their decisions go through it
	runs     *store.Runs
}

func newWorld(tb testing.TB, rules ...scripted.Rule) *world {
	tb.Helper()
	return newWorldPolicy(tb, testPolicy, rules...)
}

// newWorldPolicy is newWorld with another policy and tools file.
func newWorldPolicy(tb testing.TB, policy string, rules ...scripted.Rule) *world {
	tb.Helper()
	w := &world{tb: tb}
	w.rdb, w.prefix = storetest.NewWith(tb, func(o *redis.UniversalOptions) { w.redisOpt = *o })
	w.sor = newSOR(tb)
	w.model = scripted.New(rules...)
	w.modelSrv = httptest.NewServer(w.model)
	tb.Cleanup(w.modelSrv.Close)
	f, err := policyfile.Parse([]byte(policy))
	if err != nil {
		tb.Fatalf("policyfile.Parse: %v", err)
	}
	w.file = f
	if w.gate, err = approval.NewGate(f.Policy); err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	w.store = store.New(w.rdb, store.Options{Prefix: w.prefix, BlockTimeout: 100 * time.Millisecond})
	tb.Cleanup(func() { _ = w.store.Close() })
	w.audit = store.NewAudit(w.rdb, store.AuditOptions{Stream: w.prefix + ":{audit}"})
	w.runs = store.NewRuns(w.rdb, store.RunsOptions{Prefix: w.prefix})
	if w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(w.store, w.audit), Gate: w.gate, Schemas: f}); err != nil {
		tb.Fatalf("NewLifecycle: %v", err)
	}
	return w
}

func (w *world) env(name string) string {
	switch name {
	case "SOR_URL":
		return w.sor.srv.URL
	case "SOR_TOKEN":
		return "sor-secret-token"
	}
	return ""
}

// process is one Countersign process: its own Redis client, store and
// agent.
type process struct {
	agent  *agent.Agent
	notify *notifier
	rdb    redis.UniversalClient
	store  *store.Store
	sleeps *[]time.Duration
}

type processOption func(*agent.Options)

// start builds a process on w's Redis. Extra tools are library tools.
func (w *world) start(opts ...processOption) *process {
	w.tb.Helper()
	o := w.redisOpt
	rdb := redis.NewUniversalClient(&o)
	st := store.New(rdb, store.Options{Prefix: w.prefix, BlockTimeout: 100 * time.Millisecond})
	tools, err := agent.HTTPTools(w.file, w.env, w.sor.srv.Client())
	if err != nil {
		w.tb.Fatalf("HTTPTools: %v", err)
	}
	n := newNotifier()
	n.store = st
	auditor := store.NewAudit(rdb, store.AuditOptions{Stream: w.prefix + ":{audit}"})
	var (
		mu     sync.Mutex // guards sleeps
		sleeps []time.Duration
	)
	ao := agent.Options{
		Model:     agent.NewOpenAI(w.modelSrv.URL+"/v1", "test-key", w.modelSrv.Client()),
		ModelName: "scripted",
		Gate:      w.gate,
		Requests:  st,
		Runs:      store.NewRuns(rdb, store.RunsOptions{Prefix: w.prefix}),
		Notifier:  n,
		Auditor:   auditor,
		Tools:     tools,
		MaxSteps:  w.file.Agent.MaxSteps,
		Templates: w.file.Agent.Templates,
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			sleeps = append(sleeps, d)
			mu.Unlock()
			return ctx.Err()
		},
	}
	for _, opt := range opts {
		opt(&ao)
	}
	if ao.Lifecycle == nil {
		// Built after the options: the lifecycle judges proposals with
		// the process's gate, which an option may have replaced.
		gate, _ := ao.Gate.(*approval.Gate)
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true},
			Records: store.NewLedger(st, auditor), Cards: n, Gate: gate, Schemas: w.file,
		})
		if err != nil {
			w.tb.Fatalf("NewLifecycle: %v", err)
		}
		ao.Lifecycle = life
	}
	a, err := agent.New(ao)
	if err != nil {
		w.tb.Fatalf("agent.New: %v", err)
	}
	p := &process{agent: a, notify: n, rdb: rdb, store: st, sleeps: &sleeps}
	w.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Close(ctx)
		_ = st.Close()
		_ = rdb.Close()
	})
	return p
}

func withTools(tools ...agent.Tool) processOption {
	return func(o *agent.Options) { o.Tools = append(o.Tools, tools...) }
}

// task is a task in a fresh thread.
func task(text string) approval.Task {
	return approval.Task{
		EventID:   approval.NewID("ev"),
		Requester: "U_REQUESTER",
		Origin:    approval.Origin{Team: "T1", Channel: "C0SUPPORT", ThreadTS: fmt.Sprintf("%d.000100", time.Now().UnixNano())},
		Text:      text,
	}
}

func (p *process) handle(tb testing.TB, t approval.Task) {
	tb.Helper()
	if err := p.agent.Handle(context.Background(), t); err != nil {
		tb.Fatalf("Handle: %v", err)
	}
}

// decide records a decision as an approver would (through the lifecycle
// owner, as a click does).
func (w *world) decide(r *approval.Request, v approval.Verdict, text string, args json.RawMessage) *approval.Request {
	w.tb.Helper()
	return w.decideAs("U_APPROVER", r, v, text, args)
}

// decideAs is decide by a named approver.
func (w *world) decideAs(approver string, r *approval.Request, v approval.Verdict, text string, args json.RawMessage) *approval.Request {
	w.tb.Helper()
	got, err := w.life.Decide(context.Background(), r, approval.Decision{
		RequestID: r.ID, Verdict: v, Text: text, Args: args, Approver: approver, Digest: r.Digest, At: time.Now(),
	}, approval.DecideOptions{})
	if err != nil {
		w.tb.Fatalf("Decide(%s, %s) = %v", r.ID, v, err)
	}
	return got
}

// decideUnjudged records an edit that the door now refuses (refusal: it
// is judged again), as a record written before the policy or the tool's
// schema changed would hold it: the agent's own check before running is
// then the last line. It checks the door refuses it first.
func (w *world) decideUnjudged(approver string, r *approval.Request, args json.RawMessage, refusal error) *approval.Request {
	w.tb.Helper()
	ctx := context.Background()
	d := approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Args: args, Approver: approver, Digest: r.Digest, At: time.Now()}
	if _, err := w.life.Decide(ctx, r, d, approval.DecideOptions{}); !errors.Is(err, refusal) {
		w.tb.Fatalf("Decide(%s, edit %s) = %v, want %v: the door judges every edit", r.ID, args, err, refusal)
	}
	got, err := w.store.RecordDecision(ctx, d)
	if err != nil {
		w.tb.Fatalf("RecordDecision(%s, edit): %v", r.ID, err)
	}
	if got.Status.Decided() {
		if err := w.store.Wake(ctx, r.ID, got.Status); err != nil {
			w.tb.Fatalf("Wake(%s): %v", r.ID, err)
		}
	}
	return got
}

func (w *world) request(id string) *approval.Request {
	w.tb.Helper()
	r, err := w.store.Request(context.Background(), id)
	if err != nil {
		w.tb.Fatalf("Request(%s): %v", id, err)
	}
	return r
}

// events returns the audit events of the test, in order.
func (w *world) events() []approval.Entry {
	w.tb.Helper()
	es, err := w.audit.Range(context.Background(), "", 10000)
	if err != nil {
		w.tb.Fatalf("audit Range: %v", err)
	}
	return es
}

func (w *world) countEvents(ev approval.Event) int {
	n := 0
	for _, e := range w.events() {
		if e.Event == ev {
			n++
		}
	}
	return n
}

// call is a scripted tool call.
func call(id, tool, args string) scripted.Call { return scripted.Call{ID: id, Tool: tool, Args: args} }

// toolMessages returns the tool messages of the model request that
// followed the assistant message with the given call ids.
func toolMessages(req openai.ChatCompletionRequest) []openai.ChatCompletionMessage {
	var out []openai.ChatCompletionMessage
	for _, m := range req.Messages {
		if m.Role == openai.ChatMessageRoleTool {
			out = append(out, m)
		}
	}
	return out
}

// lastRequest is the model's latest request.
func (w *world) lastRequest() openai.ChatCompletionRequest {
	w.tb.Helper()
	reqs := w.model.Requests()
	if len(reqs) == 0 {
		w.tb.Fatal("the model received no request")
	}
	return reqs[len(reqs)-1]
}

func argsJSON(tb testing.TB, raw json.RawMessage) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		tb.Fatalf("unmarshal %s: %v", raw, err)
	}
	return m
}
