package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// post sends body to path with key ("" for none) and returns the status
// and the decoded error, if any.
func post(t *testing.T, h *harness, key, path, body string) (int, map[string]string) {
	t.Helper()
	return send(t, h, http.MethodPost, key, path, body)
}

// send is post with another method.
func send(t *testing.T, h *harness, method, key, path, body string) (int, map[string]string) {
	t.Helper()
	req, err := http.NewRequest(method, h.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb struct {
		Error map[string]string `json:"error"`
	}
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &eb)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return resp.StatusCode, eb.Error
}

// TestRefusals: each bad call is refused with its status and a JSON error
// naming the code and the offending field, is audited as api_refused
// (with the key's name, never the key), and creates nothing. The cases
// are a minute apart: a source's refusals are written at most once a
// minute (TestKeyRefusalFloodBounded), the first at once.
func TestRefusals(t *testing.T) {
	h := newHarness(t, harnessOptions{maxBody: 4096})
	valid := `{"tool":"refund","call_id":"c1","arguments":{"amount":10}}`
	cases := []struct {
		name, key, body string
		status          int
		code, field     string
	}{
		{"no key", "", valid, 401, "unauthenticated", ""},
		{"wrong key", "csk_not_a_key", valid, 401, "unauthenticated", ""},
		{"tool outside the key's scope", narrowKey, `{"tool":"lookup","call_id":"c1","arguments":{}}`, 403, "forbidden_tool", "tool"},
		{"unknown field", fullKey, `{"tool":"refund","call_id":"c1","arguments":{},"colour":"red"}`, 400, "unknown_field", "colour"},
		{"wrong type", fullKey, `{"tool":"refund","call_id":"c1","arguments":{},"confidence":"high"}`, 400, "invalid_field", "confidence"},
		{"confidence out of range", fullKey, `{"tool":"refund","call_id":"c1","arguments":{},"confidence":1.5}`, 400, "invalid_field", "confidence"},
		{"no call id", fullKey, `{"tool":"refund","arguments":{}}`, 400, "invalid_field", "call_id"},
		{"no tool", fullKey, `{"call_id":"c1","arguments":{}}`, 400, "invalid_field", "tool"},
		{"arguments not an object", fullKey, `{"tool":"refund","call_id":"c1","arguments":[1,2]}`, 400, "invalid_field", "arguments"},
		{"fact without label", fullKey, `{"tool":"refund","call_id":"c1","arguments":{},"facts":[{"label":"a","value":"b"},{"value":"c"}]}`, 400, "invalid_field", "facts[1].label"},
		{"not JSON", fullKey, `{"tool":`, 400, "invalid_json", ""},
		{"trailing data", fullKey, valid + `{}`, 400, "invalid_json", ""},
		{"body too large", fullKey, `{"tool":"refund","call_id":"c1","arguments":{"note":"` + strings.Repeat("x", 5000) + `"}}`, 413, "body_too_large", ""},
		{"tool the policy does not know", fullKey, `{"tool":"deploy","call_id":"c1","arguments":{}}`, 400, "unknown_tool", "tool"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.clock.Advance(time.Minute)
			before := len(h.events(approval.EventAPIRefused))
			status, e := post(t, h, c.key, "/v1/requests", c.body)
			if status != c.status || e["code"] != c.code || e["field"] != c.field || e["message"] == "" {
				t.Fatalf("POST %s = %d %v, want %d code %q field %q with a message", c.body[:min(len(c.body), 60)], status, e, c.status, c.code, c.field)
			}
			refused := h.events(approval.EventAPIRefused)
			if len(refused) != before+1 {
				t.Fatalf("api_refused entries = %d, want %d", len(refused), before+1)
			}
			last := refused[len(refused)-1]
			if strings.Contains(string(last.Data), "csk_") || !strings.Contains(string(last.Data), `"code":"`+c.code+`"`) {
				t.Errorf("audited refusal %s: want the code and no key", last.Data)
			}
		})
	}
	if n := len(h.events(approval.EventRequested)); n != 0 {
		t.Errorf("%d requests created by refused calls, want 0", n)
	}
}

