package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
)

// The steps of a lost request's race, as TestDemoLostRequestToldWhateverTheOrder
// plays them.
const (
	// stepLose: Redis forgets everything (a restart without persistence).
	stepLose = "lose"
	// stepClick: the approver's click on Approve, made on the card as it
	// first showed, reaches the process (at once, or late: the card may
	// have been redrawn since), and the approver is answered.
	stepClick = "click"
	// stepLease: the run's heartbeat ticks once and finds its lease gone
	// with the data: the run's context is cancelled (errRunLost).
	stepLease = "lease"
	// stepAnswer: Slack answers, at last, the chat.postMessage that put
	// the card up; then the run, unless its lease loss stopped it
	// already, goes on until it ends by itself.
	stepAnswer = "answer"
)

// TestDemoLostRequestToldWhateverTheOrder (issue 46, point 5): Redis
// loses its data while a card waits, and an approver then clicks. Whatever
// the order of the loss, the click, the run noticing that its lease went
// with the data, and Slack's answer to the card's post — the card may be
// on screen before Slack answers, and the loss may come in between — the
// card is never deleted: it says the request was lost and nothing ran, with
// no buttons; the task thread is told so exactly once; the loss is audited
// once; the click changes nothing; nothing runs.
//
// Before the fix a loss between the card's post and its binding deleted
// the card (bindPosted took the missing record for a card that could not
// be bound) and a loss noticed by the heartbeat during the post left the
// card with live buttons; in both the thread was never told (the run's
// copy of the request had no card bound, and Bot.Decided tells only a
// bound one), though the run logged that it was.
//
// Each order is driven by hand, never by timing: the card's post answer is
// held by the workspace (HoldAnswer), the agent's heartbeat ticks only when
// the test ticks it (Demo.AgentTicker), the loss is the test deleting
// every key. Orders where the lease step would follow the answer are the
// answer's orders: the run has ended by then. Every order is played 20
// times under CI (CI=true: .ci/run, the "20 of 20 runs"), 3 times
// otherwise (the README's test command stays quick), each on a fresh demo.
func TestDemoLostRequestToldWhateverTheOrder(t *testing.T) {
	t.Parallel()
	orders := []struct {
		held  bool // the loss comes while the card's post awaits Slack's answer (else: the card is bound, the run waits)
		steps []string
	}{
		{true, []string{stepLose, stepClick, stepLease, stepAnswer}},
		{true, []string{stepLose, stepLease, stepClick, stepAnswer}},
		{true, []string{stepLose, stepLease, stepAnswer, stepClick}},
		{true, []string{stepLose, stepClick, stepAnswer}},
		{true, []string{stepLose, stepAnswer, stepClick}},
		{false, []string{stepLose, stepClick, stepLease}},
		{false, []string{stepLose, stepLease, stepClick}},
	}
	rounds := 3
	if os.Getenv("CI") == "true" {
		rounds = 20
	}
	for round := range rounds {
		for _, o := range orders {
			stage := "bound"
			if o.held {
				stage = "held"
			}
			name := fmt.Sprintf("%s %s #%d", stage, strings.Join(o.steps, "-"), round+1)
			t.Run(name, func(t *testing.T) { playLostOrder(t, o.held, o.steps) })
		}
	}
}

// playLostOrder plays one order of TestDemoLostRequestToldWhateverTheOrder.
func playLostOrder(t *testing.T, held bool, steps []string) {
	ticks := &handTicks{}
	d := MustStartDemo(t, &main.Demo{World: demo.World{HTTPDelivery: true, Logger: slog.New(slog.DiscardHandler)},
		AgentTicker: ticks.ticker})
	ws, cast := d.Workspace, d.Cast
	// The first ticker is the adoption loop's (Main.Start); the run's
	// heartbeat is the next one.
	ticks.nth(t, 0)
	var release func()
	var taken <-chan struct{}
	if held {
		taken, release = ws.HoldAnswer("chat.postMessage", map[string]string{"channel": cast.Approvals.ID})
		t.Cleanup(release)
	}
	root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> refund $60 on order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	var card slacksim.Message
	if held {
		<-taken // on screen; the poster waits for Slack's answer
		cards := cardsFor(d, "issue_refund")
		if len(cards) != 1 {
			t.Fatalf("cards on screen = %d, want 1", len(cards))
		}
		card = cards[0]
	} else {
		waitWS(t, d, "the refund card bound", func() bool { _, ok := cardFor(d, "issue_refund"); return ok })
		card, _ = cardFor(d, "issue_refund")
	}
	v := buttonValue.FindStringSubmatch(string(card.Blocks))
	if v == nil {
		t.Fatalf("card without a request id: %s", card.Blocks)
	}
	id := v[1]
	heartbeat := ticks.nth(t, 1)

	for _, step := range steps {
		switch step {
		case stepLose:
			loseRedisData(t, d)
		case stepClick:
			// Delivered as Slack delivers it, signed, whether or not the
			// run has redrawn the card meanwhile (the run may notice the
			// loss by itself at any time after it): the order stays the
			// test's.
			clickAsShown(t, d, card, cast.Approver.ID, "cs_approve")
			waitWS(t, d, "the approver told the click changed nothing", func() bool {
				for _, m := range ws.Ephemerals(cast.Approver.ID) {
					if strings.Contains(m.Text, "no longer exists") {
						return true
					}
				}
				return false
			})
		case stepLease:
			heartbeat.tick(t)
			heartbeat.waitStopped(t, "the heartbeat to find its lease gone") // the run's context is cancelled
		case stepAnswer:
			release()
			heartbeat.waitStopped(t, "the run to end") // it ended by itself, or had been stopped by the lease step
		}
	}

	waitWS(t, d, "the card to say the request was lost", func() bool {
		m, ok := ws.Message(cast.Approvals.ID, card.TS)
		return ok && strings.Contains(string(m.Blocks), "Lost") && !strings.Contains(string(m.Blocks), "cs_approve")
	})
	waitBotReply(t, d, "the thread to be told", root, nil, "was lost", "nothing ran")
	// Every run and every redraw over: whatever was going to be said is.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Main.Agent.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Main.Bot.CardsIdle():
	case <-ctx.Done():
		t.Fatal("card writer still busy")
	}

	if m, ok := ws.Message(cast.Approvals.ID, card.TS); !ok || !strings.Contains(string(m.Blocks), "Lost") || strings.Contains(string(m.Blocks), "cs_approve") {
		t.Errorf("card at the end = %v %s, want it up, lost, without buttons", ok, m.Blocks)
	}
	told := 0
	for _, m := range ws.Replies(cast.Tasks.ID, root) {
		if m.BotID != "" && strings.Contains(m.Text, "was lost") {
			told++
		}
	}
	if told != 1 {
		t.Errorf("thread lines about the loss = %d, want 1", told)
	}
	for _, c := range ws.CallLog() {
		if c.Method == "chat.delete" && c.Params["channel"] == cast.Approvals.ID {
			t.Errorf("chat.delete in the approvals channel (ts %s): the card must stay", c.Params["ts"])
		}
	}
	entries, err := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream}).Range(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, e := range entries {
		if e.Event == approval.EventLost && e.RequestID == id {
			lost++
		}
	}
	if lost != 1 {
		t.Errorf("lost entries of %s = %d, want 1", id, lost)
	}
	if n := len(d.SoR.Refunds()); n != 0 {
		t.Errorf("refunds = %d, want none", n)
	}
}

