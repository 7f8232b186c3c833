package bot_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
)

// newPending stores a pending refund request of alice's without posting
// its card.
func (h *harness) newPending() *approval.Request {
	h.t.Helper()
	threadTS, err := h.ws.PostMessage(alice, tasks, "please refund order 1234", "")
	if err != nil {
		h.t.Fatalf("PostMessage: %v", err)
	}
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: approval.NewID("run"), Requester: alice,
		Origin: approval.Origin{Channel: tasks, ThreadTS: threadTS}, Tool: "issue_refund", Risk: approval.RiskHigh,
		Args:      json.RawMessage(`{"order_id":"1234","amount":64}`),
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}, Quorum: 1,
		Created: h.clock.Now(), Deadline: h.clock.Now().Add(time.Hour),
	}
	if err := h.store.CreateRequest(h.ctx, r); err != nil {
		h.t.Fatalf("CreateRequest: %v", err)
	}
	return r
}

// outcome waits for the next audit entry about request id that says what
// a click did (decided, approval_counted or decision_refused) beyond the
// first seen, and returns its event and reason.
func (h *harness) outcome(id string, seen int) (approval.Event, string) {
	h.t.Helper()
	var ev approval.Event
	var reason string
	waitCh(h.t, "the outcome of a click on "+id, h.audit.changed, func() bool {
		n := 0
		for _, rec := range h.audit.all() {
			if rec.RequestID != id {
				continue
			}
			switch rec.Event {
			case approval.EventDecided, approval.EventApprovalVote, approval.EventDecisionRefuse:
				n++
				if n > seen {
					ev = rec.Event
					if d, ok := rec.Data.(approval.RefusalEvent); ok {
						reason = d.Reason
					}
					return true
				}
			}
		}
		return false
	})
	return ev, reason
}

