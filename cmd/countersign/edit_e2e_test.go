package main_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
)

// TestDemoEditIsANewProposal (issue 27, point 2) in the demo, whose
// policy asks two approvals for refunds over $500 and refuses those over
// $2,000. A $60 refund needs one approval. Bob's edit to $2,500 is refused
// on the amount field; his edit to $1,200 is accepted but runs nothing:
// the card says one more approval is needed and why. Carol's Approve then
// runs the refund, with $1,200.
func TestDemoEditIsANewProposal(t *testing.T) {
	t.Parallel()
	forEachDelivery(t, func(t *testing.T, d *main.Demo) {
		ws, cast := d.Workspace, d.Cast
		alice, bob, carol := cast.Requester.ID, cast.Approver.ID, cast.SecondApprover.ID
		if _, err := ws.PostMessage(alice, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> refund $60 on order 1234", ""); err != nil {
			t.Fatalf("PostMessage: %v", err)
		}
		var card slacksim.Message
		waitWS(t, d, "the refund's card", func() bool {
			var ok bool
			card, ok = cardFor(d, "issue_refund")
			return ok
		})
		if text := textOfBlocks(card.Blocks); !strings.Contains(text, "0 of 1 approvals") {
			t.Fatalf("card of the $60 refund = %s, want one approval asked", text)
		}
		if err := ws.Click(bob, cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
			t.Fatalf("Click(edit): %v", err)
		}
		v := openModal(t, d, bob)
		// amount is the second property of the schema: block f1.
		res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "2500"}})
		if err != nil {
			t.Fatalf("SubmitView(2500): %v", err)
		}
		if res.ResponseAction != "errors" || !strings.Contains(res.Errors["f1"], "refunds above $2,000 go through finance") {
			t.Fatalf("SubmitView(2500) = %+v, want the deny rule's reason on the amount field f1", res)
		}
		res, err = ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "1200"}})
		if err != nil || !res.Closed {
			t.Fatalf("SubmitView(1200) = %+v, %v; want closed", res, err)
		}
		waitWS(t, d, "the card asking for one more approval", func() bool {
			m, ok := d.Workspace.Message(card.Channel, card.TS)
			text := textOfBlocks(m.Blocks)
			return ok && strings.Contains(text, "1 more approval needed") && strings.Contains(text, "refund above $500: 2 approvals needed") &&
				strings.Contains(text, "1 of 2 approvals")
		})
		if n := len(d.SoR.Refunds()); n != 0 {
			t.Fatalf("refunds after bob's edit alone = %d, want 0", n)
		}
		if err := ws.Click(carol, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			t.Fatalf("Click(approve): %v", err)
		}
		waitUntil(t, "the refund", func() bool { return len(d.SoR.Refunds()) == 1 })
		if got := d.SoR.Refunds()[0]; got.Amount != 1200 {
			t.Errorf("refund = %+v, want $1,200 (the edited amount)", got)
		}
	})
}

// TestAPIEditUndeclaredTool (issue 27, point 3): a /v1 caller's call of a
// tool the policy does not declare (deploy_service, under the external
// rule) is edited in the modal as one JSON object: text that is not an
// object is refused on that field; a valid object comes back to the
// caller's long poll as the approved, edited arguments.
func TestAPIEditUndeclaredTool(t *testing.T) {
	t.Parallel()
	d := startDemo(t, true)
	c := apiClient(d)
	bob := d.Cast.Approver.ID
	r, err := c.Request(context.Background(), client.Call{Tool: "deploy_service", CallID: "call-edit-ext", Arguments: json.RawMessage(`{"service":"db"}`)})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	card := apiCard(t, d, r.ID)
	ch := waitAsync(c, r.ID)
	if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
		t.Fatalf("Click(edit): %v", err)
	}
	v := openModal(t, d, bob)
	if text := textOfBlocks(v.Blocks); !strings.Contains(text, "Arguments of deploy_service (a JSON object)") || !strings.Contains(text, "not declared in the policy") {
		t.Errorf("edit modal = %s, want one JSON input for deploy_service", text)
	}
	res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"args_json": {"v": `["web"]`}})
	if err != nil || res.ResponseAction != "errors" || res.Errors["args_json"] != "Not a valid JSON object." {
		t.Fatalf("SubmitView(a list) = %+v, %v; want an error on args_json", res, err)
	}
	res, err = d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"args_json": {"v": `{"service": "web", "replicas": 2}`}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView(valid) = %+v, %v; want closed", res, err)
	}
	got := answer(t, ch)
	var args struct {
		Service  string
		Replicas int
	}
	if err := json.Unmarshal(got.Arguments, &args); err != nil || got.Status != client.Approved || got.Verdict != "edit" || args.Service != "web" || args.Replicas != 2 {
		t.Fatalf("Wait = %+v (arguments %s), want approved with the edited arguments", got, got.Arguments)
	}
}

// textOfBlocks is every text of a Block Kit JSON array, joined.
func textOfBlocks(raw json.RawMessage) string {
	return strings.Join(blockTextsOf(raw), "\n")
}
