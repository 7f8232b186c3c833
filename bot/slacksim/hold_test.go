package slacksim_test

import (
	"context"
	"testing"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
)

// TestHoldAnswer: a held chat.postMessage takes effect at once (the
// message is on screen and in conversations.history) while its answer
// waits for release; a post in another channel is not held.
func TestHoldAnswer(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	ctx := context.Background()
	taken, release := ws.HoldAnswer("chat.postMessage", map[string]string{"channel": approvals})
	type answer struct {
		ts  string
		err error
	}
	done := make(chan answer, 1)
	go func() { // exits once the answer is released
		_, ts, err := api.PostMessageContext(ctx, approvals, slack.MsgOptionText("card", false))
		done <- answer{ts, err}
	}()
	if _, ts, err := api.PostMessageContext(ctx, tasks, slack.MsgOptionText("not held", false)); err != nil || ts == "" {
		t.Fatalf("post in another channel = %q, %v; want answered at once", ts, err)
	}
	<-taken
	msgs := ws.Messages(approvals)
	if len(msgs) != 1 || msgs[0].Text != "card" {
		t.Fatalf("approvals while the answer is held = %+v, want the card on screen", msgs)
	}
	hist, err := api.GetConversationHistoryContext(ctx, &slack.GetConversationHistoryParameters{ChannelID: approvals})
	if err != nil || len(hist.Messages) != 1 || hist.Messages[0].Timestamp != msgs[0].TS {
		t.Fatalf("conversations.history while the answer is held = %+v, %v; want the card", hist, err)
	}
	select {
	case a := <-done:
		t.Fatalf("answer arrived before release: %+v", a)
	default:
	}
	release()
	if a := <-done; a.err != nil || a.ts != msgs[0].TS {
		t.Fatalf("answer after release = %+v, want ts %s", a, msgs[0].TS)
	}
}
