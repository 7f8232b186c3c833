package bot_test

import (
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestEveryRequesterRefused: a request asked for by several people (its
// task thread's authors) names them all on its card as who asked and not
// who may decide; none of them may approve it (four-eyes), nor, where the
// policy allows self-approval, pre-authorise more of their calls with
// Approve + allow. An approver who did not ask decides it.
func TestEveryRequesterRefused(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.request(func(r *approval.Request) {
		r.Requesters = []string{alice, bob}
		r.Approvers = approval.Approvers{Users: []string{bob, carol}}
	})

	text := allText(h.card(r).Blocks)
	for _, want := range []string{"Requested by <@" + alice + "> and <@" + bob + ">", "not <@" + alice + "> or <@" + bob + "> (who asked)"} {
		if !strings.Contains(text, want) {
			t.Errorf("card text %q\ndoes not say %q", text, want)
		}
	}
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "You asked for this, so someone else has to decide it")
	if got := h.load(r.ID); got.Status != approval.StatusPending || len(got.Approvals) != 0 {
		t.Fatalf("after bob's Approve: %s with approvals %+v, want pending with none", got.Status, got.Approvals)
	}
	if recs := h.audit.Records(approval.EventDecisionRefuse); len(recs) != 1 || recs[0].Actor != bob {
		t.Errorf("decision_refused records = %+v, want one by bob", recs)
	}

	self := h.request(func(r *approval.Request) {
		r.Requesters = []string{alice, bob}
		r.Preauthorize = time.Hour
		r.Approvers = approval.Approvers{Users: []string{bob, carol}, AllowSelf: true}
	})
	if err := h.ws.Click(bob, approvals, self.Card.TS, "cs_approve_allow"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "cannot pre-authorise more of your own calls")
	if got := h.load(self.ID); got.Status != approval.StatusPending || got.Grant != nil {
		t.Errorf("bob's Approve + allow = %s with grant %+v, want nothing changed", got.Status, got.Grant)
	}

	if err := h.ws.Click(carol, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	if got := h.waitStatus(r.ID, approval.StatusApproved); got.Decision == nil || got.Decision.Approver != carol {
		t.Errorf("decision = %+v, want carol's approval", got.Decision)
	}
}
