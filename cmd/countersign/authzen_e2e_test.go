package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/authzen"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// This file: issue 49's AuthZEN slice. A PEP speaking the Authorization
// API 1.0 and the draft Access Request and Approval Profile in JSON,
// against the real /v1 API on Redis behind the process's mux; decisions
// through the lifecycle's door as a click makes them.

const (
	azKey      = "csk_authzen_pep_key"
	azOtherKey = "csk_authzen_lookup_only"
)

const azPolicy = `version: 1
slack:
  approvals_channel: G0APPROV1
tools:
  - name: refund
    risk: high
    review: always
    timeout: 1h
    decisions: [approve, reject]
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number}
        reason: {type: string}
      required: [order_id, amount]
    deny:
      - when: 'has(args.reason) && args.reason.lowerAscii().contains("chargeback")'
        reason: refunds on a disputed charge go through finance
  - name: lookup
    risk: low
    review: never
api:
  keys:
    - name: pep
      sha256: %s
      tools: [refund, lookup]
      rate_per_minute: 100000
    - name: lookup-only
      sha256: %s
      tools: [lookup]
      rate_per_minute: 100000
`

type azWorld struct {
	store  *store.Store
	audit  *store.Audit
	life   *approval.Lifecycle
	clock  *clocktest.Clock
	posted chan string
	cards  atomic.Int64
	base   string
}

func newAZWorld(t *testing.T) *azWorld {
	t.Helper()
	ctx := context.Background()
	rdb, prefix := storetest.New(t)
	f, err := policyfile.Parse(fmt.Appendf(nil, azPolicy, api.HashKey(azKey), api.HashKey(azOtherKey)))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := approval.NewGate(f.Policy)
	if err != nil {
		t.Fatal(err)
	}
	w := &azWorld{clock: clocktest.New(clocktest.Opts{Start: time.Now()}), posted: make(chan string, 16)}
	w.store = store.New(rdb, store.Options{Prefix: prefix, Now: w.clock.Now})
	t.Cleanup(func() { _ = w.store.Close() })
	cards := approvaltest.NewCards()
	cards.OnPost = func(r *approval.Request, _ approval.CardRef) error {
		w.cards.Add(1)
		w.posted <- r.ID
		return nil
	}
	w.audit = store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: w.clock.Now})
	if w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(w.store, w.audit), Cards: cards, Gate: gate, Schemas: f, Scopes: f,
		Directory: approvaltest.Directory{Everyone: true}, Now: w.clock.Now}); err != nil {
		t.Fatal(err)
	}
	secret, err := w.store.Secret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Lifecycle: w.life, Requests: w.store, Audit: w.audit, IDSecret: secret, Keys: f.API.Keys, Now: w.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := authzen.New(authzen.Options{Secret: secret, Now: w.clock.Now, API: client.PerKey[authzen.API](srv.Handler())}) // as serve wires it
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(server.Mux(server.Routes{API: srv.Handler(), AuthZEN: svc.Handler()}))
	t.Cleanup(front.Close)
	w.base = front.URL
	return w
}

// azResp is one HTTP answer.
type azResp struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (w *azWorld) do(t *testing.T, method, path, key, body string, headers ...string) azResp {
	t.Helper()
	req, err := http.NewRequest(method, w.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := azResp{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			t.Fatalf("%s %s answered %d with a body that is not a JSON object: %s", method, path, resp.StatusCode, raw)
		}
	}
	return out
}

// evaluation is the body a PEP (Traefik Hub's authzen-mcp mapping, say)
// sends for a tools/call.
func evaluation(subject, tool, args string) string {
	return fmt.Sprintf(`{"subject":{"type":"user","id":%q},"action":{"name":"call"},"resource":{"type":"tool","id":%q,"properties":{"arguments":%s}},"context":{"reason":"customer asked"}}`,
		subject, tool, args)
}

func (w *azWorld) evaluate(t *testing.T, body string, extra ...string) azResp {
	t.Helper()
	r := w.do(t, "POST", "/access/v1/evaluation", azKey, body, extra...)
	if r.status != http.StatusOK {
		t.Fatalf("evaluation = %d %s, want 200", r.status, r.raw)
	}
	if _, ok := r.body["decision"].(bool); !ok {
		t.Fatalf("evaluation answered %s: no boolean decision", r.raw)
	}
	return r
}

func decision(r azResp) bool { return r.body["decision"].(bool) }

func ctxOf(r azResp) map[string]any {
	c, _ := r.body["context"].(map[string]any)
	return c
}

