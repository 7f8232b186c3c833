package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/agent/extauthz/extmcp"
	"github.com/countersign/countersign/agent/extauthz/extmcp/extmcppb"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// This file: issue 49's first slice. Envoy's ext_authz (gRPC Check and
// the HTTP variant) in front of an MCP server: checks built as Envoy
// builds them, answered by the real /v1 API on Redis, decided through the
// lifecycle's door as a click is.

const extKey = "csk_extauthz_gateway_key"

// extMaxBody is the world's body limit (the gateway's max_request_bytes
// would be set at or below it).
const extMaxBody = 4096

const extPolicy = `version: 1
slack:
  approvals_channel: G0APPROV1
tools:
  - name: refund
    risk: high
    review: always
    decisions: [approve, reject, edit]
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number}
      required: [order_id, amount]
  - name: lookup
    risk: low
    review: never
api:
  keys:
    - name: gateway
      sha256: %s
      tools: [refund, lookup]
      rate_per_minute: 100000
`

// extWorld is one Countersign process on Redis with its ext_authz served
// over gRPC (conn) and HTTP (base + server.PathExtAuthz).
type extWorld struct {
	store  *store.Store
	life   *approval.Lifecycle
	posted chan string // request ids, as their cards go up
	cards  atomic.Int64
	v1     *client.Client
	base   string
	conn   authv3.AuthorizationClient
	addr   string                 // the gRPC listener's (conn's) address
	agw    extmcppb.ExtMcpClient  // agentgateway's ExtMcp, on the same listener
	waits  *countWaiter           // the store's waiter the held checks wait on
	trips  *storetest.TripCounter // the round trips to Redis
	rdb    redis.UniversalClient  // the store's Redis
	prefix string                 // and its keys' prefix
}

// countWaiter is the store's waiter, counting the checks waiting on it.
type countWaiter struct {
	extauthz.Waiter
	n atomic.Int64
}

func (c *countWaiter) Wait(ctx context.Context, id string) (*approval.Request, error) {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Waiter.Wait(ctx, id)
}

func newExtWorld(t testing.TB) *extWorld {
	t.Helper()
	return newExtWorldWith(t, fmt.Sprintf(extPolicy, api.HashKey(extKey)), extauthz.Options{})
}

// newExtWorldWith is newExtWorld on policy, its ext_authz with o (API and
// MaxBody set here).
func newExtWorldWith(t testing.TB, policy string, o extauthz.Options) *extWorld {
	t.Helper()
	ctx := context.Background()
	rdb, prefix := storetest.New(t)
	f, err := policyfile.Parse([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	gate, err := approval.NewGate(f.Policy)
	if err != nil {
		t.Fatal(err)
	}
	w := &extWorld{store: store.New(rdb, store.Options{Prefix: prefix}), posted: make(chan string, 16), trips: &storetest.TripCounter{}, rdb: rdb, prefix: prefix}
	rdb.AddHook(w.trips)
	t.Cleanup(func() { _ = w.store.Close() })
	cards := approvaltest.NewCards()
	cards.OnPost = func(r *approval.Request, _ approval.CardRef) error {
		w.cards.Add(1)
		w.posted <- r.ID
		return nil
	}
	audit := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}"})
	if w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Records: store.NewLedger(w.store, audit), Cards: cards, Gate: gate, Schemas: f, Scopes: f,
		Directory: approvaltest.Directory{Everyone: true}}); err != nil {
		t.Fatal(err)
	}
	secret, err := w.store.Secret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Lifecycle: w.life, Requests: w.store, Audit: audit, IDSecret: secret, Keys: f.API.Keys,
		Limiter: w.store.Limiter()}) // the deployment's budgets, as serve wires them
	if err != nil {
		t.Fatal(err)
	}
	o.MaxBody = extMaxBody
	w.waits = &countWaiter{Waiter: w.store} // the store, as serve wires it
	o.Waiter = w.waits
	o.API = client.PerKey[extauthz.API](srv.Handler()) // as serve wires it
	svc, err := extauthz.New(o)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(server.Mux(server.Routes{API: srv.Handler(), ExtAuthz: svc.HTTP()}))
	t.Cleanup(front.Close)
	w.base, w.v1 = front.URL, client.New(front.URL, extKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := svc.ServeGRPC(ln, extmcp.New(svc, nil).Register)
	t.Cleanup(gs.Stop)
	t.Cleanup(svc.Close) // runs first: held checks end before the server stops
	cc, err := grpc.NewClient(gs.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	w.conn, w.addr = authv3.NewAuthorizationClient(cc), gs.Addr()
	w.agw = extmcppb.NewExtMcpClient(cc)
	return w
}

// envoyCheck is the CheckRequest Envoy's ext_authz filter sends for an
// MCP POST with with_request_body: pseudo-headers and header names
// lower-cased, x-request-id, the body as a string or (pack_as_bytes) as
// raw_body, and the MCP filter's dynamic metadata.
func envoyCheck(body string, packed bool, headers map[string]string) *authv3.CheckRequest {
	xrid := fmt.Sprintf("%x", time.Now().UnixNano())
	h := map[string]string{":method": "POST", ":path": "/mcp", ":authority": "gateway.example", ":scheme": "http",
		"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18",
		"x-request-id": xrid, "x-forwarded-proto": "http", "content-length": fmt.Sprint(len(body))}
	for k, v := range headers {
		h[k] = v
	}
	hr := &authv3.AttributeContext_HttpRequest{Id: xrid, Method: "POST", Headers: h, Path: "/mcp", Host: "gateway.example", Scheme: "http",
		Protocol: "HTTP/1.1", Size: int64(len(body))}
	if packed {
		hr.RawBody = []byte(body)
	} else {
		hr.Body = body
	}
	var msg struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal([]byte(body), &msg)
	meta, _ := structpb.NewStruct(map[string]any{"method": msg.Method, "id": string(msg.ID)})
	addr := func(ip string, port uint32) *authv3.AttributeContext_Peer {
		return &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}}
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: addr("10.0.0.7", 51234), Destination: addr("10.0.0.2", 8080),
		Request:         &authv3.AttributeContext_Request{Time: timestamppb.Now(), Http: hr},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.mcp": meta}},
	}}
}

