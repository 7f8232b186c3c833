package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// quorumWhenPolicy is testPolicy with refunds over $500 needing two
// approvals.
var quorumWhenPolicy = strings.Replace(testPolicy,
	"    decisions: [approve, edit, reject]\n    secret: [reason]\n",
	"    decisions: [approve, edit, reject]\n    quorum_when:\n      - {when: 'args.amount > 500', quorum: 2, reason: refunds over $500}\n    secret: [reason]\n", 1)

// TestEditedCallNeedsItsQuorum (issue 27, point 2): the agent checks the
// approvals of an edited call again before running it. A $64 refund
// (one approval) edited to $900 (two): judged by the lifecycle, the edit
// raises the request's quorum and counts as one approval, and the call
// runs, with $900, once a second approver approves; recorded without that
// judgement (one approval for a call that needs two), the claim judges it
// (issue 45): pending again, and it runs only once the second approval
// comes.
func TestEditedCallNeedsItsQuorum(t *testing.T) {
	if !strings.Contains(quorumWhenPolicy, "quorum_when") {
		t.Fatal("quorumWhenPolicy: issue_refund not found in testPolicy")
	}
	const edited = `{"order_id":"1234","amount":900,"reason":"damaged in transit"}`
	t.Run("judged edit runs once the quorum is met", func(t *testing.T) {
		w := newWorldPolicy(t, quorumWhenPolicy)
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(w.store, w.audit), Gate: w.gate, Schemas: w.file})
		if err != nil {
			t.Fatal(err)
		}
		p := w.start()
		w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("e1", "issue_refund", refundArgs)}}, scripted.Reply{Content: "ok"})
		p.handle(t, task("refund"))
		card := recv(t, p.notify.cards, "the card")
		if card.Quorum != 1 {
			t.Fatalf("card quorum = %d, want 1 for $64", card.Quorum)
		}
		ctx := context.Background()
		after, err := life.Decide(ctx, card, approval.Decision{RequestID: card.ID, Verdict: approval.VerdictEdit, Args: json.RawMessage(edited),
			Approver: "U_EDITOR", Digest: card.Digest}, approval.DecideOptions{})
		if err != nil {
			t.Fatalf("Decide(edit to $900) = %v", err)
		}
		if after.Status != approval.StatusPending || after.Quorum != 2 {
			t.Fatalf("Decide(edit to $900) = %s with quorum %d, want pending with quorum 2", after.Status, after.Quorum)
		}
		if _, err := life.Decide(ctx, after, approval.Decision{RequestID: card.ID, Verdict: approval.VerdictApprove,
			Approver: "U_SECOND", Digest: after.Digest}, approval.DecideOptions{}); err != nil {
			t.Fatalf("Decide(second approve) = %v", err)
		}
		recv(t, p.notify.results, "the run result")
		if n := w.sor.count("POST /refunds"); n != 1 {
			t.Fatalf("POST /refunds hits = %d, want 1", n)
		}
		if got := w.request(card.ID); got.Status != approval.StatusExecuted || !strings.Contains(string(got.Args), `"amount":900`) {
			t.Errorf("request = %s with %s, want executed with amount 900", got.Status, got.Args)
		}
	})
	t.Run("unjudged edit short of its quorum waits for the rest", func(t *testing.T) {
		w := newWorldPolicy(t, quorumWhenPolicy)
		p := w.start()
		w.model.Enqueue(scripted.Reply{ToolCalls: []scripted.Call{call("e2", "issue_refund", refundArgs)}}, scripted.Reply{Content: "ok"})
		p.handle(t, task("refund"))
		card := recv(t, p.notify.cards, "the card")
		// Recorded straight into the store, as a process that does not
		// judge edits would: approved on one approval.
		ctx := context.Background()
		got, err := w.store.RecordDecision(ctx, approval.Decision{RequestID: card.ID, Verdict: approval.VerdictEdit,
			Args: json.RawMessage(edited), Approver: "U_EDITOR", Digest: card.Digest})
		if err != nil {
			t.Fatalf("RecordDecision(edit) = %v", err)
		}
		if got.Status != approval.StatusApproved {
			t.Fatalf("RecordDecision(edit) = %s, want approved (quorum 1 on the record)", got.Status)
		}
		if err := w.store.Wake(ctx, card.ID, got.Status); err != nil {
			t.Fatal(err)
		}
		// The claim judges it (issue 45): $900 needs two approvals under
		// the policy in force, so it goes back to pending, its card asking
		// for the second, and nothing runs meanwhile.
		var reopened *approval.Request
		for reopened == nil {
			u := recv(t, p.notify.updates, "the card redrawn pending again")
			if u.ID == card.ID && u.Status == approval.StatusPending && u.Reopened != nil {
				reopened = u
			}
		}
		if ro := reopened.Reopened; ro.Need != 2 || ro.Have != 1 || !strings.Contains(ro.Reason, "the arguments U_EDITOR entered") || reopened.Quorum != 2 {
			t.Errorf("reopened = %+v with quorum %d, want need 2, have 1, quorum 2, the editor named", ro, reopened.Quorum)
		}
		if n := w.sor.count("POST /refunds"); n != 0 {
			t.Fatalf("POST /refunds hits = %d, want 0: $900 needs two approvals", n)
		}
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(w.store, w.audit), Gate: w.gate, Schemas: w.file})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := life.Decide(ctx, reopened, approval.Decision{RequestID: card.ID, Verdict: approval.VerdictApprove,
			Approver: "U_SECOND", Digest: reopened.Digest}, approval.DecideOptions{}); err != nil {
			t.Fatalf("Decide(second approve) = %v", err)
		}
		recv(t, p.notify.results, "the run result")
		if n := w.sor.count("POST /refunds"); n != 1 {
			t.Fatalf("POST /refunds hits = %d, want 1 once the second approval came", n)
		}
		if got := w.request(card.ID); got.Status != approval.StatusExecuted || !strings.Contains(string(got.Args), `"amount":900`) {
			t.Errorf("request = %s with %s, want executed with amount 900", got.Status, got.Args)
		}
	})
}
