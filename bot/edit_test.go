package bot_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
)

// quorumPolicy lets refunds up to $5,000 through the schema and asks two
// approvals for those over $500 (the demo's rule).
func quorumPolicy(f *policyfile.File) {
	f.Tools[0].Schema = json.RawMessage(strings.Replace(refundSchema, `"maximum": 500`, `"maximum": 5000`, 1))
	tp := f.Policy.Tools["issue_refund"]
	tp.QuorumWhen = []approval.QuorumRule{{When: "args.amount > 500", Quorum: 2, Reason: "refunds over $500"}}
	f.Policy.Tools["issue_refund"] = tp
}

// TestEditIntoQuorumAsksForTheRest (issue 27, point 2): a $64 refund needs
// one approval; bob edits it to $1,200, which needs two. The edit is
// accepted (not an error on the modal) but decides nothing: it counts as
// bob's one approval, the card says one more is needed and why, bob
// cannot supply it, and carol's Approve approves the edited $1,200.
func TestEditIntoQuorumAsksForTheRest(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: quorumPolicy})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "1200"}}) // amount
	if err != nil || !res.Closed {
		t.Fatalf("edit to 1200 = %+v, %v; want the modal closed", res, err)
	}
	if ev, _ := h.outcome(r.ID, 0); ev != approval.EventApprovalVote {
		t.Fatalf("the edit's audit entry = %s, want approval_counted (one of two approvals)", ev)
	}
	got := h.load(r.ID)
	if got.Status != approval.StatusPending || got.Quorum != 2 || len(got.Approvals) != 1 || !strings.Contains(string(got.Args), `"amount":1200`) {
		t.Fatalf("after bob's edit: %s, quorum %d, %d approvals, args %s; want pending, 2, 1, amount 1200", got.Status, got.Quorum, len(got.Approvals), got.Args)
	}
	for _, rec := range h.audit.Records(approval.EventApprovalVote) {
		if d := rec.Data.(approval.DecidedEvent); rec.RequestID == r.ID && (d.Quorum != 2 || d.Verdict != approval.VerdictEdit) {
			t.Errorf("approval_counted = %+v, want the edit with quorum 2", d)
		}
	}
	h.waitWS("the card asks for one more approval", func() bool {
		text := allText(h.card(r).Blocks)
		return strings.Contains(text, "1 more approval needed") && strings.Contains(text, "refunds over $500: 2 approvals needed") &&
			strings.Contains(text, "1 of 2 approvals")
	})

	// The editor cannot supply the approval his edit made necessary.
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	if ev, reason := h.outcome(r.ID, 1); ev != approval.EventDecisionRefuse || reason != "already_voted" {
		t.Fatalf("bob's Approve after his edit = %s %s, want decision_refused already_voted", ev, reason)
	}
	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	final := h.waitStatus(r.ID, approval.StatusApproved)
	if !strings.Contains(string(final.Args), `"amount":1200`) || len(final.Approvals) != 2 || final.Decision.Approver != carol {
		t.Fatalf("approved: args %s, %d approvals, decided by %s; want amount 1200, 2 approvals, carol", final.Args, len(final.Approvals), final.Decision.Approver)
	}
}

// externalPolicy adds the policy's rule for tools it does not declare
// (what /v1 and MCP callers ask for), with a deny rule.
func externalPolicy(f *policyfile.File) {
	f.Policy.External = &approval.ToolPolicy{Review: approval.ReviewAlways, Risk: approval.RiskMedium, Quorum: 1,
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
		Deny:      []approval.DenyRule{{When: `"amount" in args && args.amount > 1000`, Reason: "over $1,000 goes through finance"}}}
}

// apiRequest creates, through the lifecycle as the API does, a pending
// request from API key support-bot for crm_update, a tool the policy does
// not declare, with the caller's inputSchema (nil for none).
func (h *harness) apiRequest(inputSchema string) *approval.Request {
	h.t.Helper()
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), CallID: "call-1", Requester: "support-bot",
		Caller: approval.Caller{Kind: approval.CallerAPI, Name: "support-bot"},
		Tool:   "crm_update", Risk: approval.RiskMedium,
		Args:      json.RawMessage(`{"id":"c-7","amount":40}`),
		Signals:   []approval.Signal{{Code: approval.SignalReviewAlways, Text: "tool is always reviewed"}},
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject}, Quorum: 1,
		Created: h.clock.Now(), Deadline: h.clock.Now().Add(time.Hour),
	}
	if inputSchema != "" {
		r.InputSchema = json.RawMessage(inputSchema)
	}
	created, err := h.life.Create(h.ctx, r)
	if err != nil || !created.Card.Bound() {
		h.t.Fatalf("Create = %+v, %v; want a bound card", created, err)
	}
	return created
}