func toolCall(id int, tool, args string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, args)
}

var extHeaders = map[string]string{"authorization": "Bearer " + extKey, "mcp-session-id": "sess-1"}

// checked is a Check's answer as Envoy reads it.
type checked struct {
	allow   bool
	status  int // the denial's HTTP status
	body    string
	headers map[string]string
	err     error
}

func (w *extWorld) check(ctx context.Context, req *authv3.CheckRequest) checked {
	resp, err := w.conn.Check(ctx, req)
	if err != nil {
		return checked{err: err}
	}
	c := checked{allow: resp.GetStatus().GetCode() == int32(codes.OK), headers: map[string]string{}}
	if ok := resp.GetOkResponse(); ok != nil {
		for _, h := range ok.GetHeaders() {
			c.headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
	}
	if d := resp.GetDeniedResponse(); d != nil {
		c.status, c.body = int(d.GetStatus().GetCode()), d.GetBody()
		for _, h := range d.GetHeaders() {
			c.headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		}
	}
	if c.allow && resp.GetDeniedResponse() != nil || !c.allow && resp.GetDeniedResponse() == nil {
		c.err = fmt.Errorf("Check answered status %d with %T", resp.GetStatus().GetCode(), resp.GetHttpResponse())
	}
	return c
}

// decide records verdict v on request id by U0BOB through the lifecycle
// (the door a click uses).
func (w *extWorld) decide(t *testing.T, id string, d approval.Decision) {
	t.Helper()
	ctx := context.Background()
	cur, err := w.store.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	d.RequestID, d.Approver, d.At, d.Digest = id, "U0BOB", time.Now(), cur.Digest
	if _, err := w.life.Decide(ctx, cur, d, approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide(%s) = %v", d.Verdict, err)
	}
}

func (w *extWorld) status(t *testing.T, id string) client.Status {
	t.Helper()
	r, err := w.v1.Get(context.Background(), id, 0)
	if err != nil {
		t.Fatalf("Get(%s) = %v", id, err)
	}
	return r.Status
}

// held starts req's Check and returns the request id whose card went up,
// and the answer once it comes.
func (w *extWorld) held(t *testing.T, ctx context.Context, req *authv3.CheckRequest) (string, <-chan checked) {
	t.Helper()
	out := make(chan checked, 1)
	go func() { out <- w.check(ctx, req) }()
	select {
	case id := <-w.posted:
		return id, out
	case c := <-out:
		t.Fatalf("Check answered %+v before a card went up", c)
	case <-time.After(10 * time.Second):
		t.Fatal("no card went up")
	}
	return "", nil
}

func extAnswer(t *testing.T, ch <-chan checked) checked {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the check was not answered")
	}
	return checked{}
}