// submission is the access request a PEP builds from a requestable denial
// (the denied evaluation, its context as given).
func submission(t *testing.T, evalBody string, denial azResp) string {
	t.Helper()
	var e map[string]any
	if err := json.Unmarshal([]byte(evalBody), &e); err != nil {
		t.Fatal(err)
	}
	c := ctxOf(denial)
	e["denial"] = map[string]any{"evaluation_id": c["evaluation_id"], "evaluated_at": c["evaluated_at"],
		"decision": denial.body, "access_request": c["access_request"]}
	b, _ := json.Marshal(e)
	return string(b)
}

func task(t *testing.T, r azResp) (id, status string) {
	t.Helper()
	tk, ok := r.body["task"].(map[string]any)
	if !ok {
		t.Fatalf("answer %d %s has no task", r.status, r.raw)
	}
	id, _ = tk["id"].(string)
	status, _ = tk["status"].(string)
	return id, status
}

func (w *azWorld) decide(t *testing.T, id string, d approval.Decision) {
	t.Helper()
	ctx := context.Background()
	cur, err := w.store.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	d.RequestID, d.Approver, d.At, d.Digest = id, "U0BOB", w.clock.Now(), cur.Digest
	if _, err := w.life.Decide(ctx, cur, d, approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide(%s) = %v", d.Verdict, err)
	}
}

// events are the audit's event names, oldest first.
func (w *azWorld) events(t *testing.T) []string {
	t.Helper()
	es, err := w.audit.Range(context.Background(), "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, string(e.Event))
	}
	return out
}