// TestRateLimit: a key gets its calls per minute, then 429 with
// Retry-After; the bucket refills with (injected) time.
func TestRateLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{rate: 2})
	c := h.client(fullKey)
	call := client.Call{Tool: "lookup", CallID: "c1", Arguments: json.RawMessage(`{}`)}
	for i := range 2 {
		if _, err := c.Request(h.ctx, call); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	_, err := c.Request(h.ctx, call)
	var e *client.Error
	if !errors.As(err, &e) || e.HTTPStatus != 429 || e.Code != "rate_limited" || e.RetryAfter != 30*time.Second {
		t.Fatalf("third call: %v, want 429 rate_limited with Retry-After 30s", err)
	}
	// Another key is not limited by this one.
	if _, err := h.client(narrowKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "n1", Arguments: json.RawMessage(`{"amount":1}`)}); err != nil {
		t.Errorf("other key: %v", err)
	}
	h.clock.Advance(30 * time.Second)
	if _, err := c.Request(h.ctx, call); err != nil {
		t.Errorf("after 30s: %v, want one call allowed again", err)
	}
}

// TestCreateIdempotentAndGated: the same call id returns the same request
// (one card); the gate decides (auto-approved at once, denied by a deny
// rule); a mapped key's requests have its Slack user as requester, who
// may then not approve them (four-eyes).
func TestCreateIdempotentAndGated(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := h.client(fullKey)
	call := client.Call{Tool: "refund", CallID: "c1", RunID: "r1", Arguments: json.RawMessage(`{"amount": 64, "order":"1234"}`)}
	first, err := c.Request(h.ctx, call)
	if err != nil || first.Status != client.Pending {
		t.Fatalf("Request = %+v, %v; want pending", first, err)
	}
	for range 3 {
		again, err := c.Request(h.ctx, call)
		if err != nil || again.ID != first.ID {
			t.Fatalf("re-POST = %+v, %v; want request %s", again, err, first.ID)
		}
	}
	if n := h.cards.Posts(first.ID); n != 1 {
		t.Errorf("cards posted for %s = %d, want 1", first.ID, n)
	}
	// The same call id under another key is another request.
	other, err := h.client(narrowKey).Request(h.ctx, call)
	if err != nil || other.ID == first.ID {
		t.Errorf("narrow key's c1 = %+v, %v; want a request of its own", other, err)
	}
	// Another key cannot read it.
	if _, err := h.client(narrowKey).Get(h.ctx, first.ID, 0); err == nil {
		t.Errorf("narrow key read full key's request")
	}

	stored, err := h.store.Request(h.ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Requester != "U0ALICE01" || stored.Caller != (approval.Caller{Kind: approval.CallerAPI, Name: "full"}) || stored.Origin != (approval.Origin{}) {
		t.Errorf("stored requester %q caller %+v origin %+v; want the mapped user, key full, no thread", stored.Requester, stored.Caller, stored.Origin)
	}
	if err := approval.Authorize(stored, "U0ALICE01", nil, func() (bool, error) { return true, nil }); !errors.Is(err, approval.ErrSelfApproval) {
		t.Errorf("Authorize(mapped user) = %v, want ErrSelfApproval", err)
	}

	auto, err := c.Request(h.ctx, client.Call{Tool: "lookup", CallID: "c2", Arguments: json.RawMessage(`{"order":"1234"}`)})
	if err != nil || auto.Status != client.Approved || !auto.AutoApproved || auto.ID != "" {
		t.Errorf("Request(lookup) = %+v, %v; want approved at once without a request", auto, err)
	}
	denied, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c3", Arguments: json.RawMessage(`{"amount":2500}`)})
	if err != nil || denied.Status != client.Rejected || !strings.Contains(denied.Reason, "finance") || denied.ID != "" {
		t.Errorf("Request(refund $2500) = %+v, %v; want rejected by policy", denied, err)
	}
}

// TestRequestReadsAsTheToolsOwn: an API request carries its tool's
// confirm dialog and value formats, so its card asks "are you sure?" and
// shows "$64.00" as the agent's own calls do.
func TestRequestReadsAsTheToolsOwn(t *testing.T) {
	pol := testPolicy()
	refund := pol.Tools["refund"]
	refund.Confirm, refund.Formats = true, map[string]approval.ValueFormat{"amount": {Kind: approval.FormatCurrency, Currency: "USD"}}
	pol.Tools["refund"] = refund
	h := newHarness(t, harnessOptions{policy: &pol})
	got, err := h.client(fullKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount": 64}`)})
	if err != nil || got.Status != client.Pending {
		t.Fatalf("Request = %+v, %v; want pending", got, err)
	}
	stored, err := h.store.Request(h.ctx, got.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.Confirm || stored.Formats["amount"].Currency != "USD" {
		t.Errorf("stored confirm %v formats %+v; want the tool's confirm dialog and USD amounts", stored.Confirm, stored.Formats)
	}
}

// TestLongPoll: a long poll in progress is answered by the decision (via
// the store's wake hub); a poll with nothing decided ends at its bound
// (the server's MaxWait caps ?wait) with the request still pending; a
// cancelled ctx ends Wait.
func TestLongPoll(t *testing.T) {
	h := newHarness(t, harnessOptions{maxWait: 200 * time.Millisecond})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(h.ctx, r.ID, time.Hour)
	if err != nil || got.Status != client.Pending {
		t.Fatalf("Get(wait 1h, capped) = %+v, %v; want pending", got, err)
	}
	h.waitPolls(1) // that poll waited on the hub

	// Answered by the decision while it waits.
	c.PollWait = time.Hour // capped by the server at 200 ms: Wait polls again
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	out := make(chan *client.Request, 1)
	go func() { r, _ := c.Wait(ctx, r.ID); out <- r }() // ends with a final answer or ctx
	h.waitPolls(1)
	h.decide(r.ID, approval.VerdictReject, "U0BOB0001", "not this one")
	final := <-out
	if final == nil || final.Status != client.Rejected || final.Reason != "not this one" || final.Approver != "U0BOB0001" {
		t.Fatalf("Wait = %+v, want rejected by U0BOB0001 with the reason", final)
	}

	// ctx honoured.
	r2, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c2", Arguments: json.RawMessage(`{"amount":65}`)})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(h.ctx)
	ccancel()
	if _, err := c.Wait(cctx, r2.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait(cancelled ctx) = %v, want context.Canceled", err)
	}
}

// receiver is a webhook endpoint that fails the first fail deliveries
// with a 500 and records every delivery.
type receiver struct {
	mu   sync.Mutex // guards got and fail
	fail int
	got  []delivery
	ch   chan struct{}
}

type delivery struct {
	header http.Header
	body   []byte
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.got = append(rc.got, delivery{header: r.Header.Clone(), body: body})
	failing := rc.fail > 0
	rc.fail--
	rc.mu.Unlock()
	if failing {
		w.WriteHeader(http.StatusInternalServerError)
	}
	rc.ch <- struct{}{}
}

// TestWebhookSignedAndRetried: a final decision on an API request is
// delivered to the endpoint signed over v0:{timestamp}:{body}; a 500 is
// retried after the backoff (on the injected clock) with the same delivery
// id; both attempts are audited; the receiver's check (the client's
// VerifyWebhook) accepts them and refuses a tampered body or another
// secret.
func TestWebhookSignedAndRetried(t *testing.T) {
	rc := &receiver{fail: 1, ch: make(chan struct{}, 10)}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	secret := []byte("whsec_test")
	h := newHarness(t, harnessOptions{endpoints: []api.Endpoint{{Name: "ops-hook", URL: srv.URL, Secret: secret}}})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")
	for range 2 {
		select {
		case <-rc.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("webhook not delivered twice")
		}
	}
	h.waitAudit("the delivery audited", func() bool { return len(h.events(approval.EventWebhookSent)) == 1 })

	rc.mu.Lock()
	got := append([]delivery(nil), rc.got...)
	rc.mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("deliveries = %d, want 2 (a 500, then the retry)", len(got))
	}
	id := got[0].header.Get(client.HeaderDelivery)
	if id == "" || got[1].header.Get(client.HeaderDelivery) != id {
		t.Errorf("delivery ids %q, %q; want the same id on the retry", id, got[1].header.Get(client.HeaderDelivery))
	}
	if slept := h.clock.Slept(); len(slept) != 1 || slept[0] != api.DefaultWebhookBackoff {
		t.Errorf("backoff slept %v, want [%s]", slept, api.DefaultWebhookBackoff)
	}
	for i, d := range got {
		ev, err := client.VerifyWebhook(secret, d.header, d.body, h.clock.Now())
		if err != nil {
			t.Fatalf("delivery %d: VerifyWebhook: %v", i+1, err)
		}
		if ev.DeliveryID != id || ev.Request.ID != r.ID || ev.Request.Status != client.Approved || ev.Request.Approver != "U0BOB0001" || ev.Key != "full" {
			t.Errorf("delivery %d = %+v, want request %s approved by U0BOB0001", i+1, ev, r.ID)
		}
	}
	tampered := bytes.Replace(got[1].body, []byte(`"approved"`), []byte(`"rejected"`), 1)
	if _, err := client.VerifyWebhook(secret, got[1].header, tampered, h.clock.Now()); !errors.Is(err, client.ErrBadSignature) {
		t.Errorf("VerifyWebhook(tampered) = %v, want ErrBadSignature", err)
	}
	if _, err := client.VerifyWebhook([]byte("other"), got[1].header, got[1].body, h.clock.Now()); !errors.Is(err, client.ErrBadSignature) {
		t.Errorf("VerifyWebhook(other secret) = %v, want ErrBadSignature", err)
	}
	if _, err := client.VerifyWebhook(secret, got[1].header, got[1].body, h.clock.Now().Add(10*time.Minute)); !errors.Is(err, client.ErrBadSignature) {
		t.Errorf("VerifyWebhook(10 minutes later) = %v, want ErrBadSignature", err)
	}
	failed := h.events(approval.EventWebhookFailed)
	if len(failed) != 1 || !strings.Contains(string(failed[0].Data), `"http_status":500`) || failed[0].RequestID != r.ID {
		t.Errorf("webhook_failed entries = %v, want one for the 500", failed)
	}
}

// TestResultOnce: a result is accepted once, only from the holder of the
// token of the claim that won, only for an approved request.
func TestResultOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	var e *client.Error
	if _, err := c.Result(h.ctx, r.ID, "cst_x", client.Executed, "done"); !errors.As(err, &e) || e.Code != "not_approved" {
		t.Errorf("Result(pending) = %v, want not_approved", err)
	}
	if _, err := c.Claim(h.ctx, r.ID); !errors.As(err, &e) || e.Code != "not_approved" || e.HTTPStatus != 409 || e.Request == nil || e.Request.Status != client.Pending {
		t.Errorf("Claim(pending) = %v, want 409 not_approved with the pending request", err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")
	if _, err := c.Result(h.ctx, r.ID, "cst_x", "done", "x"); !errors.As(err, &e) || e.Field != "status" {
		t.Errorf("Result(status done) = %v, want invalid status", err)
	}
	if _, err := c.Result(h.ctx, r.ID, "", client.Executed, "x"); !errors.As(err, &e) || e.HTTPStatus != 400 || e.Field != "claim_token" {
		t.Errorf("Result(no claim token) = %v, want 400 naming claim_token", err)
	}
	if _, err := c.Result(h.ctx, r.ID, "cst_x", client.Executed, "x"); !errors.As(err, &e) || e.HTTPStatus != 409 || e.Code != "not_claimed" {
		t.Errorf("Result(unclaimed) = %v, want 409 not_claimed", err)
	}
	claim, err := c.Claim(h.ctx, r.ID)
	if err != nil || claim.Token == "" || claim.Request.Status != client.Executing || claim.Request.ID != r.ID {
		t.Fatalf("Claim = %+v, %v; want a token and the request executing", claim, err)
	}
	if _, err := c.Result(h.ctx, r.ID, claim.Token+"x", client.Executed, "x"); !errors.As(err, &e) || e.HTTPStatus != 403 || e.Code != "invalid_claim_token" {
		t.Errorf("Result(wrong token) = %v, want 403 invalid_claim_token", err)
	}
	got, err := c.Result(h.ctx, r.ID, claim.Token, client.Failed, "HTTP 502 from the payment API")
	if err != nil || got.Status != client.Failed || got.Result == nil || got.Result.Output != "HTTP 502 from the payment API" {
		t.Fatalf("Result = %+v, %v; want failed with the output", got, err)
	}
	if _, err := c.Result(h.ctx, r.ID, claim.Token, client.Executed, "again"); !errors.As(err, &e) || e.Code != "already_reported" {
		t.Errorf("second Result = %v, want already_reported", err)
	}
	if n := len(h.events(approval.EventFailed)); n != 1 {
		t.Errorf("failed entries = %d, want 1", n)
	}
}

// TestClaimOnceOverHTTP (issue 27, point 1): many API clients claim the
// same approved request at once. Exactly one gets 200 with a claim token;
// every other gets 409 already_claimed with the request as it is, never a
// token. Once the winner reported, a later claim reads the winner's
// outcome in the 409's request. One executing and one executed entry are
// audited.
func TestClaimOnceOverHTTP(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c-claim", Arguments: json.RawMessage(`{"amount":400}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")
	const claimers = 12
	claims := make([]*client.Claimed, claimers)
	errs := make([]error, claimers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Go(func() {
			<-start
			claims[i], errs[i] = h.client(fullKey).Claim(h.ctx, r.ID)
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range claimers {
		var e *client.Error
		switch {
		case errs[i] == nil && winner >= 0:
			t.Fatalf("claims %d and %d both won", winner, i)
		case errs[i] == nil:
			winner = i
		case !errors.As(errs[i], &e) || e.HTTPStatus != 409 || e.Code != "already_claimed" || e.Request == nil || e.Request.Status != client.Executing:
			t.Errorf("claim %d = %v, want 409 already_claimed with the request executing", i, errs[i])
		}
	}
	if winner < 0 {
		t.Fatal("no claim won")
	}
	if _, err := c.Result(h.ctx, r.ID, claims[winner].Token, client.Executed, "refund RF-7 created"); err != nil {
		t.Fatalf("Result: %v", err)
	}
	var e *client.Error
	if _, err := c.Claim(h.ctx, r.ID); !errors.As(err, &e) || e.Code != "already_claimed" || e.Request == nil ||
		e.Request.Result == nil || e.Request.Result.Output != "refund RF-7 created" {
		t.Errorf("Claim after the result = %v (request %+v), want already_claimed with the winner's outcome", err, e)
	}
	if n := len(h.events(approval.EventExecuting)); n != 1 {
		t.Errorf("executing entries = %d, want 1", n)
	}
	if n := len(h.events(approval.EventExecuted)); n != 1 {
		t.Errorf("executed entries = %d, want 1", n)
	}
}

// TestClaimAfterTheClaimWindow (issue 27, point 5): an API request
// approved and left unclaimed past its claim window is abandoned by the
// sweep; a claim then gets 409 abandoned, and its long poll reads
// abandoned with why.
func TestClaimAfterTheClaimWindow(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c-gone", Arguments: json.RawMessage(`{"amount":400}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")
	h.clock.Advance(approval.DefaultClaimWindow)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 1 {
		t.Fatalf("ExpireDue = %d, %v; want 1 abandoned", n, err)
	}
	var e *client.Error
	if _, err := c.Claim(h.ctx, r.ID); !errors.As(err, &e) || e.HTTPStatus != 409 || e.Code != "abandoned" || e.Request == nil || e.Request.Status != client.Abandoned {
		t.Errorf("Claim after the window = %v, want 409 abandoned with the request", err)
	}
	got, err := c.Get(h.ctx, r.ID, 0)
	if err != nil || got.Status != client.Abandoned || !strings.Contains(got.Reason, "the caller had gone") || got.Approver != "U0BOB0001" {
		t.Errorf("Get = %+v, %v; want abandoned, approved by U0BOB0001, with why", got, err)
	}
	if n := len(h.events(approval.EventAbandoned)); n != 1 {
		t.Errorf("abandoned entries = %d, want 1", n)
	}
}

// TestConcurrentSameCallID: the same call id sent many times at once (a
// client retrying on a timeout) makes one request with one card.
func TestConcurrentSameCallID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	c := h.client(fullKey)
	call := client.Call{Tool: "refund", CallID: "burst", Arguments: json.RawMessage(`{"amount":64}`)}
	const n = 20
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { // ends when the call returns
			defer wg.Done()
			r, err := c.Request(h.ctx, call)
			if err != nil {
				t.Errorf("Request: %v", err)
				ids <- ""
				return
			}
			ids <- r.ID
		}()
	}
	wg.Wait()
	close(ids)
	var first string
	for id := range ids {
		if first == "" {
			first = id
		}
		if id == "" || id != first {
			t.Fatalf("concurrent calls got requests %q and %q, want one", first, id)
		}
	}
	if got := h.cards.Posts(first); got != 1 {
		t.Errorf("cards posted = %d, want 1", got)
	}
	if got := len(h.events(approval.EventRequested)); got != 1 {
		t.Errorf("requested entries = %d, want 1", got)
	}
}

// TestWebhookOnExpiry: a deadline passing is a final decision too (fail
// closed): the endpoint is told "expired". A request of Countersign's own
// agent (no Caller) sends no webhook.
func TestWebhookOnExpiry(t *testing.T) {
	rc := &receiver{ch: make(chan struct{}, 10)}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	h := newHarness(t, harnessOptions{endpoints: []api.Endpoint{{Name: "ops-hook", URL: srv.URL, Secret: []byte("s")}}})
	own := &approval.Request{ID: approval.NewID("req"), RunID: "run_x", Requester: "U0ALICE01", Origin: approval.Origin{Channel: "C1", ThreadTS: "1.2"},
		Tool: "refund", Args: json.RawMessage(`{"amount":1}`), Decisions: []approval.Verdict{approval.VerdictApprove}, Quorum: 1,
		Created: h.clock.Now(), Deadline: h.clock.Now().Add(time.Hour), Status: approval.StatusPending}
	if _, err := h.life.Create(h.ctx, own); err != nil {
		t.Fatal(err)
	}
	r, err := h.client(fullKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(25 * time.Hour)
	if n, err := h.life.ExpireDue(h.ctx); err != nil || n != 2 {
		t.Fatalf("ExpireDue = %d, %v; want both requests expired", n, err)
	}
	h.waitAudit("the delivery audited", func() bool { return len(h.events(approval.EventWebhookSent)) == 1 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 1 {
		t.Fatalf("deliveries = %d, want 1 (the API request only)", len(rc.got))
	}
	ev, err := client.VerifyWebhook([]byte("s"), rc.got[0].header, rc.got[0].body, h.clock.Now())
	if err != nil || ev.Request.ID != r.ID || ev.Request.Status != client.Expired || ev.Request.Reason == "" {
		t.Errorf("delivery = %+v, %v; want request %s expired with a reason", ev, err, r.ID)
	}
}

// TestLongPollOutlastsWriteTimeout: serve bounds every answer with a write
// timeout shorter than a long poll may last; a long poll still gets its
// answer when its wait ends (it extends its own write deadline).
func TestLongPollOutlastsWriteTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{maxWait: 600 * time.Millisecond, writeTimeout: 100 * time.Millisecond})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "wt1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(h.ctx, r.ID, time.Hour) // waits the server's 600 ms, six write timeouts
	if err != nil || got.Status != client.Pending {
		t.Fatalf("Get(long poll past the write timeout) = %+v, %v; want pending", got, err)
	}
}

// TestEndpointsReadSecretsFromEnv: each api.webhooks entry becomes an
// endpoint whose secret is the named variable's value; an empty one is an
// error naming the policy key and the variable.
func TestEndpointsReadSecretsFromEnv(t *testing.T) {
	t.Parallel()
	hooks := []policyfile.Webhook{{Name: "ops", URL: "https://ops.example/hook", SecretEnv: "OPS_SECRET"}}
	env := map[string]string{"OPS_SECRET": "s3cret"}
	eps, err := api.Endpoints(hooks, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("Endpoints = %v", err)
	}
	if len(eps) != 1 || eps[0].Name != "ops" || eps[0].URL != "https://ops.example/hook" || string(eps[0].Secret) != "s3cret" {
		t.Errorf("Endpoints = %+v, want ops at https://ops.example/hook with secret s3cret", eps)
	}
	_, err = api.Endpoints(hooks, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "api.webhooks[0].secret_env") || !strings.Contains(err.Error(), "OPS_SECRET") {
		t.Errorf("Endpoints(no secret) = %v, want an error naming api.webhooks[0].secret_env and OPS_SECRET", err)
	}
}

// TestClientStatusesAreTheServers: the Go client (standard library only,
// so it cannot import approval) spells every status as the server writes
// it.
func TestClientStatusesAreTheServers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		client client.Status
		server approval.Status
	}{
		{client.Pending, approval.StatusPending}, {client.Approved, approval.StatusApproved},
		{client.Rejected, approval.StatusRejected}, {client.Responded, approval.StatusResponded},
		{client.Expired, approval.StatusExpired}, {client.Cancelled, approval.StatusCancelled},
		{client.Executing, approval.StatusExecuting}, {client.Executed, approval.StatusExecuted},
		{client.Failed, approval.StatusFailed}, {client.Unknown, approval.StatusUnknown},
	} {
		if string(tt.client) != string(tt.server) {
			t.Errorf("client status %q, server's %q", tt.client, tt.server)
		}
		if tt.client.Final() != tt.server.Decided() {
			t.Errorf("client %q Final() = %v, server's Decided() = %v", tt.client, tt.client.Final(), tt.server.Decided())
		}
	}
}