// TestExtAuthzDecided: a tools/call held while a person decides, both body
// encodings Envoy sends. (An edit is not offered on an ext_authz request:
// TestExtAuthzOffersNoEdit.)
func TestExtAuthzDecided(t *testing.T) {
	t.Parallel()
	args := `{"order_id":"1234","amount":30}`
	for _, packed := range []bool{false, true} {
		for _, tt := range []struct {
			name      string
			decision  approval.Decision
			allow     bool
			status    int
			inBody    []string
			final     client.Status
			retryDeny string // a retried identical check's denial, after the first answer
		}{
			{name: "approve", decision: approval.Decision{Verdict: approval.VerdictApprove}, allow: true, final: client.Executed, retryDeny: "already ran"},
			{name: "reject", decision: approval.Decision{Verdict: approval.VerdictReject, Text: "not this order"}, status: 403,
				inBody: []string{"rejected by", "U0BOB", "not this order", "did not run"}, final: client.Rejected, retryDeny: "rejected"},
		} {
			t.Run(fmt.Sprintf("%s/packed=%v", tt.name, packed), func(t *testing.T) {
				t.Parallel()
				w := newExtWorld(t)
				req := envoyCheck(toolCall(7, "refund", args), packed, extHeaders)
				id, ch := w.held(t, context.Background(), req)
				w.decide(t, id, tt.decision)
				got := extAnswer(t, ch)
				if got.err != nil || got.allow != tt.allow || !tt.allow && got.status != tt.status {
					t.Fatalf("Check = %+v, want allow %v status %d", got, tt.allow, tt.status)
				}
				for _, s := range tt.inBody {
					if !strings.Contains(got.body, s) {
						t.Errorf("denial body %s, want it to say %q", got.body, s)
					}
				}
				if got.headers[extauthz.HeaderRequestID] != id {
					t.Errorf("headers %v, want %s: %s", got.headers, extauthz.HeaderRequestID, id)
				}
				if !tt.allow {
					var e struct {
						JSONRPC string `json:"jsonrpc"`
						ID      int    `json:"id"`
						Error   struct {
							Code    int    `json:"code"`
							Message string `json:"message"`
						} `json:"error"`
					}
					if err := json.Unmarshal([]byte(got.body), &e); err != nil || e.JSONRPC != "2.0" || e.ID != 7 || e.Error.Message == "" {
						t.Errorf("denial body %s (%v), want a JSON-RPC error answering id 7", got.body, err)
					}
				}
				if st := w.status(t, id); st != tt.final {
					t.Errorf("request %s is %s, want %s", id, st, tt.final)
				}
				// The gateway retries the same check (its retry_policy, or
				// the client resends the same call): never a second pass.
				again := w.check(context.Background(), envoyCheck(toolCall(7, "refund", args), packed, extHeaders))
				if again.err != nil || again.allow || !strings.Contains(again.body, tt.retryDeny) {
					t.Errorf("retried Check = %+v, want denied saying %q", again, tt.retryDeny)
				}
				if n := w.cards.Load(); n != 1 {
					t.Errorf("%d cards went up, want 1", n)
				}
			})
		}
	}
}

