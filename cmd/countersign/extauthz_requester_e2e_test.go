package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/cmd/countersign/server"
)

// This file: issue 49, what the ext_authz server gates besides tools/call
// (resources/read, prompts/get, named as the MCP gateway names them), who
// asked (the caller the gateway vouches for, mapped by the policy) and
// the decisions its card offers (no edit).

// meshKey is the key of a gateway that acts for the callers the policy
// names (api.keys[].callers).
const meshKey = "csk_extauthz_mesh_key"

// extCallersPolicy: the MCP server "docs" behind the gateway, whose reads
// a person approves and whose prompts pass; the key "mesh" acts for alice
// and carol, the key "gateway" for nobody.
const extCallersPolicy = `version: 1
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
  - name: docs__resources_read
    risk: medium
    review: always
    decisions: [approve, reject, edit]
  - name: docs__prompts_get
    risk: low
    review: never
  - name: docs__search
    risk: low
    review: never
api:
  keys:
    - name: gateway
      sha256: %s
      tools: ["*"]
      rate_per_minute: 100000
    - name: mesh
      sha256: %s
      tools: ["*"]
      rate_per_minute: 100000
      callers:
        - identity: alice@example.com
          slack_user: U0ALICE01
        - identity: carol
          slack_user: U0CAROL01
`

func newExtCallersWorld(t *testing.T) *extWorld {
	t.Helper()
	return newExtWorldWith(t, fmt.Sprintf(extCallersPolicy, api.HashKey(extKey), api.HashKey(meshKey)), extauthz.Options{PrefixTools: true})
}

// onRoute is req as Envoy sends it from a route whose ext_authz per-route
// settings name it and its MCP server (check_settings.context_extensions).
func onRoute(req *authv3.CheckRequest, route, server string) *authv3.CheckRequest {
	req.Attributes.ContextExtensions = map[string]string{"route": route, "mcp_server": server}
	return req
}