// TestForeignTeamClickRefused (issue 10, point 1): a Slack Connect member
// of the approvals channel from another organisation, whose user id would
// otherwise pass as an approver, decides nothing: the click is refused,
// audited with the foreign team, and the clicker told.
func TestForeignTeamClickRefused(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	const outsider, otherTeam = "U0EXT0001", "T0OTHERORG"
	h.ws.AddUser(slacksim.User{ID: outsider, Name: "ext", TeamID: otherTeam})
	if err := h.ws.JoinChannel(approvals, outsider); err != nil {
		t.Fatal(err)
	}
	r := h.request(nil)
	if err := h.ws.Click(outsider, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "refusal audit", h.audit.changed, func() bool {
		for _, rec := range h.audit.Records(approval.EventDecisionRefuse) {
			if d, ok := rec.Data.(approval.RefusalEvent); ok && rec.RequestID == r.ID && d.Reason == "foreign_team" && d.Team == otherTeam {
				return true
			}
		}
		return false
	})
	h.ephemeralContaining(outsider, "another workspace")
	if got := h.load(r.ID); got.Status != approval.StatusPending || len(got.Approvals) != 0 {
		t.Fatalf("request after a foreign click = %s with %d approvals, want pending with none", got.Status, len(got.Approvals))
	}
	// Their mention starts nothing either.
	if _, err := h.ws.PostMessage(outsider, approvals, "<@"+slacksim.BotUserID+"> refund order 1", ""); err != nil {
		t.Fatal(err)
	}
	if err := h.ws.SlashCommand(outsider, approvals, "/countersign", "pending"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(outsider, "serves another workspace")
	if n := len(h.runner.Tasks()); n != 0 {
		t.Errorf("tasks started by an outsider = %d, want 0", n)
	}
	// The same click by a member of the installation's team counts.
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.waitStatus(r.ID, approval.StatusApproved)
}

// TestClickInsideTheBindingWindow (issue 10, point 2; issue 28, point
// 3): between Slack's answer to chat.postMessage and the binding of the
// card, a click on the new card itself binds it and decides (it is this
// app's card of the request: its metadata says so), while a click on
// another card carrying its value is refused; after the binding only the
// card decides. The clicks are delivered inside the window by a hook on
// BindCard, not by timing.
func TestClickInsideTheBindingWindow(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	a := h.request(nil)
	b := h.newPending()
	var inWindow []string
	h.requests.setBindHook(func(id string, ref approval.CardRef) {
		if id != b.ID {
			t.Errorf("bind hook ran for %s, want %s", id, b.ID)
			return
		}
		cur := h.load(b.ID)
		value := b.ID + "|" + cur.Digest
		// On card A, carrying B's value.
		if code := postInteraction(t, h, clickPayload(bob, approvals, a.Card.TS, "cs_approve", value)); code != 200 {
			t.Errorf("click = %d", code)
		}
		ev, reason := h.outcome(b.ID, 0)
		inWindow = append(inWindow, string(ev)+":"+reason)
		// On B's own, just posted, message.
		if code := postInteraction(t, h, clickPayload(bob, ref.Channel, ref.TS, "cs_approve", value)); code != 200 {
			t.Errorf("click = %d", code)
		}
		ev, reason = h.outcome(b.ID, 1)
		inWindow = append(inWindow, string(ev)+":"+reason)
	})
	ref, err := h.post(h.ctx, h.bot, b)
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	want := []string{"decision_refused:not_on_card", "decided:"}
	if fmt.Sprint(inWindow) != fmt.Sprint(want) {
		t.Fatalf("clicks inside the window = %v, want %v", inWindow, want)
	}
	bound := h.load(b.ID)
	if bound.Status != approval.StatusApproved || bound.Card != ref {
		t.Fatalf("B after the clicks in the window = %s on card %v, want approved on its card %v", bound.Status, bound.Card, ref)
	}
	if n := len(h.audit.Records(approval.EventCardPosted)); n != 2 {
		t.Errorf("card_posted entries = %d, want 2 (A's and B's, each once)", n)
	}
	if got := h.load(a.ID); got.Status != approval.StatusPending {
		t.Errorf("A = %s, want untouched (pending)", got.Status)
	}
	// After the binding: A's message carrying A's value still decides A
	// only; a click on A's card with B's value is refused.
	if code := postInteraction(t, h, clickPayload(bob, approvals, a.Card.TS, "cs_approve", b.ID+"|"+bound.Digest)); code != 200 {
		t.Fatalf("click = %d", code)
	}
	if ev, reason := h.outcome(b.ID, 2); ev != approval.EventDecisionRefuse || reason != "already_decided" && reason != "not_on_card" {
		t.Fatalf("click on A with B's value after binding = %s/%s, want refused", ev, reason)
	}
	if got := h.load(a.ID); got.Status != approval.StatusPending {
		t.Errorf("A = %s, want untouched (pending)", got.Status)
	}
}

// TestCardBindingProperty (issue 10, acceptance; issue 28, point 3):
// clicks with any request's value, on any message ts, in any channel,
// before or after the binding, never decide a request unless they come
// from its own card — and a click on its own card decides it even inside
// the posting window, binding it. The cases are drawn from a fixed seed,
// so a failure replays.
func TestCardBindingProperty(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	rng := rand.New(rand.NewPCG(10, 2026))
	for i := range 24 {
		x := h.request(nil)
		y := h.newPending()
		before := rng.IntN(3) == 0 // deliver inside y's posting window
		var target *approval.Request
		click := func(yRef approval.CardRef) {
			target = []*approval.Request{x, y}[rng.IntN(2)]
			cur := h.load(target.ID)
			channels := []string{approvals, tasks, other}
			tss := []string{x.Card.TS, yRef.TS, x.Origin.ThreadTS, fmt.Sprintf("1772442000.%06d", rng.IntN(999999))}
			ch, ts := channels[rng.IntN(len(channels))], tss[rng.IntN(len(tss))]
			if code := postInteraction(t, h, clickPayload(bob, ch, ts, "cs_approve", target.ID+"|"+cur.Digest)); code != 200 {
				t.Fatalf("click = %d", code)
			}
			ev, reason := h.outcome(target.ID, 0)
			own := h.load(target.ID).Card
			ownCard := ch == approvals && ts == map[*approval.Request]string{x: x.Card.TS, y: yRef.TS}[target]
			if own.Bound() && own.TS != map[*approval.Request]string{x: x.Card.TS, y: yRef.TS}[target] {
				t.Fatalf("case %d: %s bound to %s/%s, not to its card", i, target.ID, own.Channel, own.TS)
			}
			if decided := ev == approval.EventDecided; decided != ownCard {
				t.Fatalf("case %d: click on %s/%s for %s (card %s/%s, inside window %v) = %s/%s; decided %v, want %v",
					i, ch, ts, target.ID, own.Channel, own.TS, before && target == y, ev, reason, decided, ownCard)
			}
		}
		if before {
			h.requests.setBindHook(func(id string, ref approval.CardRef) {
				if id == y.ID {
					click(ref)
				}
			})
		}
		if _, err := h.post(h.ctx, h.bot, y); err != nil {
			t.Fatalf("Post: %v", err)
		}
		h.requests.setBindHook(nil)
		if !before {
			click(h.load(y.ID).Card)
		}
	}
}

// TestCardFoundAfterCrashInWindow (issue 10, point 3): a process that
// stopped after posting a card and before binding it leaves the card
// unbound; the process resuming the request finds that card and binds it
// instead of posting a second one, and the card reaches the final state.
func TestCardFoundAfterCrashInWindow(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.newPending()
	// The first process "dies" inside the window: its BindCard never returns
	// (until the test ends).
	dead := make(chan struct{})
	t.Cleanup(func() { close(dead) })
	entered := make(chan struct{})
	h.requests.setBindHook(func(id string, _ approval.CardRef) {
		if id == r.ID {
			close(entered)
			<-dead
		}
	})
	first := h.bot
	go func() { _, _ = h.post(h.ctx, first, r) }() // exits at Cleanup (dead closed)
	<-entered
	h.requests.setBindHook(nil)
	if n := len(cardsOf(h, r.ID)); n != 1 {
		t.Fatalf("cards for the request = %d, want 1 posted and unbound", n)
	}
	if h.load(r.ID).Card.Bound() {
		t.Fatalf("card bound although the poster died before binding")
	}
	// The restarted process resumes the request.
	second := h.newBot()
	if _, err := h.post(h.ctx, second, r); err != nil {
		t.Fatalf("Post after restart: %v", err)
	}
	cards := cardsOf(h, r.ID)
	if len(cards) != 1 {
		t.Fatalf("cards for the request = %d after the restart, want still 1", len(cards))
	}
	bound := h.load(r.ID)
	if bound.Card.TS != cards[0].TS {
		t.Fatalf("bound to %s, want the card already posted (%s)", bound.Card.TS, cards[0].TS)
	}
	// Decided, executed: the card says so.
	if _, err := h.life.Decide(h.ctx, bound, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob,
		At: h.clock.Now(), Digest: bound.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.life.Claim(h.ctx, r.ID, "agent"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.life.Finish(h.ctx, r.ID, "agent", approval.Outcome{Status: approval.StatusExecuted, Result: `{"id":"RF-1"}`}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second.CardsIdle():
	case <-time.After(10 * time.Second):
		t.Fatal("card writer busy")
	}
	text := allText(h.card(bound).Blocks)
	if hasAction(h.card(bound).Blocks, "cs_approve") || !strings.Contains(text, "RF-1") {
		t.Errorf("card after execution = %s, want no buttons and the result", text)
	}
}

// cardsOf returns the approvals-channel messages that are cards of id.
func cardsOf(h *harness, id string) []slacksim.Message {
	var out []slacksim.Message
	for _, m := range h.ws.Messages(approvals) {
		if m.ThreadTS == "" && strings.Contains(string(m.Blocks), id+"|") {
			out = append(out, m)
		}
	}
	return out
}

// TestCardWriterUnderRateLimitStorm (issue 10, point 4): the decision and
// the execution race to redraw one card while chat.update answers 429
// (Retry-After 1 s) four times. No chat.update goes out before the
// Retry-After of the 429 before it, the calls are bounded, and the final
// card shows the final state. Run with -count=20 -race.
func TestCardWriterUnderRateLimitStorm(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(nil)
	h.ws.ForceRateLimit("chat.update", 4, 1)
	cur := h.load(r.ID)
	done := make(chan error, 1)
	go func() { // exits when the decision is recorded
		_, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob,
			At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{})
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { // the agent, racing the decision's redraw
		if _, err := h.life.Claim(h.ctx, r.ID, "agent"); err != nil {
			done <- err
			return
		}
		_, err := h.life.Finish(h.ctx, r.ID, "agent", approval.Outcome{Status: approval.StatusExecuted, Result: `{"id":"RF-9"}`})
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.cardsIdle()
	var updates, limited int
	var holdUntil time.Time
	for _, c := range h.ws.CallLog() {
		if c.Method != "chat.update" {
			continue
		}
		updates++
		if c.At.Before(holdUntil) {
			t.Errorf("chat.update at %s, before the Retry-After of the last 429 (%s)", c.At.Format(time.RFC3339Nano), holdUntil.Format(time.RFC3339Nano))
		}
		if c.Error == "ratelimited" {
			limited++
			holdUntil = c.At.Add(time.Second)
		}
	}
	if limited != 4 || updates > 4+3 {
		t.Errorf("chat.update calls = %d (%d rate limited), want the 4 429s and at most 3 more", updates, limited)
	}
	m := h.card(r)
	if text := allText(m.Blocks); hasAction(m.Blocks, "cs_approve") || !strings.Contains(text, "RF-9") {
		t.Errorf("final card = %s, want the execution result and no buttons", text)
	}
}

// TestRefusalReachesClickerOutsideChannel (issue 10, point 5): an approver
// removed from the approvals channel after opening the Reject form is
// refused on submit and told so through the click's response_url (a
// chat.postEphemeral to a non-member fails with user_not_in_channel).
func TestRefusalReachesClickerOutsideChannel(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_reject")
	h.ws.LeaveChannel(approvals, bob)
	h.clock.Advance(time.Minute) // past the member cache
	if _, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": "no"}}); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "not one of the approvers")
	if got := h.load(r.ID); got.Status != approval.StatusPending {
		t.Fatalf("status = %s, want pending", got.Status)
	}
	for _, c := range h.ws.CallLog() {
		if c.Method == "chat.postEphemeral" && c.Params["user"] == bob {
			t.Errorf("refusal went through chat.postEphemeral (%s), want the response_url", c.Error)
		}
	}
}

// TestLostRequestShownOnCard (issue 10, point 6): a request whose record
// vanished (Redis lost its data) is shown as lost on its card, without
// buttons, and the task thread is told, once; the loss is audited.
func TestLostRequestShownOnCard(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	last := h.load(r.ID)
	// As after a Redis restart without persistence: the record is gone.
	if err := h.rdb.Del(h.ctx, h.prefix+":req:{"+r.ID+"}").Err(); err != nil {
		t.Fatal(err)
	}
	h.life.Lose(h.ctx, last)
	h.cardsIdle()
	gone := *last
	gone.Status = approval.StatusLost
	if err := h.bot.Decided(h.ctx, &gone); err != nil { // as the run does
		t.Fatal(err)
	}
	m := h.card(r)
	if text := allText(m.Blocks); hasAction(m.Blocks, "cs_approve") || !strings.Contains(text, "lost") {
		t.Errorf("card of a lost request = %s, want no buttons and lost", text)
	}
	n := 0
	for _, rep := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		if strings.Contains(rep.Text, "was lost") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("thread lines about the loss = %d, want 1", n)
	}
	if len(h.audit.Records(approval.EventLost)) != 1 {
		t.Errorf("lost audit entries = %d, want 1", len(h.audit.Records(approval.EventLost)))
	}
}

// TestLostRequestToldWhereverItsCardWas (issue 46, point 5): Redis loses
// a request while its card goes up — before the post, between Slack's
// answer and the binding, or while Slack has not answered yet and the
// poster is stopped by the same loss (its run's lease went with the data)
// — or once its card is bound. Whenever it happened, after the run reports
// the loss (Lose, then Decided, as it does): a card on screen is never
// deleted but shows the request lost, without buttons (found by its
// metadata when the poster never learnt where it is); the task thread is
// told exactly once that nothing ran, card or no card; the loss is
// audited once.
func TestLostRequestToldWhereverItsCardWas(t *testing.T) {
	tests := []struct {
		name string
		lose string // when the record goes
		card bool   // a card is on screen to show the loss
	}{
		{"before the post", "before post", false},
		{"between Slack's answer and the binding", "before bind", true},
		{"before Slack answered, the poster stopped with it", "during post", true},
		{"once bound", "bound", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
			r := h.newPending()
			forget := func() { // as after a Redis restart without persistence
				if err := h.rdb.Del(h.ctx, h.prefix+":req:{"+r.ID+"}").Err(); err != nil {
					t.Error(err)
				}
			}
			var held *approval.Request // the run's copy of the request
			switch tt.lose {
			case "before post":
				forget()
				held = h.life.EnsureCard(h.ctx, r)
			case "before bind":
				h.requests.setBindHook(func(string, approval.CardRef) { forget() })
				held = h.life.EnsureCard(h.ctx, r)
			case "during post":
				taken, release := h.ws.HoldAnswer("chat.postMessage", map[string]string{"channel": approvals})
				defer release()
				ctx, stop := context.WithCancel(h.ctx)
				done := make(chan *approval.Request)
				go func() { done <- h.life.EnsureCard(ctx, r) }() // exits once the post is cut short
				<-taken                                           // the card is on screen, its answer held
				forget()
				stop() // the run's lease went with the data
				held = <-done
			case "bound":
				held = h.life.EnsureCard(h.ctx, r)
				if !held.Card.Bound() {
					t.Fatalf("card not bound: %+v", held.Card)
				}
				forget()
			}
			h.life.Lose(h.ctx, held)
			h.cardsIdle()
			gone := *held
			gone.Status = approval.StatusLost
			if err := h.bot.Decided(h.ctx, &gone); err != nil {
				t.Fatal(err)
			}

			var cards []slacksim.Message
			for _, m := range h.ws.Messages(approvals) {
				if m.ThreadTS == "" && strings.Contains(string(m.Metadata), r.ID) {
					cards = append(cards, m)
				}
			}
			switch {
			case !tt.card && len(cards) != 0:
				t.Errorf("cards = %d, want none (none was posted)", len(cards))
			case tt.card && len(cards) != 1:
				t.Errorf("cards = %d, want the one posted, kept", len(cards))
			case tt.card:
				if text := allText(cards[0].Blocks); hasAction(cards[0].Blocks, "cs_approve") || !strings.Contains(text, "lost") {
					t.Errorf("card = %s, want lost, without buttons", text)
				}
			}
			for _, c := range h.ws.CallLog() {
				if c.Method == "chat.delete" && c.Params["channel"] == approvals {
					t.Errorf("chat.delete of %s in the approvals channel: a lost request's card stays", c.Params["ts"])
				}
			}
			n := 0
			for _, rep := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
				if strings.Contains(rep.Text, "was lost") && strings.Contains(rep.Text, "nothing ran") {
					n++
				}
			}
			if n != 1 {
				t.Errorf("thread lines about the loss = %d, want 1", n)
			}
			if got := len(h.audit.Records(approval.EventLost)); got != 1 {
				t.Errorf("lost audit entries = %d, want 1", got)
			}
		})
	}
}

// TestCardBindingRetried: a Redis blip while binding a just-posted card is
// retried with back-off and the card is bound; when binding never
// succeeds the card is deleted (it could never be decided nor redrawn),
// Post fails and the lifecycle cancels the request (fail closed), so no
// card is left that lies.
func TestCardBindingRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fails  int
		bound  bool
		sleeps []time.Duration
	}{
		{"blip", 2, true, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}},
		{"down", 1000, false, []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
			r := h.newPending()
			h.requests.mu.Lock()
			h.requests.bindFails = tc.fails
			h.requests.mu.Unlock()
			before := len(h.clock.Slept())
			cur := h.life.EnsureCard(h.ctx, h.load(r.ID))
			if slept := h.clock.Slept()[before:]; fmt.Sprint(slept) != fmt.Sprint(tc.sleeps) {
				t.Errorf("back-off sleeps = %v, want %v", slept, tc.sleeps)
			}
			cards := cardsOf(h, r.ID)
			if tc.bound {
				if len(cards) != 1 || cur.Card.TS != cards[0].TS || cur.Status != approval.StatusPending {
					t.Fatalf("after a blip: %d cards, request %s bound to %q; want one card, bound, pending", len(cards), cur.Status, cur.Card.TS)
				}
				return
			}
			if len(cards) != 0 {
				t.Errorf("cards left = %d, want the unbindable card deleted", len(cards))
			}
			if cur.Status != approval.StatusCancelled {
				t.Errorf("request = %s, want cancelled (fail closed)", cur.Status)
			}
		})
	}
}