// TestExtAuthzPasses: what is not a tools/call passes without a request,
// and an auto-approved call passes without a card.
func TestExtAuthzPasses(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	for _, tt := range []struct {
		name    string
		body    string
		headers map[string]string
	}{
		{"initialize", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`, nil},
		{"initialized notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, extHeaders},
		{"tools/list", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, extHeaders},
		{"a response to the server", `{"jsonrpc":"2.0","id":"s1","result":{}}`, extHeaders},
		{"GET of the SSE stream (no body)", ``, extHeaders},
		{"auto-approved lookup", toolCall(2, "lookup", `{"q":"1234"}`), extHeaders},
	} {
		for _, packed := range []bool{false, true} {
			got := w.check(context.Background(), envoyCheck(tt.body, packed, tt.headers))
			if got.err != nil || !got.allow {
				t.Errorf("%s (packed %v): Check = %+v, want allowed", tt.name, packed, got)
			}
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards went up, want none", n)
	}
}

// TestExtAuthzRefuses: bad input and a missing or wrong identity are
// denied with a reason, and nothing is asked of a person.
func TestExtAuthzRefuses(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	call := toolCall(3, "refund", `{"order_id":"1","amount":1}`)
	for _, tt := range []struct {
		name   string
		req    *authv3.CheckRequest
		status int
		inBody string
	}{
		{name: "no key", req: envoyCheck(call, false, map[string]string{"mcp-session-id": "s"}), status: 401, inBody: "no API key"},
		{name: "not a bearer key", req: envoyCheck(call, false, map[string]string{"authorization": "Basic " + extKey}), status: 401, inBody: "no API key"},
		{name: "wrong key", req: envoyCheck(call, false, map[string]string{"authorization": "Bearer csk_not_a_key"}), status: 401, inBody: "refused"},
		{name: "tool the key may not ask for", req: envoyCheck(toolCall(3, "drop_db", `{}`), false, extHeaders), status: 403, inBody: "drop_db"},
		{name: "body over the limit", req: envoyCheck(toolCall(4, "refund", `{"order_id":"`+strings.Repeat("x", extMaxBody)+`","amount":1}`), true, extHeaders),
			status: 413, inBody: fmt.Sprintf("over %d bytes", extMaxBody)},
		{name: "body cut by the gateway", req: envoyCheck(call[:40], false, map[string]string{"authorization": "Bearer " + extKey, "x-envoy-auth-partial-body": "true"}),
			status: 413, inBody: "only part of its body"},
		{name: "malformed JSON", req: envoyCheck(`{"jsonrpc":"2.0","method":"tools/call",`, false, extHeaders), status: 400, inBody: "not valid JSON-RPC"},
		{name: "tools/call without a name", req: envoyCheck(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{}}`, false, extHeaders), status: 400, inBody: "params.name"},
		{name: "arguments not an object", req: envoyCheck(toolCall(6, "refund", `[1,2]`), false, extHeaders), status: 400, inBody: "not a JSON object"},
		{name: "tools/call in a batch", req: envoyCheck(`[`+call+`]`, false, extHeaders), status: 400, inBody: "batch"},
		// encoding/json matches keys case-insensitively, the upstream does
		// not: the method and tool the upstream runs are the ones checked.
		{name: "method hidden behind a key in other case", req: envoyCheck(`{"jsonrpc":"2.0","id":11,"method":"tools/call","Method":"tools/list","params":{"name":"drop_db","arguments":{}}}`, false, extHeaders),
			status: 403, inBody: "drop_db"},
		{name: "tool hidden behind a key in other case", req: envoyCheck(`{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"drop_db","Name":"lookup","arguments":{}}}`, false, extHeaders),
			status: 403, inBody: "drop_db"},
		{name: "method twice", req: envoyCheck(`{"jsonrpc":"2.0","id":13,"method":"tools/call","method":"tools/list","params":{"name":"refund","arguments":{}}}`, false, extHeaders),
			status: 400, inBody: "appears twice"},
		{name: "an argument twice", req: envoyCheck(toolCall(14, "refund", `{"order_id":"1","amount":1,"amount":5000}`), false, extHeaders), status: 400, inBody: "appears twice"},
		// The same key written another way, or deep inside: still twice.
		{name: "an argument twice, escaped", req: envoyCheck(toolCall(16, "refund", `{"order_id":"1","amount":1,"amo\u0075nt":5000}`), false, extHeaders), status: 400, inBody: "appears twice"},
		{name: "a key twice deep in an array", req: envoyCheck(toolCall(17, "refund", `{"order_id":"1","amount":1,"lines":[{"sku":"a","sku":"b"}]}`), false, extHeaders), status: 400, inBody: "appears twice"},
		// Bytes that are not UTF-8 read as U+FFFD by one parser and as
		// themselves by another: refused, not guessed.
		{name: "arguments not UTF-8", req: envoyCheck(toolCall(18, "refund", "{\"order_id\":\"1\xff\",\"amount\":1}"), true, extHeaders), status: 400, inBody: "not valid"},
		// A read is gated like a call (as its server's pseudo-tool), so
		// hiding it in a batch is refused too.
		{name: "resources/read in a batch", req: envoyCheck(`[{"jsonrpc":"2.0","id":15,"method":"resources/read","params":{"uri":"orders://secret"}}]`, false, extHeaders),
			status: 400, inBody: "resources/read inside a JSON-RPC batch"},
	} {
		// A check that is held instead of refused is answered 504 when
		// the deadline is near: the test fails rather than waits.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		got := w.check(ctx, tt.req)
		cancel()
		if got.err != nil || got.allow || got.status != tt.status || !strings.Contains(got.body, tt.inBody) {
			t.Errorf("%s: Check = %+v, want denied %d saying %q", tt.name, got, tt.status, tt.inBody)
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards went up, want none", n)
	}
}

// TestExtAuthzDeadline: the gateway's timeout passes while a person has not
// decided. The check is answered denied before the gateway gives up,
// nothing is claimed, and the request stays to be decided; a retried check
// after the approval passes once.
func TestExtAuthzDeadline(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	req := envoyCheck(toolCall(8, "refund", `{"order_id":"9","amount":5}`), false, extHeaders)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	id, ch := w.held(t, ctx, req)
	got := extAnswer(t, ch)
	if got.err != nil && grpcstatus.Code(got.err) != codes.DeadlineExceeded || got.err == nil && (got.allow || got.status != 504) {
		t.Fatalf("Check past its deadline = %+v, want denied 504 or DeadlineExceeded", got)
	}
	if st := w.status(t, id); st != client.Pending {
		t.Fatalf("request %s is %s after the gateway gave up, want pending", id, st)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	if st := w.status(t, id); st != client.Approved {
		t.Fatalf("request %s is %s once approved with no check waiting, want approved (unclaimed)", id, st)
	}
	retry := w.check(context.Background(), envoyCheck(toolCall(8, "refund", `{"order_id":"9","amount":5}`), false, extHeaders))
	again := w.check(context.Background(), envoyCheck(toolCall(8, "refund", `{"order_id":"9","amount":5}`), false, extHeaders))
	if retry.err != nil || !retry.allow || again.err != nil || again.allow {
		t.Errorf("retries after the approval = %+v then %+v, want allowed once, then denied", retry, again)
	}
}

// TestExtAuthzConcurrent: two identical checks (the gateway's retry racing
// the first, or a duplicated request) share one request: one passes.
func TestExtAuthzConcurrent(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	body := toolCall(9, "refund", `{"order_id":"77","amount":3}`)
	first := make(chan checked, 1)
	second := make(chan checked, 1)
	go func() { first <- w.check(context.Background(), envoyCheck(body, false, extHeaders)) }()
	var id string
	select {
	case id = <-w.posted:
	case <-time.After(10 * time.Second):
		t.Fatal("no card went up")
	}
	go func() { second <- w.check(context.Background(), envoyCheck(body, true, extHeaders)) }()
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	a, b := extAnswer(t, first), extAnswer(t, second)
	if a.err != nil || b.err != nil || a.allow == b.allow {
		t.Fatalf("two identical checks = %+v and %+v, want exactly one allowed", a, b)
	}
	denied := a
	if a.allow {
		denied = b
	}
	if !strings.Contains(denied.body, "already ran") {
		t.Errorf("the other check's denial %s, want it to say already ran", denied.body)
	}
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards went up, want 1", n)
	}
}

// TestExtAuthzHTTP: Envoy's http_service variant on the one listener: the
// client's headers and body forwarded to /ext_authz/<path>; 200 allows,
// anything else is the denial returned to the client.
func TestExtAuthzHTTP(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	// post is the check request Envoy's http_service sends (it may run on
	// another goroutine: no Fatal in it).
	post := func(body string, headers map[string]string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, w.base+server.PathExtAuthz+"mcp", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return &http.Response{Header: http.Header{}}, ""
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return &http.Response{Header: http.Header{}}, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, extHeaders); resp.StatusCode != 200 {
		t.Errorf("tools/list: %d %s, want 200", resp.StatusCode, body)
	}
	if resp, body := post(toolCall(2, "refund", `{"order_id":"1","amount":1}`), nil); resp.StatusCode != 401 || !strings.Contains(body, "no API key") {
		t.Errorf("no key: %d %s, want 401 saying no API key", resp.StatusCode, body)
	}
	var wg sync.WaitGroup
	var resp *http.Response
	var body string
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, body = post(toolCall(3, "refund", `{"order_id":"5","amount":2}`), extHeaders)
	}()
	id := <-w.posted
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictReject, Text: "wrong customer"})
	wg.Wait()
	if resp.StatusCode != 403 || !strings.Contains(body, "wrong customer") || resp.Header.Get(extauthz.HeaderRequestID) != id {
		t.Errorf("rejected: %d %s %v, want 403 naming the reason and request %s", resp.StatusCode, body, resp.Header, id)
	}
	if !bytes.HasPrefix([]byte(body), []byte(`{"jsonrpc":"2.0"`)) {
		t.Errorf("denial body %s, want a JSON-RPC error", body)
	}
}