func has(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// requestable evaluates body and checks it is a requestable denial.
func (w *azWorld) requestable(t *testing.T, body string) azResp {
	t.Helper()
	r := w.evaluate(t, body)
	c := ctxOf(r)
	ar, _ := c["access_request"].(map[string]any)
	if decision(r) || c["reason"] != authzen.ReasonApprovalRequired || ar["requestable"] != true || c["evaluation_id"] == "" ||
		ar["endpoint"] != w.base+"/access/v1/requests" || ar["request_context"] != c["evaluation_id"] {
		t.Fatalf("evaluation = %s, want a requestable denial (approval_required, access_request requestable at %s)", r.raw, w.base+"/access/v1/requests")
	}
	return r
}

// TestAuthZENDiscovery: the PDP metadata names the endpoints served, on
// the host the PEP reached, with the profile's capability.
func TestAuthZENDiscovery(t *testing.T) {
	t.Parallel()
	w := newAZWorld(t)
	r := w.do(t, "GET", "/.well-known/authzen-configuration", "", "", "X-Request-ID", "disc-1")
	if r.status != 200 || r.header.Get("X-Request-ID") != "disc-1" {
		t.Fatalf("discovery = %d %v %s", r.status, r.header, r.raw)
	}
	for k, want := range map[string]string{"policy_decision_point": w.base, "access_evaluation_endpoint": w.base + "/access/v1/evaluation",
		"access_evaluations_endpoint": w.base + "/access/v1/evaluations", "access_request_endpoint": w.base + "/access/v1/requests"} {
		if r.body[k] != want {
			t.Errorf("discovery %s = %v, want %s", k, r.body[k], want)
		}
	}
	if caps, _ := r.body["capabilities"].([]any); len(caps) != 1 || caps[0] != authzen.CapabilityAccessRequest {
		t.Errorf("capabilities = %v, want [%s]", r.body["capabilities"], authzen.CapabilityAccessRequest)
	}
	// Every endpoint it names answers (a GET of a POST endpoint is 405).
	for _, k := range []string{"access_evaluation_endpoint", "access_evaluations_endpoint", "access_request_endpoint"} {
		path := strings.TrimPrefix(r.body[k].(string), w.base)
		if got := w.do(t, "POST", path, azKey, `{}`); got.status == http.StatusNotFound {
			t.Errorf("POST %s = 404: discovery names an endpoint not served", path)
		}
	}
}

// TestAuthZENPolicyDecisions: decisions that need no person, answered at
// once from the policy, audited, no card.
func TestAuthZENPolicyDecisions(t *testing.T) {
	t.Parallel()
	w := newAZWorld(t)
	r := w.evaluate(t, evaluation("alice", "lookup", `{"q":"order 7"}`), "X-Request-ID", "ev-1")
	if !decision(r) || r.header.Get("X-Request-ID") != "ev-1" {
		t.Errorf("lookup (review never) = %s (X-Request-ID %q), want decision true echoing ev-1", r.raw, r.header.Get("X-Request-ID"))
	}
	r = w.evaluate(t, evaluation("alice", "refund", `{"order_id":"7","amount":5,"reason":"Chargeback filed"}`))
	if decision(r) || !strings.Contains(fmt.Sprint(ctxOf(r)["reason"]), "disputed charge go through finance") {
		t.Errorf("refund with a chargeback = %s, want a denial with the deny rule's reason", r.raw)
	}
	if _, ok := ctxOf(r)["access_request"]; ok {
		t.Errorf("a denial by policy is requestable: %s", r.raw)
	}
	// A key whose scope lacks the tool: denied, not requestable.
	r = w.do(t, "POST", "/access/v1/evaluation", azOtherKey, evaluation("alice", "refund", `{"order_id":"7","amount":5}`))
	if r.status != 200 || r.body["decision"] != false || !strings.Contains(fmt.Sprint(ctxOf(r)["reason"]), "may not ask for tool") {
		t.Errorf("refund by a lookup-only key = %d %s, want decision false naming the key's scope", r.status, r.raw)
	}
	// Something other than a tool call: denied, saying what is decided.
	r = w.evaluate(t, `{"subject":{"type":"user","id":"alice"},"action":{"name":"read"},"resource":{"type":"document","id":"q4"}}`)
	if decision(r) || !strings.Contains(fmt.Sprint(ctxOf(r)["reason"]), `resource.type "tool"`) {
		t.Errorf("a document read = %s, want a denial saying Countersign decides tool calls", r.raw)
	}
	ev := w.events(t)
	if !has(ev, string(approval.EventAutoApproved)) || !has(ev, string(approval.EventCallRefused)) {
		t.Errorf("audit %v, want auto_approved and call_refused", ev)
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards posted, want none", n)
	}
	// The batch: defaults from the top level, each item its own decision,
	// the semantic honoured.
	batch := `{"subject":{"type":"user","id":"alice"},"action":{"name":"call"},"options":{"evaluations_semantic":"%s"},"evaluations":[
		{"resource":{"type":"tool","id":"lookup","properties":{"arguments":{"q":"1"}}}},
		{"resource":{"type":"tool","id":"refund","properties":{"arguments":{"order_id":"7","amount":5}}}},
		{"resource":{"type":"tool","id":"lookup","properties":{"arguments":{"q":"2"}}}}]}`
	for sem, want := range map[string][]bool{"execute_all": {true, false, true}, "deny_on_first_deny": {true, false}, "permit_on_first_permit": {true}} {
		r := w.do(t, "POST", "/access/v1/evaluations", azKey, fmt.Sprintf(batch, sem))
		items, _ := r.body["evaluations"].([]any)
		var got []bool
		for _, it := range items {
			got = append(got, it.(map[string]any)["decision"].(bool))
		}
		if r.status != 200 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("evaluations (%s) = %d %s, want decisions %v", sem, r.status, r.raw, want)
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards posted by evaluations, want none (an evaluation asks nobody)", n)
	}
}

// TestAuthZENAccessRequestApproved: approval_required → access request
// (one card) → approve → the re-evaluation passes once; another
// re-evaluation, or one with other arguments, does not.
func TestAuthZENAccessRequestApproved(t *testing.T) {
	t.Parallel()
	w := newAZWorld(t)
	body := evaluation("alice", "refund", `{"order_id":"1234","amount":30}`)
	denial := w.requestable(t, body)
	if n := w.cards.Load(); n != 0 {
		t.Fatalf("%d cards after the evaluation, want none before the access request", n)
	}
	sub := submission(t, body, denial)
	r := w.do(t, "POST", "/access/v1/requests", azKey, sub, "Idempotency-Key", "k-1")
	id, st := task(t, r)
	if r.status != http.StatusAccepted || st != authzen.TaskPending || r.header.Get("Location") != w.base+"/access/v1/requests/"+id {
		t.Fatalf("access request = %d %s (Location %q), want 202 pending with its status endpoint", r.status, r.raw, r.header.Get("Location"))
	}
	if got := <-w.posted; got != id {
		t.Fatalf("card for %s, want the task's request %s", got, id)
	}
	// The retry with the same Idempotency-Key is the same task; the same
	// key for another call is refused.
	if r2 := w.do(t, "POST", "/access/v1/requests", azKey, sub, "Idempotency-Key", "k-1"); r2.status != http.StatusAccepted {
		t.Fatalf("retried access request = %d %s", r2.status, r2.raw)
	} else if id2, _ := task(t, r2); id2 != id {
		t.Errorf("retried access request is task %s, want %s", id2, id)
	}
	otherBody := evaluation("alice", "refund", `{"order_id":"1234","amount":31}`)
	other := submission(t, otherBody, w.requestable(t, otherBody))
	if r3 := w.do(t, "POST", "/access/v1/requests", azKey, other, "Idempotency-Key", "k-1"); r3.status != http.StatusConflict ||
		r3.body["type"] != "urn:openid:authzen:access-request:error:duplicate_request" {
		t.Errorf("Idempotency-Key reused for another call = %d %s, want 409 duplicate_request", r3.status, r3.raw)
	}
	// Pending: the evaluation is still a denial.
	if r := w.evaluate(t, body); decision(r) {
		t.Fatalf("evaluation while pending = %s, want a denial", r.raw)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	st1 := w.do(t, "GET", "/access/v1/requests/"+id, azKey, "")
	res, _ := st1.body["result"].(map[string]any)
	if _, s := task(t, st1); s != authzen.TaskApproved || res["mode"] != "reevaluate" {
		t.Fatalf("status after approval = %s, want approved with result mode reevaluate", st1.raw)
	}
	// Other arguments do not pass on this approval.
	if r := w.evaluate(t, evaluation("alice", "refund", `{"order_id":"1234","amount":3000}`)); decision(r) {
		t.Errorf("evaluation with other arguments = %s, want a denial", r.raw)
	}
	// Nor does another subject.
	if r := w.evaluate(t, evaluation("mallory", "refund", `{"order_id":"1234","amount":30}`)); decision(r) {
		t.Errorf("evaluation for another subject = %s, want a denial", r.raw)
	}
	// The re-evaluation, with the approval_context as the profile says
	// (keys in another order: the same arguments), passes once.
	again := `{"subject":{"type":"user","id":"alice"},"action":{"name":"call"},"resource":{"type":"tool","id":"refund","properties":{"arguments":{"amount":30,"order_id":"1234"}}},
		"context":{"reason":"customer asked","authzen_access_request_approval":` + mustJSON(t, res["approval_context"]) + `}}`
	if r := w.evaluate(t, again); !decision(r) {
		t.Fatalf("re-evaluation after approval = %s, want decision true", r.raw)
	}
	if r := w.evaluate(t, body); decision(r) || !strings.Contains(fmt.Sprint(ctxOf(r)["reason"]), "already ran once") {
		t.Errorf("second re-evaluation = %s, want a denial saying it already ran", r.raw)
	}
	if r := w.evaluate(t, again); decision(r) {
		t.Errorf("third re-evaluation = %s, want a denial", r.raw)
	}
	ev := w.events(t)
	for _, e := range []approval.Event{approval.EventRequested, approval.EventDecided, approval.EventExecuting, approval.EventExecuted} {
		if !has(ev, string(e)) {
			t.Errorf("audit %v lacks %s", ev, e)
		}
	}
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards, want 1 (one access request; the other was refused as a duplicate key)", n)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAuthZENAccessRequestEnds: a rejected or expired task reports its
// status, and the re-evaluation is denied saying why.
func TestAuthZENAccessRequestEnds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		end    func(w *azWorld, t *testing.T, id string)
		status string
		says   string
	}{
		{"reject", func(w *azWorld, t *testing.T, id string) {
			w.decide(t, id, approval.Decision{Verdict: approval.VerdictReject, Text: "not this order"})
		}, authzen.TaskDenied, "not this order"},
		{"expire", func(w *azWorld, t *testing.T, id string) {
			w.clock.Advance(2 * time.Hour)
			if n, err := w.life.ExpireDue(context.Background()); err != nil || n != 1 {
				t.Fatalf("ExpireDue = %d, %v, want 1", n, err)
			}
		}, authzen.TaskExpired, "deadline"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newAZWorld(t)
			body := evaluation("alice", "refund", `{"order_id":"99","amount":12}`)
			r := w.do(t, "POST", "/access/v1/requests", azKey, submission(t, body, w.requestable(t, body)))
			id, _ := task(t, r)
			<-w.posted
			tt.end(w, t, id)
			st := w.do(t, "GET", "/access/v1/requests/"+id, azKey, "")
			if _, s := task(t, st); s != tt.status || !strings.Contains(st.raw, tt.says) {
				t.Errorf("status = %s, want %s saying %q", st.raw, tt.status, tt.says)
			}
			if _, ok := st.body["result"]; ok {
				t.Errorf("a %s task carries a result: %s", tt.status, st.raw)
			}
			if r := w.evaluate(t, body); decision(r) || !strings.Contains(fmt.Sprint(ctxOf(r)["reason"]), tt.says) {
				t.Errorf("re-evaluation = %s, want a denial saying %q", r.raw, tt.says)
			}
		})
	}
}

