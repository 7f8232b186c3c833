package bot_test

import (
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestOlderCardStateSentLastIsRedrawn: two processes redraw one card. The
// first reads the pending record and pauses before sending; meanwhile the
// request is approved through the second, whose writer draws it approved;
// then the first's send of the pending state lands last. Each writer reads
// the record right before sending, yet without a second look the card
// would show live buttons on an approved request. The first writer reads
// the record again once its send landed, finds it changed, and draws the
// approval.
func TestOlderCardStateSentLastIsRedrawn(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.request(nil)
	first := h.bot
	second := h.newBot()
	held := make(chan chan struct{}, 1)
	h.requests.mu.Lock()
	h.requests.afterRead = held
	h.requests.mu.Unlock()
	first.Refresh(r)
	var release chan struct{}
	select {
	case release = <-held: // the first process read the pending record
	case <-time.After(hangAfter):
		t.Fatal("the first process's card writer never read the record")
	}
	cur := h.load(r.ID)
	if _, err := h.lives[second].Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob,
		At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide through the second process: %v", err)
	}
	h.cardsIdleOf(second)
	if hasAction(h.card(r).Blocks, "cs_approve") {
		t.Fatal("the second process did not draw the approval")
	}
	close(release) // the first process's pending state now lands last
	h.cardsIdleOf(first)
	if card := h.card(r); hasAction(card.Blocks, "cs_approve") {
		t.Errorf("card after both writers = %s; want the approval, no buttons", allText(card.Blocks))
	}
}
