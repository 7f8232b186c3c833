package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/agent/extauthz/extmcp"
	pb "github.com/countersign/countersign/agent/extauthz/extmcp/extmcppb"
	mcpgw "github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval"
)

// This file: issue 49's agentgateway slice. Its ExtMcp processor
// protocol (mcpGuardrails, kind remote) on the ext_authz gRPC listener:
// McpRequests built as agentgateway builds them (crates/agentgateway/src/
// mcp/guardrails/client.rs: the backend's unmuxed name, the method, the
// params serialized, the pseudo-headers then the request's headers, the
// metadata's CEL values), answered by the real /v1 API on Redis, decided
// through the lifecycle's door as a click is.

// agwPolicy is extPolicy with the orders upstream's reads declared (the
// pseudo-tools Countersign's MCP gateway asks them as), held for a person.
const agwPolicy = `version: 1
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
  - name: orders__resources_read
    risk: medium
    review: always
    decisions: [approve, reject, edit]
  - name: orders__prompts_get
    risk: medium
    review: always
    decisions: [approve, reject]
api:
  keys:
    - name: gateway
      sha256: %s
      tools: [refund, lookup, orders__resources_read, orders__prompts_get]
      rate_per_minute: 100000
`

// newAgwWorld is newExtWorld on agwPolicy.
func newAgwWorld(tb testing.TB) *extWorld {
	tb.Helper()
	return newExtWorldWith(tb, fmt.Sprintf(agwPolicy, api.HashKey(extKey)), extauthz.Options{})
}

// agwMeta is the processor's metadata as the gateway evaluates it (docs/
// gateways.md): countersign is default(mcpGuardrails.countersign, ""),
// so "" on the request phase and the request result's value on the
// response phase; authorization is the request's header.
func agwMeta(countersign, authorization string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		extmcp.MetadataKey:      structpb.NewStringValue(countersign),
		extmcp.AuthorizationKey: structpb.NewStringValue(authorization)}}
}

// agwRequest is the McpRequest agentgateway sends for method with params
// (nil: none) to the backend orders: the pseudo-headers first, then the
// client's headers (lower-cased, one entry per value), and meta.
func agwRequest(method, params string, headers map[string]string, meta *structpb.Struct) *pb.McpRequest {
	hs := []*pb.McpHeader{{Key: ":method", Value: []byte("POST")}, {Key: ":scheme", Value: []byte("http")},
		{Key: ":authority", Value: []byte("gateway.example:3000")}, {Key: ":path", Value: []byte("/mcp")},
		{Key: "content-type", Value: []byte("application/json")}, {Key: "accept", Value: []byte("application/json, text/event-stream")},
		{Key: "mcp-protocol-version", Value: []byte("2025-06-18")}, {Key: "user-agent", Value: []byte("agent/1")}}
	for k, v := range headers {
		hs = append(hs, &pb.McpHeader{Key: k, Value: []byte(v)})
	}
	r := &pb.McpRequest{ServiceNames: []string{"orders"}, Method: method, Headers: hs, MetadataContext: meta}
	if params != "" {
		r.McpRequest = []byte(params)
	}
	return r
}

// callParams are a tools/call's params as agentgateway serializes them
// (rmcp's CallToolRequestParams: the unmuxed name, then the arguments).
func callParams(tool, args string) string {
	return fmt.Sprintf(`{"name":%q,"arguments":%s}`, tool, args)
}

// agwChecked is a CheckRequest's answer as agentgateway reads it.
type agwChecked struct {
	pass     bool
	mutated  string
	errCode  pb.AuthorizationError_Code
	reason   string
	data     string
	claim    string // the metadata carried to CheckResponse
	setID    string // the request id header set on the upstream's request
	rpcError error
}