// withJWT adds to req what Envoy's jwt_authn filter leaves for ext_authz
// when it verified a token (payload_in_metadata), one payload per
// provider name.
func withJWT(t *testing.T, req *authv3.CheckRequest, payloads map[string]map[string]any) *authv3.CheckRequest {
	t.Helper()
	m := map[string]any{}
	for name, p := range payloads {
		m[name] = p
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	req.Attributes.MetadataContext.FilterMetadata[extauthz.JWTFilter] = st
	return req
}

func meshHeaders(extra map[string]string) map[string]string {
	h := map[string]string{"authorization": "Bearer " + meshKey, "mcp-session-id": "sess-9"}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// alicePayload is a verified token's payload as jwt_authn stores it.
var alicePayload = map[string]any{"iss": "https://idp.example", "sub": "00u1alice", "email": "alice@example.com", "aud": "mcp", "exp": 1.9e9}

// TestExtAuthzReadsAndPrompts: resources/read and prompts/get are asked
// for as the MCP gateway asks for them (<server>__resources_read with
// {"uri"}, <server>__prompts_get with {"name","arguments"}), so the same
// policy rules hold: the read waits for a person and passes once approved;
// the prompt (review never) passes at once without a card. A tools/call
// on a route naming its server is named <server>__<tool> when the policy
// prefixes tools. A read on a route that names no server is denied: its
// name in the policy is unknown.
func TestExtAuthzReadsAndPrompts(t *testing.T) {
	t.Parallel()
	w := newExtCallersWorld(t)
	ctx := context.Background()
	carol := meshHeaders(map[string]string{extauthz.HeaderCaller: "carol"})

	read := `{"jsonrpc":"2.0","id":11,"method":"resources/read","params":{"uri":"file:///handbook/refunds.md"}}`
	id, ch := w.held(t, ctx, onRoute(envoyCheck(read, true, carol), "mcp-docs", "docs"))
	r, err := w.store.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tool != "docs__resources_read" || string(r.Args) != `{"uri":"file:///handbook/refunds.md"}` || r.Caller.Upstream != "docs" {
		t.Errorf("the read's request: tool %q args %s upstream %q; want docs__resources_read {\"uri\":…} from docs", r.Tool, r.Args, r.Caller.Upstream)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	if got := extAnswer(t, ch); got.err != nil || !got.allow || got.headers[extauthz.HeaderRequestID] != id {
		t.Errorf("approved read: Check = %+v, want allowed with %s", got, id)
	}

	prompt := `{"jsonrpc":"2.0","id":12,"method":"prompts/get","params":{"name":"summarise","arguments":{"topic":"refunds"}}}`
	if got := w.check(ctx, onRoute(envoyCheck(prompt, false, carol), "mcp-docs", "docs")); got.err != nil || !got.allow {
		t.Errorf("prompt (review never): Check = %+v, want allowed", got)
	}
	search := toolCall(13, "search", `{"q":"refund policy"}`)
	if got := w.check(ctx, onRoute(envoyCheck(search, false, carol), "mcp-docs", "docs")); got.err != nil || !got.allow {
		t.Errorf("docs__search (review never): Check = %+v, want allowed", got)
	}
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards went up, want 1 (the read)", n)
	}

	for _, tt := range []struct {
		name, body, want string
		status           int
	}{
		{"read without a server", read, "does not name its MCP server", 403},
		{"prompt without a server", prompt, "does not name its MCP server", 403},
		{"read without a uri", `{"jsonrpc":"2.0","id":14,"method":"resources/read","params":{}}`, "needs params.uri", 400},
		{"prompt arguments not strings", `{"jsonrpc":"2.0","id":15,"method":"prompts/get","params":{"name":"p","arguments":{"n":1}}}`, "not an object of strings", 400},
	} {
		req := envoyCheck(tt.body, false, carol)
		if strings.Contains(tt.name, "uri") || strings.Contains(tt.name, "strings") {
			req = onRoute(req, "mcp-docs", "docs")
		}
		if got := w.check(ctx, req); got.err != nil || got.allow || got.status != tt.status || !strings.Contains(got.body, tt.want) {
			t.Errorf("%s: Check = %+v, want denied %d saying %q", tt.name, got, tt.status, tt.want)
		}
	}
	if n := w.cards.Load(); n != 1 {
		t.Errorf("%d cards went up, want still 1", n)
	}
}

// TestExtAuthzRequester: the caller the gateway vouches for — a JWT's
// email (or sub) from jwt_authn's metadata, or the caller header — is
// mapped by the key's callers in the policy to the person who asked: the
// request's requester, named on the card, who may not approve it. Every
// identity that is bad, or missing where the key acts for callers, is
// denied before any card goes up.
func TestExtAuthzRequester(t *testing.T) {
	t.Parallel()
	args := `{"order_id":"1234","amount":30}`
	for _, tt := range []struct {
		name string
		req  func(t *testing.T, id int) *authv3.CheckRequest
	}{
		{"JWT email", func(t *testing.T, id int) *authv3.CheckRequest {
			return withJWT(t, onRoute(envoyCheck(toolCall(id, "refund", args), true, meshHeaders(nil)), "mcp-orders", "orders"),
				map[string]map[string]any{"jwt_payload": alicePayload})
		}},
		{"JWT and the caller header agreeing", func(t *testing.T, id int) *authv3.CheckRequest {
			return withJWT(t, onRoute(envoyCheck(toolCall(id, "refund", args), false, meshHeaders(map[string]string{extauthz.HeaderCaller: "alice@example.com"})), "mcp-orders", "orders"),
				map[string]map[string]any{"jwt_payload": alicePayload})
		}},
		{"caller header", func(t *testing.T, id int) *authv3.CheckRequest {
			return onRoute(envoyCheck(toolCall(id, "refund", args), false, meshHeaders(map[string]string{extauthz.HeaderCaller: "alice@example.com"})), "mcp-orders", "orders")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newExtWorldWith(t, fmt.Sprintf(extCallersPolicy, api.HashKey(extKey), api.HashKey(meshKey)), extauthz.Options{})
			ctx := context.Background()
			id, ch := w.held(t, ctx, tt.req(t, 21))
			r, err := w.store.Request(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if r.Requester != "U0ALICE01" || r.Caller != (approval.Caller{Kind: approval.CallerAPI, Name: "mesh", Upstream: "orders", Gateway: approval.GatewayExtAuthz, Route: "mcp-orders"}) {
				t.Errorf("request: requester %q caller %+v; want U0ALICE01 through ext_authz on mcp-orders to orders by key mesh", r.Requester, r.Caller)
			}
			// Four-eyes: alice asked, so alice may not approve it.
			_, err = w.life.Decide(ctx, r, approval.Decision{RequestID: id, Verdict: approval.VerdictApprove, Approver: "U0ALICE01", At: time.Now(), Digest: r.Digest}, approval.DecideOptions{})
			if !errors.Is(err, approval.ErrSelfApproval) {
				t.Errorf("alice approving her own call: Decide = %v, want %v", err, approval.ErrSelfApproval)
			}
			w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
			if got := extAnswer(t, ch); got.err != nil || !got.allow {
				t.Errorf("approved by bob: Check = %+v, want allowed", got)
			}
			// The same call by another caller is another request.
			again := withJWT(t, onRoute(envoyCheck(toolCall(21, "refund", args), false, meshHeaders(nil)), "mcp-orders", "orders"),
				map[string]map[string]any{"jwt_payload": {"sub": "carol"}})
			other, och := w.held(t, ctx, again)
			if other == id {
				t.Errorf("carol's identical call found alice's request %s", id)
			}
			if r, err := w.store.Request(ctx, other); err != nil || r.Requester != "U0CAROL01" {
				t.Errorf("carol's request: %+v, %v; want requester U0CAROL01", r, err)
			}
			w.decide(t, other, approval.Decision{Verdict: approval.VerdictReject, Text: "not today"})
			if got := extAnswer(t, och); got.allow || got.status != 403 {
				t.Errorf("rejected: Check = %+v, want denied 403", got)
			}
		})
	}
}

// TestExtAuthzBadCaller: checks as Envoy sends them whose caller is bad
// or missing (for a key that acts for callers), or named to a key that
// acts for nobody, are denied saying why, and nobody is asked.
func TestExtAuthzBadCaller(t *testing.T) {
	t.Parallel()
	w := newExtCallersWorld(t)
	ctx := context.Background()
	call := func(headers map[string]string) *authv3.CheckRequest {
		return onRoute(envoyCheck(toolCall(31, "refund", `{"order_id":"1","amount":1}`), true, headers), "mcp-orders", "orders")
	}
	for _, tt := range []struct {
		name   string
		req    *authv3.CheckRequest
		status int
		want   string
	}{
		{"no identity, key acts for callers", call(meshHeaders(nil)), 403, "names no caller"},
		{"a caller the key does not name", call(meshHeaders(map[string]string{extauthz.HeaderCaller: "mallory@example.com"})), 403, "is not one of key mesh's callers"},
		{"a caller for a key that acts for nobody", call(map[string]string{"authorization": "Bearer " + extKey, extauthz.HeaderCaller: "alice@example.com"}), 403, "names no callers in the policy"},
		{"the token's email is not a string", withJWT(t, call(meshHeaders(nil)), map[string]map[string]any{"jwt_payload": {"email": 42, "sub": "x"}}), 401, "email claim"},
		{"a token without email or sub", withJWT(t, call(meshHeaders(nil)), map[string]map[string]any{"jwt_payload": {"iss": "https://idp.example"}}), 401, "no email or sub claim"},
		{"two tokens, two callers", withJWT(t, call(meshHeaders(nil)), map[string]map[string]any{"idp_a": alicePayload, "idp_b": {"sub": "carol"}}), 401, "two tokens name two callers"},
		{"the header disagrees with the token", withJWT(t, call(meshHeaders(map[string]string{extauthz.HeaderCaller: "carol"})), map[string]map[string]any{"jwt_payload": alicePayload}), 401, "the token"},
		{"a control character", call(meshHeaders(map[string]string{extauthz.HeaderCaller: "carol\x07"})), 401, "control characters"},
		{"too long", call(meshHeaders(map[string]string{extauthz.HeaderCaller: strings.Repeat("a", 300)})), 401, "longer than 256 bytes"},
	} {
		got := w.check(ctx, tt.req)
		if got.err != nil || got.allow || got.status != tt.status || !strings.Contains(got.body, tt.want) || !strings.Contains(got.body, "did not run") {
			t.Errorf("%s: Check = %+v, want denied %d saying %q", tt.name, got, tt.status, tt.want)
		}
	}
	if n := w.cards.Load(); n != 0 {
		t.Errorf("%d cards went up, want none", n)
	}
}

// TestExtAuthzHTTPCaller: the HTTP variant reads the caller, the route
// and the MCP server from the headers the gateway adds to the check
// (authorization_request.headers_to_add).
func TestExtAuthzHTTPCaller(t *testing.T) {
	t.Parallel()
	w := newExtWorldWith(t, fmt.Sprintf(extCallersPolicy, api.HashKey(extKey), api.HashKey(meshKey)), extauthz.Options{})
	body := toolCall(41, "refund", `{"order_id":"1234","amount":30}`)
	req, err := http.NewRequest(http.MethodPost, w.base+server.PathExtAuthz+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range meshHeaders(map[string]string{extauthz.HeaderCaller: "carol", extauthz.HeaderRoute: "mcp-orders", extauthz.HeaderServer: "orders"}) {
		req.Header.Set(k, v)
	}
	out := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
		}
		out <- resp
	}()
	var id string
	select {
	case id = <-w.posted:
	case <-time.After(10 * time.Second):
		t.Fatal("no card went up")
	}
	r, err := w.store.Request(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requester != "U0CAROL01" || r.Caller.Route != "mcp-orders" || r.Caller.Upstream != "orders" || r.Caller.Gateway != approval.GatewayExtAuthz {
		t.Errorf("request: requester %q caller %+v; want U0CAROL01 on mcp-orders to orders through ext_authz", r.Requester, r.Caller)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	if resp := <-out; resp == nil || resp.StatusCode != 200 {
		t.Errorf("approved: %v, want 200", resp)
	} else {
		_ = resp.Body.Close()
	}
}

// TestExtAuthzOffersNoEdit: a gateway check cannot change the request it
// holds, so a request made through ext_authz offers only the tool's other
// decisions (its policy allows edit); an edit is refused by the lifecycle,
// the check stays held, and the approval lets the call through as sent.
func TestExtAuthzOffersNoEdit(t *testing.T) {
	t.Parallel()
	w := newExtWorld(t)
	ctx := context.Background()
	args := `{"order_id":"1234","amount":30}`
	id, ch := w.held(t, ctx, envoyCheck(toolCall(51, "refund", args), true, extHeaders))
	r, err := w.store.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(r.Decisions, approval.VerdictEdit) || !slices.Contains(r.Decisions, approval.VerdictApprove) {
		t.Errorf("decisions %v, want the policy's without edit", r.Decisions)
	}
	_, err = w.life.Decide(ctx, r, approval.Decision{RequestID: id, Verdict: approval.VerdictEdit, Approver: "U0BOB", At: time.Now(), Digest: r.Digest,
		Args: json.RawMessage(`{"order_id":"1234","amount":10}`)}, approval.DecideOptions{})
	if !errors.Is(err, approval.ErrVerdictNotAllowed) {
		t.Errorf("Decide(edit) = %v, want %v", err, approval.ErrVerdictNotAllowed)
	}
	w.decide(t, id, approval.Decision{Verdict: approval.VerdictApprove})
	if got := extAnswer(t, ch); got.err != nil || !got.allow {
		t.Errorf("approved after the refused edit: Check = %+v, want allowed as sent", got)
	}
}