// TestAuthZENConcurrentAccessRequests: identical access requests at once
// are one task and one card.
func TestAuthZENConcurrentAccessRequests(t *testing.T) {
	t.Parallel()
	w := newAZWorld(t)
	body := evaluation("alice", "refund", `{"order_id":"5","amount":7}`)
	sub := submission(t, body, w.requestable(t, body))
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			r := w.do(t, "POST", "/access/v1/requests", azKey, sub)
			ids[i], _ = task(t, r)
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("tasks %v, want one", ids)
		}
	}
	<-w.posted
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards, want 1", n)
	}
}

// TestAuthZENRefusals: a missing or unknown key, a malformed body, a
// denial that does not bind or has expired.
func TestAuthZENRefusals(t *testing.T) {
	t.Parallel()
	w := newAZWorld(t)
	body := evaluation("alice", "refund", `{"order_id":"1","amount":2}`)
	for _, tt := range []struct {
		name, key, path, body string
		status                int
		typ, field            string
	}{
		{"no key", "", "/access/v1/evaluation", body, 401, "urn:countersign:authzen:error:unauthenticated", ""},
		{"unknown key", "csk_nobody", "/access/v1/evaluation", body, 401, "urn:countersign:authzen:error:unauthenticated", ""},
		{"not JSON", azKey, "/access/v1/evaluation", `{"subject":`, 400, "urn:countersign:authzen:error:invalid_request", ""},
		{"subject id missing", azKey, "/access/v1/evaluation", `{"subject":{"type":"user"},"action":{"name":"call"},"resource":{"type":"tool","id":"refund"}}`,
			400, "urn:countersign:authzen:error:invalid_request", "subject.id"},
		{"arguments not an object", azKey, "/access/v1/evaluation", evaluation("alice", "refund", `[1]`), 400, "urn:countersign:authzen:error:invalid_request", "resource.properties.arguments"},
		{"subject a string", azKey, "/access/v1/evaluation", `{"subject":"alice"}`, 400, "urn:countersign:authzen:error:invalid_request", "subject"},
		{"batch item", azKey, "/access/v1/evaluations", `{"subject":{"type":"user","id":"a"},"action":{"name":"call"},"evaluations":[{"resource":{"type":"tool"}}]}`,
			400, "urn:countersign:authzen:error:invalid_request", "evaluations[0].resource.id"},
		{"no denial", azKey, "/access/v1/requests", body, 400, "urn:openid:authzen:access-request:error:invalid_denial_binding", "denial"},
		{"unknown task", azKey, "/access/v1/requests/req_nothing", "", 404, "urn:openid:authzen:access-request:error:unknown_task", ""},
	} {
		method := "POST"
		if tt.body == "" {
			method = "GET"
		}
		r := w.do(t, method, tt.path, tt.key, tt.body)
		if r.status != tt.status || r.body["type"] != tt.typ || fmt.Sprint(r.body["field"]) != tt.field && tt.field != "" ||
			r.header.Get("Content-Type") != "application/problem+json" || r.body["detail"] == "" {
			t.Errorf("%s: %s %s = %d %s, want %d %s naming %q", tt.name, method, tt.path, r.status, r.raw, tt.status, tt.typ, tt.field)
		}
	}
	// A denial bound to other arguments, or to another key, does not bind.
	denial := w.requestable(t, body)
	moved := submission(t, evaluation("alice", "refund", `{"order_id":"1","amount":2000}`), denial)
	if r := w.do(t, "POST", "/access/v1/requests", azKey, moved); r.status != 400 || r.body["type"] != "urn:openid:authzen:access-request:error:invalid_denial_binding" {
		t.Errorf("a denial submitted for other arguments = %d %s, want 400 invalid_denial_binding", r.status, r.raw)
	}
	sub := submission(t, body, denial)
	if r := w.do(t, "POST", "/access/v1/requests", azOtherKey, sub); r.status != 400 || r.body["type"] != "urn:openid:authzen:access-request:error:invalid_denial_binding" {
		t.Errorf("a denial submitted by another key = %d %s, want 400 invalid_denial_binding", r.status, r.raw)
	}
	w.clock.Advance(11 * time.Minute)
	if r := w.do(t, "POST", "/access/v1/requests", azKey, sub); r.status != http.StatusGone || r.body["type"] != "urn:openid:authzen:access-request:error:expired_denial" {
		t.Errorf("a denial submitted after it expired = %d %s, want 410 expired_denial", r.status, r.raw)
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards posted by refused requests, want none", n)
	}
}