func (w *extWorld) agwCheck(ctx context.Context, req *pb.McpRequest) agwChecked {
	res, err := w.agw.CheckRequest(ctx, req)
	if err != nil {
		return agwChecked{rpcError: err}
	}
	c := agwChecked{claim: res.GetMetadata().GetFields()[extmcp.MetadataKey].GetStringValue()}
	for _, h := range res.GetHeaderMutation().GetSet() {
		if h.GetKey() == extauthz.HeaderRequestID {
			c.setID = string(h.GetValue())
		}
	}
	switch r := res.GetResult().(type) {
	case *pb.McpRequestResult_Pass:
		c.pass = true
	case *pb.McpRequestResult_Mutated:
		c.pass, c.mutated = true, string(r.Mutated)
	case *pb.McpRequestResult_Error:
		c.errCode, c.reason, c.data = r.Error.GetCode(), r.Error.GetReason(), string(r.Error.GetMcpError())
	default:
		c.rpcError = fmt.Errorf("CheckRequest answered no result (%T)", res.GetResult())
	}
	return c
}

// agwHeld starts req's CheckRequest and returns the request id whose card
// went up, and the answer once it comes.
func (w *extWorld) agwHeld(t *testing.T, ctx context.Context, req *pb.McpRequest) (string, <-chan agwChecked) {
	t.Helper()
	out := make(chan agwChecked, 1)
	go func() { out <- w.agwCheck(ctx, req) }()
	select {
	case id := <-w.posted:
		return id, out
	case c := <-out:
		t.Fatalf("CheckRequest answered %+v before a card went up", c)
	case <-time.After(10 * time.Second):
		t.Fatal("no card went up")
	}
	return "", nil
}

func agwAnswer(t *testing.T, ch <-chan agwChecked) agwChecked {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the check was not answered")
	}
	return agwChecked{}
}

// jsonEqual reports whether a and b are the same JSON value, or both "".
func jsonEqual(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

func (w *extWorld) request(t *testing.T, id string) *client.Request {
	t.Helper()
	r, err := w.v1.Get(context.Background(), id, 0)
	if err != nil {
		t.Fatalf("Get(%s) = %v", id, err)
	}
	return r
}

var agwHeaders = map[string]string{"authorization": "Bearer " + extKey, "mcp-session-id": "agw-sess-1"}

// TestExtMcpDecided: a tools/call held while a person decides; approve
// passes, an edit passes mutated with the approved arguments, reject is
// an error naming who and why. CheckResponse records the upstream's
// answer; the same call checked again never passes twice.
func TestExtMcpDecided(t *testing.T) {
	t.Parallel()
	args := `{"order_id":"1234","amount":30}`
	for _, tt := range []struct {
		name     string
		decision approval.Decision
		// want
		pass    bool
		mutated string
		inError []string
		result  string // the upstream's result CheckResponse sees
		final   client.Status
		output  string
		retry   string // a retried identical check's error
	}{
		{name: "approve", decision: approval.Decision{Verdict: approval.VerdictApprove}, pass: true,
			result: `{"content":[{"type":"text","text":"refunded 30 EUR"}]}`, final: client.Executed, output: "refunded 30 EUR", retry: "already ran"},
		{name: "edit", decision: approval.Decision{Verdict: approval.VerdictEdit, Args: json.RawMessage(`{"order_id":"1234","amount":10}`)}, pass: true,
			mutated: `{"_meta":{"reason":"customer asked"},"arguments":{"amount":10,"order_id":"1234"},"name":"refund"}`,
			result:  `{"content":[{"type":"text","text":"card declined"}],"isError":true}`, final: client.Failed, output: "card declined", retry: "already ran"},
		{name: "reject", decision: approval.Decision{Verdict: approval.VerdictReject, Text: "not this order"},
			inError: []string{"rejected by", "U0BOB", "not this order", "did not run"}, final: client.Rejected, retry: "rejected"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newAgwWorld(t)
			params := `{"name":"refund","arguments":` + args + `,"_meta":{"reason":"customer asked"}}`
			req := agwRequest("tools/call", params, agwHeaders, agwMeta("", "Bearer "+extKey))
			id, ch := w.agwHeld(t, context.Background(), req)
			w.decide(t, id, tt.decision)
			got := agwAnswer(t, ch)
			if got.rpcError != nil || got.pass != tt.pass {
				t.Fatalf("CheckRequest = %+v, want pass %v", got, tt.pass)
			}
			if !jsonEqual(got.mutated, tt.mutated) {
				t.Errorf("CheckRequest mutated %q, want %q", got.mutated, tt.mutated)
			}
			for _, s := range tt.inError {
				if !strings.Contains(got.reason, s) {
					t.Errorf("error reason %q, want it to say %q", got.reason, s)
				}
			}
			if !tt.pass {
				if got.errCode != pb.AuthorizationError_PERMISSION_DENIED || !strings.Contains(got.data, `"countersign_request_id":"`+id+`"`) {
					t.Errorf("error %v data %s, want PERMISSION_DENIED naming request %s", got.errCode, got.data, id)
				}
			} else {
				if got.setID != id || !strings.HasPrefix(got.claim, id+" ") {
					t.Errorf("pass sets header %q and metadata %q, want request %s and its claim", got.setID, got.claim, id)
				}
				if st := w.status(t, id); st != client.Executing {
					t.Errorf("request %s is %s once passed, want executing (its answer is recorded by CheckResponse)", id, st)
				}
				// agentgateway's response hook: the upstream's result, with
				// the metadata the request hook left.
				res, err := w.agw.CheckResponse(context.Background(), &pb.McpResponse{ServiceNames: []string{"orders"}, Method: "tools/call",
					MetadataContext: agwMeta(got.claim, "Bearer "+extKey), McpResponse: []byte(tt.result)})
				if err != nil || res.GetPass() == nil {
					t.Fatalf("CheckResponse = %v, %v; want pass", res, err)
				}
			}
			r := w.request(t, id)
			if r.Status != tt.final || tt.output != "" && (r.Result == nil || r.Result.Output != tt.output) {
				t.Errorf("request %s is %s with result %+v, want %s with output %q", id, r.Status, r.Result, tt.final, tt.output)
			}
			// The gateway retries the check (or the client resends the
			// same call): never a second pass.
			again := w.agwCheck(context.Background(), agwRequest("tools/call", params, agwHeaders, agwMeta("", "Bearer "+extKey)))
			if again.rpcError != nil || again.pass || !strings.Contains(again.reason, tt.retry) {
				t.Errorf("retried CheckRequest = %+v, want an error saying %q", again, tt.retry)
			}
			if n := w.cards.Load(); n != 1 {
				t.Errorf("%d cards went up, want 1", n)
			}
		})
	}
}