// editModalOf clicks Edit on r's card as user and returns the modal.
func (h *harness) editModalOf(user string, r *approval.Request) slacksim.View {
	h.t.Helper()
	if err := h.ws.Click(user, approvals, r.Card.TS, "cs_edit"); err != nil {
		h.t.Fatal(err)
	}
	var v slacksim.View
	h.waitWS("the edit modal of "+r.ID, func() bool {
		for _, x := range h.ws.OpenViews(user) {
			if x.CallbackID == "cs_edit" && strings.Contains(x.PrivateMetadata, r.ID) {
				v = x
				return true
			}
		}
		return false
	})
	return v
}

// TestEditUndeclaredTool (issue 27, point 3): the call of a tool the
// policy does not declare (an API or MCP caller's) is edited as one JSON
// object in the modal, labelled for people (and naming the schema's
// required fields when its caller sent a schema). Text that is not a JSON
// object, arguments that break the caller's schema and arguments a deny
// rule refuses are refused on that field, nothing recorded; a valid edit
// approves the edited arguments, and an unchanged one is an approval.
func TestEditUndeclaredTool(t *testing.T) {
	const schema = `{"type":"object","properties":{"id":{"type":"string"},"amount":{"type":"integer","maximum":100}},"required":["id"],"additionalProperties":false}`
	tests := []struct {
		name, schema string
		wantHint     []string
		refused      map[string]string // submitted JSON → the field's error
		edit         string
		want         map[string]any
	}{
		{name: "no input schema",
			wantHint: []string{"not declared in the policy", "sent no schema"},
			refused: map[string]string{
				`{"id": "c-7",`:              "Not a valid JSON object.",
				`["c-7"]`:                    "Not a valid JSON object.",
				`{"id":"c-7","amount":5000}`: "The policy refuses this: over $1,000 goes through finance",
			},
			edit: `{"id": "c-7", "amount": 55, "note": "goodwill"}`,
			want: map[string]any{"id": "c-7", "amount": 55.0, "note": "goodwill"}},
		{name: "with the caller's input schema", schema: schema,
			wantHint: []string{"input schema its caller sent", "Required: id. Optional: amount."},
			refused: map[string]string{
				`{"amount":500}`:            "id is required",
				`{"id":"c-7","amount":500}`: "amount: Must be at most 100.",
				`{"id":"c-7","x":1}`:        "x",
			},
			edit: `{"id":"c-8","amount":60}`,
			want: map[string]any{"id": "c-8", "amount": 60.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, policy: externalPolicy})
			r := h.apiRequest(tt.schema)
			v := h.editModalOf(bob, r)
			blocks := string(v.Blocks)
			text := allText(v.Blocks)
			if !strings.Contains(blocks, `"block_id":"args_json"`) || !strings.Contains(text, "Arguments of crm_update (a JSON object)") {
				t.Errorf("edit modal = %s, want one JSON input labelled for the tool", blocks)
			}
			for _, want := range tt.wantHint {
				if !strings.Contains(text, want) {
					t.Errorf("edit modal does not say %q:\n%s", want, text)
				}
			}
			for args, want := range tt.refused {
				res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"args_json": {"v": args}})
				if err != nil {
					t.Fatalf("SubmitView(%s) = %v", args, err)
				}
				if res.ResponseAction != "errors" || !strings.Contains(res.Errors["args_json"], want) {
					t.Errorf("SubmitView(%s) = %+v, want an error on args_json containing %q", args, res, want)
				}
			}
			if got := h.load(r.ID); got.Status != approval.StatusPending || string(got.Args) != string(r.Args) ||
				len(h.audit.Records(approval.EventDecided))+len(h.audit.Records(approval.EventApprovalVote)) != 0 {
				t.Fatalf("after refused edits: %s %s; want pending with the proposed arguments and nothing decided", got.Status, got.Args)
			}
			res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"args_json": {"v": tt.edit}})
			if err != nil || !res.Closed {
				t.Fatalf("SubmitView(%s) = %+v, %v; want the modal closed", tt.edit, res, err)
			}
			got := h.waitStatus(r.ID, approval.StatusApproved)
			var args map[string]any
			_ = json.Unmarshal(got.Args, &args)
			if got.Decision.Verdict != approval.VerdictEdit || len(args) != len(tt.want) {
				t.Fatalf("decision %s with args %s, want an edit to %v", got.Decision.Verdict, got.Args, tt.want)
			}
			for k, want := range tt.want {
				if args[k] != want {
					t.Errorf("edited %s = %v, want %v", k, args[k], want)
				}
			}
		})
	}

	t.Run("unchanged", func(t *testing.T) {
		h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, policy: externalPolicy})
		r := h.apiRequest(schema)
		v := h.editModalOf(bob, r)
		res, err := h.ws.SubmitView(bob, v.ID, nil)
		if err != nil || !res.Closed {
			t.Fatalf("unchanged submit = %+v, %v; want closed", res, err)
		}
		if got := h.waitStatus(r.ID, approval.StatusApproved); got.Decision.Verdict != approval.VerdictApprove {
			t.Errorf("unchanged submit decided %s, want an approval", got.Decision.Verdict)
		}
	})
}