// clickAsShown delivers to d, signed over HTTP as Slack does, user's
// click on the button actionID of card as it showed then: a click made on
// the card before any redraw, however late it arrives.
func clickAsShown(t *testing.T, d *main.Demo, card slacksim.Message, user, actionID string) {
	t.Helper()
	value := buttonOf(t, card.Blocks, actionID)
	payload := map[string]any{
		"type": "block_actions", "trigger_id": "1.2.3", "api_app_id": slacksim.AppID,
		"team": map[string]any{"id": slacksim.TeamID}, "user": map[string]any{"id": user, "team_id": slacksim.TeamID},
		"channel":   map[string]any{"id": card.Channel},
		"container": map[string]any{"type": "message", "channel_id": card.Channel, "message_ts": card.TS},
		"actions":   []map[string]any{{"action_id": actionID, "block_id": "actions", "value": value}},
	}
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(url.Values{"payload": {string(b)}}.Encode())
	if code := signedPost(t, d, "/slack/interactive", "application/x-www-form-urlencoded", body); code != http.StatusOK {
		t.Fatalf("POST /slack/interactive = %d, want 200", code)
	}
}

// buttonOf returns the value of the button actionID in Block Kit blocks.
func buttonOf(t *testing.T, blocks json.RawMessage, actionID string) string {
	t.Helper()
	var all []any
	if err := json.Unmarshal(blocks, &all); err != nil {
		t.Fatal(err)
	}
	var found string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["action_id"] == actionID {
				found, _ = x["value"].(string)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(all)
	if found == "" {
		t.Fatalf("no button %s on the card", actionID)
	}
	return found
}

// handTicks makes the agent's tickers (Demo.AgentTicker): each ticks only
// when the test ticks it, and tells when its owner stopped it.
type handTicks struct {
	mu      sync.Mutex // guards made and changed
	made    []*handTicker
	changed chan struct{} // closed at the next ticker made
}

// handTicker is one ticker handTicks made.
type handTicker struct {
	c       chan time.Time
	stopped chan struct{}
	once    sync.Once
}

func (h *handTicks) ticker(time.Duration) (<-chan time.Time, func()) {
	t := &handTicker{c: make(chan time.Time), stopped: make(chan struct{})}
	h.mu.Lock()
	h.made = append(h.made, t)
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
	h.mu.Unlock()
	return t.c, func() { t.once.Do(func() { close(t.stopped) }) }
}

// nth waits until the ticker numbered i (from 0, in the order made) exists
// and returns it.
func (h *handTicks) nth(tb testing.TB, i int) *handTicker {
	tb.Helper()
	deadline := time.After(30 * time.Second) // a hang guard, not a synchronisation
	for {
		h.mu.Lock()
		if len(h.made) > i {
			t := h.made[i]
			h.mu.Unlock()
			return t
		}
		if h.changed == nil {
			h.changed = make(chan struct{})
		}
		ch := h.changed
		h.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			tb.Fatalf("ticker %d never made", i)
		}
	}
}

// tick delivers one tick, taken by the ticker's owner (or none when the
// owner stopped it first).
func (t *handTicker) tick(tb testing.TB) {
	tb.Helper()
	select {
	case t.c <- time.Now():
	case <-t.stopped:
	case <-time.After(30 * time.Second): // a hang guard
		tb.Fatal("tick never taken")
	}
}

// waitStopped waits until the ticker's owner stopped it.
func (t *handTicker) waitStopped(tb testing.TB, what string) {
	tb.Helper()
	select {
	case <-t.stopped:
	case <-time.After(30 * time.Second): // a hang guard
		tb.Fatalf("timed out waiting for %s", what)
	}
}
