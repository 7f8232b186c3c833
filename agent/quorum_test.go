package agent_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
)

// quorumPolicy is testPolicy with issue_refund needing two approvers.
var quorumPolicy = strings.Replace(testPolicy,
	"    decisions: [approve, edit, reject]\n    secret: [reason]\n",
	"    decisions: [approve, edit, reject]\n    quorum: 2\n    secret: [reason]\n", 1)

// TestQuorumEditThenApprove: with quorum 2 an edit resets the approvals to
// the editor and a second approver completes the quorum with an approve.
// The arguments that run are still an approver's edit: they are validated
// against the schema, and the model is told what changed and by whom.
func TestQuorumEditThenApprove(t *testing.T) {
	if !strings.Contains(quorumPolicy, "quorum: 2") {
		t.Fatal("quorumPolicy: issue_refund not found in testPolicy")
	}
	tests := []struct {
		name      string
		edit      string
		wantHits  int
		wantState approval.Status
		wantTool  string
		wantTally func(approval.RunResult) bool
	}{
		{name: "invalid edit never runs", edit: `{"order_id":"1234","amount":-5,"reason":"x"}`,
			wantHits: 0, wantState: approval.StatusFailed, wantTool: "Not run: the arguments U_EDITOR entered are invalid",
			wantTally: func(r approval.RunResult) bool { return r.Refused == 1 && r.Approved == 0 && r.Edited == 0 }},
		{name: "valid edit runs and is reported as an edit", edit: `{"order_id":"1234","amount":40,"reason":"x"}`,
			wantHits: 1, wantState: approval.StatusExecuted, wantTool: "amount: 64 → 40",
			wantTally: func(r approval.RunResult) bool { return r.Edited == 1 && r.Approved == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorldPolicy(t, quorumPolicy)
			p := w.start()
			w.model.Enqueue(
				scripted.Reply{ToolCalls: []scripted.Call{call("q1", "issue_refund", refundArgs)}},
				scripted.Reply{Content: "ok"},
			)
			p.handle(t, task("refund"))
			card := recv(t, p.notify.cards, "the card")
			if card.Quorum != 2 {
				t.Fatalf("card quorum = %d, want 2", card.Quorum)
			}
			edited := w.decideAs("U_EDITOR", card, approval.VerdictEdit, "", json.RawMessage(tt.edit))
			if edited.Status != approval.StatusPending {
				t.Fatalf("after the edit: status %s, want pending (quorum 2)", edited.Status)
			}
			final := w.decideAs("U_SECOND", edited, approval.VerdictApprove, "", nil)
			if final.Status != approval.StatusApproved || final.Decision.Verdict != approval.VerdictApprove {
				t.Fatalf("after the second approval: %s %+v, want approved by approve", final.Status, final.Decision)
			}
			res := recv(t, p.notify.results, "the run result")
			if n := w.sor.count("POST /refunds"); n != tt.wantHits {
				t.Errorf("POST /refunds hits = %d, want %d", n, tt.wantHits)
			}
			if got := w.request(card.ID).Status; got != tt.wantState {
				t.Errorf("request status = %s, want %s", got, tt.wantState)
			}
			tools := toolMessages(w.lastRequest())
			if len(tools) != 1 || !strings.Contains(tools[0].Content, tt.wantTool) {
				t.Errorf("tool messages = %+v, want one containing %q", tools, tt.wantTool)
			}
			if !tt.wantTally(res) {
				t.Errorf("run result = %+v", res)
			}
		})
	}
}
