package bot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// lockedBuffer is a bytes.Buffer safe for the bot's goroutines.
type lockedBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAPICallerRequestHasNoTaskThread: a request made through the HTTP API
// has no task thread (empty Origin). Its card says which API key asked (and
// for whom), shows the caller's facts apart from the system of record's,
// links no task thread; through its whole life (card posted, approved,
// redrawn final) nothing is posted outside the approvals channel and the
// bot logs no error about a missing thread.
func TestAPICallerRequestHasNoTaskThread(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, logger: slog.New(slog.NewTextHandler(&logs, nil))})
	before := map[string]int{}
	for _, c := range h.ws.Channels() {
		before[c.ID] = len(h.ws.Messages(c.ID))
	}
	r := &approval.Request{
		ID: approval.NewID("req"), RunID: "run-ext-7", CallID: "call-1", Requester: alice,
		Caller: approval.Caller{Kind: approval.CallerAPI, Name: "support-bot"},
		Tool:   "issue_refund", Risk: approval.RiskHigh,
		Args: json.RawMessage(`{"order_id":"1234","amount":64}`),
		Preview: approval.Preview{Facts: []approval.Fact{{Label: "Order total", Value: "$64.00"}},
			CallerFacts: []approval.Fact{{Label: "Customer says", Value: "arrived broken"}}},
		Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}, Quorum: 1,
		Created: h.clock.Now(), Deadline: h.clock.Now().Add(time.Hour), Status: approval.StatusPending,
	}
	created, err := h.life.Create(h.ctx, r)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !created.Card.Bound() {
		t.Fatalf("Create = %+v, want a bound card", created)
	}
	card := allText(h.card(created).Blocks)
	for _, want := range []string{"through the API by key `support-bot`", "on behalf of <@" + alice + ">",
		"Supplied by the caller", "Customer says", "Order total"} {
		if !strings.Contains(card, want) {
			t.Errorf("card does not say %q:\n%s", want, card)
		}
	}
	if strings.Contains(card, "task thread") {
		t.Errorf("card links a task thread it does not have:\n%s", card)
	}
	// The caller's facts come after the system of record's.
	if strings.Index(card, "Supplied by the caller") < strings.Index(card, "Order total") {
		t.Errorf("caller facts shown before the system of record's:\n%s", card)
	}

	if err := h.ws.Click(bob, approvals, created.Card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	h.waitStatus(r.ID, approval.StatusApproved)
	h.waitCardFinal(created)

	for _, c := range h.ws.Channels() {
		if c.ID == approvals {
			continue
		}
		if got := len(h.ws.Messages(c.ID)); got != before[c.ID] {
			t.Errorf("channel %s has %d messages, want %d: nothing is posted outside the approvals channel for an API request", c.Name, got, before[c.ID])
		}
	}
	if l := logs.String(); strings.Contains(l, "level=ERROR") {
		t.Errorf("bot logged errors for an API request:\n%s", l)
	}
}

// TestFailedSlackCallsLogAnHonestHint: a Slack call that fails is logged
// with a hint that says what happened. Slack's refusal names the channel;
// a call cut short by its context (the process stopping) is a warning
// that says so, not "Slack refused the call ()".
func TestFailedSlackCallsLogAnHonestHint(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, logger: slog.New(slog.NewTextHandler(&logs, nil))})

	if err := h.bot.Say(h.ctx, approval.Origin{Channel: "C0NOSUCH1", ThreadTS: "1.000001"}, "hello"); err == nil {
		t.Fatal("Say in a channel that does not exist succeeded")
	}
	refused := lastLine(logs.String())
	for _, want := range []string{"level=ERROR", "slack_error=channel_not_found", "C0NOSUCH1 does not exist"} {
		if !strings.Contains(refused, want) {
			t.Errorf("log of a refused call lacks %q:\n%s", want, refused)
		}
	}

	stopped, cancel := context.WithCancel(h.ctx)
	cancel()
	if err := h.bot.Say(stopped, approval.Origin{Channel: tasks, ThreadTS: "1.000001"}, "hello"); err == nil {
		t.Fatal("Say with a cancelled context succeeded")
	}
	cut := lastLine(logs.String())
	for _, want := range []string{"level=WARN", "cut short: the process is stopping"} {
		if !strings.Contains(cut, want) {
			t.Errorf("log of a cancelled call lacks %q:\n%s", want, cut)
		}
	}
	if strings.Contains(cut, "Slack refused") {
		t.Errorf("a cancelled call is logged as a refusal:\n%s", cut)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
