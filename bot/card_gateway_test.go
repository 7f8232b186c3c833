package bot_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestGatewayCardOffersNoEdit: a call an Envoy ext_authz gateway checked,
// proposed through the lifecycle as the API proposes it, gets a card that
// names the person the gateway vouched for, the route and the MCP server,
// offers the tool's decisions but Edit (the gateway cannot change the
// request it holds) and says why; the same call from the API keeps its
// Edit button.
func TestGatewayCardOffersNoEdit(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	propose := func(callID string, caller approval.Caller) *approval.Request {
		t.Helper()
		got, err := h.life.Propose(h.ctx, approval.Proposal{RequestID: approval.NewID("req"), CallID: callID, Tool: "issue_refund",
			Args:      json.RawMessage(`{"order_id":"1234","amount":64,"reason":"damaged","notify":true,"email":"a@example.com"}`),
			Requester: alice, Caller: caller, External: true})
		if err != nil || got.Outcome != approval.ProposedAsk {
			t.Fatalf("Propose(%s) = %+v, %v; want a request for a person", callID, got, err)
		}
		return h.load(got.Request.ID)
	}
	gw := propose("gw-1", approval.Caller{Kind: approval.CallerAPI, Name: "mesh", Upstream: "orders", Gateway: approval.GatewayExtAuthz, Route: "mcp-orders"})
	if slices.Contains(gw.Decisions, approval.VerdictEdit) {
		t.Errorf("ext_authz request decisions %v, want no edit", gw.Decisions)
	}
	card := h.card(gw)
	for _, a := range []string{"cs_approve", "cs_respond", "cs_reject"} {
		if !hasAction(card.Blocks, a) {
			t.Errorf("ext_authz card lacks button %s", a)
		}
	}
	if hasAction(card.Blocks, "cs_edit") {
		t.Error("ext_authz card offers Edit, which the gateway cannot apply")
	}
	text := allText(card.Blocks)
	for _, want := range []string{
		"Requested through the gateway (Envoy ext_authz, route `mcp-orders`, MCP server `orders`, key `mesh`) on behalf of <@" + alice + ">",
		"No edit: the gateway (Envoy ext_authz) can only let this call through as sent or deny it",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("ext_authz card does not say %q:\n%s", want, text)
		}
	}

	api := propose("api-1", approval.Caller{Kind: approval.CallerAPI, Name: "mesh"})
	if !hasAction(h.card(api).Blocks, "cs_edit") || strings.Contains(allText(h.card(api).Blocks), "No edit") {
		t.Errorf("the API's card for the same tool lost its Edit button or says no edit:\n%s", allText(h.card(api).Blocks))
	}
}