// envoyProxy does what Envoy's ext_authz filter does in front of an MCP
// server (with_request_body, failure_mode_allow: false): it buffers the
// body, asks Check with the request's headers (lower-cased) and body, then
// forwards the request with ok_response's headers, or returns the denial
// as it is; a failed check is a 403.
func envoyProxy(t *testing.T, w *extWorld, upstream string) string {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // SSE streams through at once, as Envoy does
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, extMaxBody+1))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		headers := map[string]string{}
		for k, v := range r.Header {
			headers[strings.ToLower(k)] = strings.Join(v, ",")
		}
		req := envoyCheck(string(body), false, headers)
		req.Attributes.Request.Http.Method, req.Attributes.Request.Http.Headers[":method"] = r.Method, r.Method
		resp, err := w.conn.Check(r.Context(), req)
		switch {
		case err != nil:
			http.Error(rw, "ext_authz failed", http.StatusForbidden)
			return
		case resp.GetStatus().GetCode() != int32(codes.OK):
			d := resp.GetDeniedResponse()
			for _, h := range d.GetHeaders() {
				rw.Header().Set(h.GetHeader().GetKey(), h.GetHeader().GetValue())
			}
			rw.WriteHeader(int(d.GetStatus().GetCode()))
			_, _ = io.WriteString(rw, d.GetBody())
			return
		}
		for _, h := range resp.GetOkResponse().GetHeaders() {
			r.Header.Set(h.GetHeader().GetKey(), h.GetHeader().GetValue())
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		rp.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestExtAuthzGatewayMCP: an MCP client (go-sdk) talks to a real upstream
// MCP server through an Envoy-like proxy whose ext_authz is Countersign.
// An approved call runs once upstream; a rejected one never reaches it and
// the client reads who rejected it and why; tools/list and the read-only
// lookup (review never) pass without a card.
func TestExtAuthzGatewayMCP(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	up := newOrdersUpstream(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	bt := newBearerTransport(extKey)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: envoyProxy(t, w, up.url), HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("MCP connect through the gateway: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	ctx := context.Background()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("tools/list through the gateway: %v", err)
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"q": "1234"}}); err != nil || res.IsError {
		t.Fatalf("lookup (review never) = %v, %v; want it run", res, err)
	}

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	call := func(args map[string]any) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: args})
			out <- answer{res, err}
		}()
		return out
	}
	approved := call(map[string]any{"order_id": "1234", "amount": 30})
	w.decide(t, <-w.posted, approval.Decision{Verdict: approval.VerdictApprove})
	if a := <-approved; a.err != nil || a.res.IsError {
		t.Fatalf("approved refund = %+v, %v; want it run", a.res, a.err)
	}
	rejected := call(map[string]any{"order_id": "999", "amount": 5000})
	w.decide(t, <-w.posted, approval.Decision{Verdict: approval.VerdictReject, Text: "amount too high"})
	a := <-rejected
	if a.err == nil || !strings.Contains(a.err.Error(), "rejected by U0BOB") || !strings.Contains(a.err.Error(), "amount too high") {
		t.Fatalf("rejected refund = %+v, %v; want an error naming who rejected and why", a.res, a.err)
	}
	if got := up.called("refund"); len(got) != 1 || !strings.Contains(string(got[0]), `"1234"`) {
		t.Errorf("upstream refund calls %s, want the approved one only, once", got)
	}
	if got := up.called("lookup"); len(got) != 1 {
		t.Errorf("upstream lookup calls %s, want 1", got)
	}
	if n := w.cards.Load(); n != 2 {
		t.Errorf("%d cards went up, want 2 (the refunds)", n)
	}
	// The session goes on after a denial: the gateway's 403 kept it.
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Errorf("tools/list after a denial: %v", err)
	}
}

// demoExtAuthz sends one Envoy check of body with key to the gRPC
// ext_authz at addr.
func demoExtAuthz(t *testing.T, addr, body, key string) checked {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	headers := map[string]string{}
	if key != "" {
		headers["authorization"] = "Bearer " + key
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return (&extWorld{conn: authv3.NewAuthorizationClient(cc)}).check(ctx, envoyCheck(body, false, headers))
}