// TestExtMcpNoResponseHook: a gateway configured without the response
// hook (no countersign metadata): the approved call is recorded as handed
// on when it passes.
func TestExtMcpNoResponseHook(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	id, ch := w.agwHeld(t, context.Background(), agwRequest("tools/call", callParams("refund", `{"order_id":"5","amount":1}`), agwHeaders, nil))
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	if got := agwAnswer(t, ch); !got.pass || got.claim != "" {
		t.Fatalf("CheckRequest = %+v, want pass carrying no claim", got)
	}
	if r := w.request(t, id); r.Status != client.Executed || r.Result == nil || !strings.Contains(r.Result.Output, "not seen") {
		t.Errorf("request %s is %s with %+v, want executed, its answer not seen", id, r.Status, r.Result)
	}
}

// TestExtMcpPasses: what runs nothing passes without a request, and an
// auto-approved call passes without a card and without a claim to carry.
func TestExtMcpPasses(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	for _, tt := range []struct{ method, params string }{
		{"initialize", `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}`},
		{"tools/list", ""},
		{"resources/list", ""},
		{"completion/complete", `{"ref":{"type":"ref/prompt","name":"apology"},"argument":{"name":"x","value":"y"}}`},
		{"tools/call", callParams("lookup", `{"q":"1234"}`)},
	} {
		got := w.agwCheck(context.Background(), agwRequest(tt.method, tt.params, agwHeaders, agwMeta("", "Bearer "+extKey)))
		if got.rpcError != nil || !got.pass || got.mutated != "" || got.claim != "" {
			t.Errorf("%s: CheckRequest = %+v, want pass, unchanged, no claim", tt.method, got)
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards went up, want none", n)
	}
}

// TestExtMcpRefuses: a missing, doubled or wrong identity, bad params and
// params over the limit are errors with a reason; no person is asked.
func TestExtMcpRefuses(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	call := callParams("refund", `{"order_id":"1","amount":1}`)
	twoKeys := agwRequest("tools/call", call, agwHeaders, nil)
	twoKeys.Headers = append(twoKeys.Headers, &pb.McpHeader{Key: "authorization", Value: []byte("Bearer csk_other")})
	twoServices := agwRequest("tools/call", call, agwHeaders, nil)
	twoServices.ServiceNames = []string{"orders", "billing"}
	for _, tt := range []struct {
		name   string
		req    *pb.McpRequest
		code   pb.AuthorizationError_Code
		reason string
	}{
		{"no authorization header", agwRequest("tools/call", call, map[string]string{"mcp-session-id": "s"}, nil), pb.AuthorizationError_PERMISSION_DENIED, "no API key"},
		{"not a bearer key", agwRequest("tools/call", call, map[string]string{"authorization": "Basic " + extKey}, nil), pb.AuthorizationError_PERMISSION_DENIED, "no API key"},
		{"authorization twice", twoKeys, pb.AuthorizationError_PERMISSION_DENIED, "authorization header is sent 2 times"},
		{"wrong key", agwRequest("tools/call", call, map[string]string{"authorization": "Bearer csk_not_a_key"}, nil), pb.AuthorizationError_PERMISSION_DENIED, "refused"},
		{"tool the key may not ask for", agwRequest("tools/call", callParams("drop_db", `{}`), agwHeaders, nil), pb.AuthorizationError_PERMISSION_DENIED, "drop_db"},
		{"params over the limit", agwRequest("tools/call", callParams("refund", `{"order_id":"`+strings.Repeat("x", extMaxBody)+`","amount":1}`), agwHeaders, nil),
			pb.AuthorizationError_INVALID, fmt.Sprintf("over %d bytes", extMaxBody)},
		{"no params", agwRequest("tools/call", "", agwHeaders, nil), pb.AuthorizationError_INVALID, "no params"},
		{"no name", agwRequest("tools/call", `{"arguments":{}}`, agwHeaders, nil), pb.AuthorizationError_INVALID, "params.name"},
		{"arguments not an object", agwRequest("tools/call", callParams("refund", `[1]`), agwHeaders, nil), pb.AuthorizationError_INVALID, "not a JSON object"},
		{"an argument twice", agwRequest("tools/call", callParams("refund", `{"order_id":"1","amount":1,"amount":5000}`), agwHeaders, nil), pb.AuthorizationError_INVALID, "appears twice"},
		{"two services", twoServices, pb.AuthorizationError_INVALID, "2 MCP services"},
		{"resources/read without a uri", agwRequest("resources/read", `{}`, agwHeaders, nil), pb.AuthorizationError_INVALID, "params.uri"},
	} {
		// A check held instead of refused ends at the deadline: the test
		// fails rather than waits.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		got := w.agwCheck(ctx, tt.req)
		cancel()
		if got.rpcError != nil || got.pass || got.errCode != tt.code || !strings.Contains(got.reason, tt.reason) {
			t.Errorf("%s: CheckRequest = %+v, want error %v saying %q", tt.name, got, tt.code, tt.reason)
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards went up, want none", n)
	}
}

// TestExtMcpDeadline: agentgateway's timeout passes while a person has not
// decided: the answer comes before it (an error, nothing claimed), the
// request stays pending; once approved, the same call checked again
// passes once.
func TestExtMcpDeadline(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	params := callParams("refund", `{"order_id":"9","amount":5}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	id, ch := w.agwHeld(t, ctx, agwRequest("tools/call", params, agwHeaders, nil))
	got := agwAnswer(t, ch)
	if got.rpcError != nil && grpcstatus.Code(got.rpcError) != codes.DeadlineExceeded || got.rpcError == nil && (got.pass || !strings.Contains(got.reason, "stopped waiting")) {
		t.Fatalf("CheckRequest past its deadline = %+v, want an error saying it stopped waiting, or DeadlineExceeded", got)
	}
	if st := w.status(t, id); st != client.Pending {
		t.Fatalf("request %s is %s after the gateway gave up, want pending", id, st)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	retry := w.agwCheck(context.Background(), agwRequest("tools/call", params, agwHeaders, nil))
	again := w.agwCheck(context.Background(), agwRequest("tools/call", params, agwHeaders, nil))
	if retry.rpcError != nil || !retry.pass || again.rpcError != nil || again.pass {
		t.Errorf("checks after the approval = %+v then %+v, want a pass once, then an error", retry, again)
	}
}

// TestExtMcpConcurrent: two identical CheckRequests in flight (the
// gateway's retry racing the first) share one request: one passes.
func TestExtMcpConcurrent(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	params := callParams("refund", `{"order_id":"77","amount":3}`)
	first, second := make(chan agwChecked, 1), make(chan agwChecked, 1)
	go func() { first <- w.agwCheck(context.Background(), agwRequest("tools/call", params, agwHeaders, nil)) }()
	var id string
	select {
	case id = <-w.posted:
	case <-time.After(10 * time.Second):
		t.Fatal("no card went up")
	}
	// The same params, spaced otherwise: the same call.
	go func() {
		second <- w.agwCheck(context.Background(), agwRequest("tools/call", `{ "name": "refund", "arguments": {"order_id": "77", "amount": 3} }`, agwHeaders, nil))
	}()
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	a, b := agwAnswer(t, first), agwAnswer(t, second)
	if a.rpcError != nil || b.rpcError != nil || a.pass == b.pass {
		t.Fatalf("two identical checks = %+v and %+v, want exactly one pass", a, b)
	}
	denied := a
	if a.pass {
		denied = b
	}
	if !strings.Contains(denied.reason, "already ran") {
		t.Errorf("the other check's error %q, want it to say already ran", denied.reason)
	}
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards went up, want 1", n)
	}
}

// TestExtMcpReads: resources/read and prompts/get are gated as the MCP
// gateway's pseudo-tools; an edited uri is sent mutated.
func TestExtMcpReads(t *testing.T) {
	t.Parallel()
	if got, want := "orders__resources_read", "orders"+mcpgw.Separator+mcpgw.ResourcesRead; got != want {
		t.Fatalf("the policy's resources_read pseudo-tool %q is not the MCP gateway's %q", got, want)
	}
	if got, want := "orders__prompts_get", "orders"+mcpgw.Separator+mcpgw.PromptsGet; got != want {
		t.Fatalf("the policy's prompts_get pseudo-tool %q is not the MCP gateway's %q", got, want)
	}
	w := newAgwWorld(t)
	id, ch := w.agwHeld(t, context.Background(), agwRequest("resources/read", `{"uri":"orders://secret"}`, agwHeaders, agwMeta("", "Bearer "+extKey)))
	if r := w.request(t, id); r.Tool != "orders__resources_read" || string(r.Arguments) != `{"uri":"orders://secret"}` {
		t.Errorf("resources/read asked as %s %s, want orders__resources_read {\"uri\":\"orders://secret\"}", r.Tool, r.Arguments)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictEdit, Args: json.RawMessage(`{"uri":"orders://policy"}`)})
	if got := agwAnswer(t, ch); !got.pass || !jsonEqual(got.mutated, `{"uri":"orders://policy"}`) {
		t.Errorf("edited resources/read = %+v, want mutated to orders://policy", got)
	}
	id, ch = w.agwHeld(t, context.Background(), agwRequest("prompts/get", `{"name":"apology","arguments":{"tone":"warm"}}`, agwHeaders, nil))
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictReject, Text: "no prompts today"})
	if got := agwAnswer(t, ch); got.pass || !strings.Contains(got.reason, "no prompts today") {
		t.Errorf("rejected prompts/get = %+v, want an error saying why", got)
	}
	// The upstream reads its params by exact key: a key in another case
	// is not the one it reads, so it is not the one asked about either.
	for _, tt := range []struct{ method, params, tool, want string }{
		{"resources/read", `{"uri":"orders://secret","URI":"orders://policy"}`, "orders__resources_read", `{"uri":"orders://secret"}`},
		{"resources/read", `{"URI":"orders://policy","uri":"orders://other"}`, "orders__resources_read", `{"uri":"orders://other"}`},
		{"prompts/get", `{"name":"refund_all","Name":"apology","arguments":{"tone":"warm"},"Arguments":{"tone":"cold"}}`, "orders__prompts_get", `{"arguments":{"tone":"warm"},"name":"refund_all"}`},
	} {
		id, ch := w.agwHeld(t, context.Background(), agwRequest(tt.method, tt.params, agwHeaders, nil))
		if r := w.request(t, id); r.Tool != tt.tool || !jsonEqual(string(r.Arguments), tt.want) {
			t.Errorf("%s %s asked as %s %s, want %s %s", tt.method, tt.params, r.Tool, r.Arguments, tt.tool, tt.want)
		}
		w.decide(t, id, approval.Decision{Verdict: approval.VerdictReject, Text: "checked"})
		agwAnswer(t, ch)
	}
}

// agwProxy does what agentgateway does in front of an MCP server with a
// remote mcpGuardrails processor (methods {"tools/call": full,
// "resources/read": full, "prompts/get": full}, failureMode failClosed):
// for a gated method it asks CheckRequest with the params and headers,
// answers a JSON-RPC error with the reason (a failed check is an error
// too), forwards the mutated params, and shows the upstream's result to
// CheckResponse with the metadata the request hook left.
func agwProxy(t *testing.T, w *extWorld, upstream string) string {
	t.Helper()
	gated := map[string]bool{"tools/call": true, "resources/read": true, "prompts/get": true}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg map[string]json.RawMessage
		_ = json.Unmarshal(body, &msg)
		var method string
		_ = json.Unmarshal(msg["method"], &method)
		auth := r.Header.Get("Authorization")
		var claim string
		if r.Method == http.MethodPost && gated[method] {
			headers := map[string]string{}
			for k, v := range r.Header {
				headers[strings.ToLower(k)] = v[0]
			}
			res, err := w.agw.CheckRequest(r.Context(), agwRequest(method, string(msg["params"]), headers, agwMeta("", auth)))
			switch {
			case err != nil:
				agwError(rw, msg["id"], -32603, "mcpGuardrails checkRequest failed: "+err.Error(), nil)
				return
			case res.GetError() != nil:
				code := map[pb.AuthorizationError_Code]int{pb.AuthorizationError_PERMISSION_DENIED: -32001, pb.AuthorizationError_RESOURCE_EXHAUSTED: -32003, pb.AuthorizationError_INVALID: -32600}[res.GetError().GetCode()]
				agwError(rw, msg["id"], code, res.GetError().GetReason(), res.GetError().GetMcpError())
				return
			case res.GetMutated() != nil:
				msg["params"] = res.GetMutated()
				body, _ = json.Marshal(msg)
			}
			claim = res.GetMetadata().GetFields()[extmcp.MetadataKey].GetStringValue()
		}
		out, err := http.NewRequestWithContext(r.Context(), r.Method, upstream, bytes.NewReader(body))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			rw.Header()[k] = v
		}
		if !gated[method] || r.Method != http.MethodPost {
			rw.WriteHeader(resp.StatusCode)
			if f, ok := rw.(http.Flusher); ok {
				f.Flush()
			}
			_, _ = io.Copy(flushWriter{rw}, resp.Body)
			return
		}
		// The response hook: the result of the call's answer, from a
		// JSON body or the SSE event that carries it.
		answer, _ := io.ReadAll(resp.Body)
		for _, line := range bufioLines(answer) {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok && strings.HasPrefix(line, "{") {
				data, ok = line, true
			}
			var m map[string]json.RawMessage
			if !ok || json.Unmarshal([]byte(data), &m) != nil || m["result"] == nil {
				continue
			}
			res, err := w.agw.CheckResponse(r.Context(), &pb.McpResponse{ServiceNames: []string{"orders"}, Method: method,
				MetadataContext: agwMeta(claim, auth), McpResponse: m["result"]})
			if err != nil || res.GetPass() == nil {
				agwError(rw, msg["id"], -32603, fmt.Sprintf("mcpGuardrails checkResponse: %v %v", res, err), nil)
				return
			}
		}
		rw.WriteHeader(resp.StatusCode)
		_, _ = rw.Write(answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// flushWriter flushes each write (the SSE stream of a GET goes through
// at once, as agentgateway streams it).
type flushWriter struct{ rw http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.rw.Write(p)
	if fl, ok := f.rw.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

func bufioLines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// agwError answers id with the JSON-RPC error agentgateway builds from a
// rejection (translate_error: the code, the reason, mcp_error as data).
func agwError(rw http.ResponseWriter, id json.RawMessage, code int, message string, data []byte) {
	e := map[string]any{"code": code, "message": message}
	if len(data) > 0 {
		e["data"] = json.RawMessage(data)
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": e})
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(b)
}

// TestExtMcpGatewayMCP: an MCP client (go-sdk) talks to a real upstream
// MCP server through an agentgateway-like proxy whose processor is
// Countersign. An approved call runs once upstream and its answer is
// recorded; an edited one runs with the approver's arguments; a rejected
// one never reaches it and the client reads who rejected it and why; the
// lookup (review never) and tools/list pass without a card.
func TestExtMcpGatewayMCP(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	up := newOrdersUpstream(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: agwProxy(t, w, up.url), HTTPClient: &http.Client{Transport: newBearerTransport(extKey)}, MaxRetries: -1}, nil)
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
	first := <-w.posted
	w.decide(t, first, approval.Decision{Verdict: approval.VerdictApprove})
	if a := <-approved; a.err != nil || a.res.IsError {
		t.Fatalf("approved refund = %+v, %v; want it run", a.res, a.err)
	}
	edited := call(map[string]any{"order_id": "555", "amount": 900})
	second := <-w.posted
	w.decide(t, second, approval.Decision{Verdict: approval.VerdictEdit, Args: json.RawMessage(`{"order_id":"555","amount":90}`)})
	if a := <-edited; a.err != nil || a.res.IsError {
		t.Fatalf("edited refund = %+v, %v; want it run", a.res, a.err)
	}
	rejected := call(map[string]any{"order_id": "999", "amount": 5000})
	w.decide(t, <-w.posted, approval.Decision{Verdict: approval.VerdictReject, Text: "amount too high"})
	a := <-rejected
	if a.err == nil || !strings.Contains(a.err.Error(), "rejected by U0BOB") || !strings.Contains(a.err.Error(), "amount too high") {
		t.Fatalf("rejected refund = %+v, %v; want an error naming who rejected and why", a.res, a.err)
	}
	got := up.called("refund")
	if len(got) != 2 || !jsonEqual(string(got[0]), `{"order_id":"1234","amount":30}`) || !jsonEqual(string(got[1]), `{"order_id":"555","amount":90}`) {
		t.Errorf("upstream refund calls %s, want the approved one and the edited one (amount 90), once each", got)
	}
	for _, id := range []string{first, second} {
		if r := w.request(t, id); r.Status != client.Executed || r.Result == nil || !strings.Contains(r.Result.Output, "refund done") {
			t.Errorf("request %s is %s with %+v, want executed with the upstream's answer", id, r.Status, r.Result)
		}
	}
	if n := w.cards.Load(); n != 3 {
		t.Errorf("%d cards went up, want 3 (the refunds)", n)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Errorf("tools/list after an error: %v", err)
	}
}

// demoExtMcp sends one agentgateway CheckRequest to the gRPC listener at
// addr.
func demoExtMcp(t *testing.T, addr string, req *pb.McpRequest) agwChecked {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return (&extWorld{agw: pb.NewExtMcpClient(cc)}).agwCheck(ctx, req)
}

// TestExtMcpDistinctCalls: calls that differ only in a number's last
// digit (past float64's precision), or in their session, are two calls:
// two requests, two cards.
func TestExtMcpDistinctCalls(t *testing.T) {
	t.Parallel()
	w := newAgwWorld(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := map[string]string{"authorization": "Bearer " + extKey, "mcp-session-id": "agw-sess-2"}
	var ids []string
	for _, tt := range []struct {
		params  string
		headers map[string]string
	}{
		{callParams("refund", `{"order_id":"1","amount":9007199254740993}`), agwHeaders},
		{callParams("refund", `{"order_id":"1","amount":9007199254740992}`), agwHeaders},
		{callParams("refund", `{"order_id":"1","amount":9007199254740992}`), other},
	} {
		id, _ := w.agwHeld(t, ctx, agwRequest("tools/call", tt.params, tt.headers, nil))
		ids = append(ids, id)
	}
	if ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
		t.Errorf("three distinct calls asked as requests %v, want three", ids)
	}
}