// TestCardSettleJoinsRedraws: with CardSettle, the redraws asked while a
// card's first redraw settles (the approval, the claim, the outcome) make
// one chat.update, which shows the latest state.
func TestCardSettleJoinsRedraws(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, noSocket: true})
	r := h.request(nil)
	h.cardsIdle()
	settling := make(chan time.Duration, 1)
	release := make(chan struct{})
	b := h.newBot(func(o *bot.Options) {
		o.CardSettle = time.Second
		o.Sleep = func(ctx context.Context, d time.Duration) error {
			settling <- d
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	before := h.ws.Calls("chat.update")

	b.Refresh(r)
	select {
	case d := <-settling:
		if d != time.Second {
			t.Fatalf("settle = %v, want 1s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the redraw never settled")
	}
	after, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: bob, Digest: r.Digest, At: h.clock.Now()}, approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	b.Refresh(after)
	claimed, err := h.store.Claim(h.ctx, r.ID, "agent-1", "", "")
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	b.Refresh(claimed)
	done, err := h.store.Finish(h.ctx, r.ID, approval.StatusExecuted, `{"status":"refunded"}`)
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	b.Refresh(done)
	close(release)
	select {
	case <-b.CardsIdle():
	case <-time.After(10 * time.Second):
		t.Fatal("card writer still busy after 10s")
	}
	if got := h.ws.Calls("chat.update") - before; got != 1 {
		t.Errorf("chat.update calls = %d, want 1 for the four redraws asked while settling", got)
	}
	if blocks := string(h.card(r).Blocks); hasAction(h.card(r).Blocks, "cs_approve") || !strings.Contains(blocks, "refunded") {
		t.Errorf("card = %s, want the executed state with its result", blocks)
	}
}
