package slacksim_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"
	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
)

// socketApp runs a real socketmode.Client against ws until the test ends.
// handle is called for every Socket Mode event in the client's goroutine.
func socketApp(t *testing.T, api *slack.Client, handle func(*socketmode.Client, socketmode.Event)) {
	t.Helper()
	client := socketmode.New(api)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	handleDone := make(chan struct{})
	go func() { // exits when ctx is cancelled
		defer close(runDone)
		_ = client.RunContext(ctx)
	}()
	go func() { // exits when ctx is cancelled
		defer close(handleDone)
		for {
			select {
			case evt := <-client.Events:
				handle(client, evt)
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-runDone
		<-handleDone
	})
}

func TestSocketModeEventsAndAck(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{PingInterval: 50 * time.Millisecond})
	mentions := make(chan *slackevents.AppMentionEvent, 4)
	ims := make(chan *slackevents.MessageEvent, 4)
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		if evt.Type != socketmode.EventTypeEventsAPI {
			return
		}
		c.Ack(*evt.Request)
		ev := evt.Data.(slackevents.EventsAPIEvent)
		switch inner := ev.InnerEvent.Data.(type) {
		case *slackevents.AppMentionEvent:
			mentions <- inner
		case *slackevents.MessageEvent:
			ims <- inner
		}
	})

	// Posting before the app connects queues the envelope until it does.
	ts, err := ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> please refund 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-mentions:
		if m.User != alice || m.Channel != tasks || m.TimeStamp != ts || m.Text != "<@"+slacksim.BotUserID+"> please refund 1234" {
			t.Errorf("app_mention = %+v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no app_mention within 5s")
	}
	waitFor(t, ws, "the envelope ack", func() bool {
		es := ws.Envelopes()
		return len(es) == 1 && es[0].Acked
	})

	dm := ws.DM(bob)
	if _, err := ws.PostMessage(bob, dm, "hello bot", ""); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ims:
		if m.ChannelType != "im" || m.User != bob || m.Channel != dm || m.BotID != "" {
			t.Errorf("message.im = %+v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message.im within 5s")
	}

	// The bot's own DM message is delivered too, marked with bot_id, and
	// editing it sends a message_changed.
	_, botTS, err := api.PostMessage(dm, slack.MsgOptionText("hi bob", false))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ims:
		if m.BotID != slacksim.BotID || m.User != slacksim.BotUserID {
			t.Errorf("bot's own message.im = %+v, want bot_id %s", m, slacksim.BotID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message.im for the bot's own message within 5s")
	}
	if _, _, _, err := api.UpdateMessage(dm, botTS, slack.MsgOptionText("hi Bob", false)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ims:
		if m.SubType != "message_changed" || m.Message == nil || m.Message.Text != "hi Bob" || m.PreviousMessage == nil || m.PreviousMessage.Text != "hi bob" {
			t.Errorf("after chat.update got %+v, want message_changed", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message_changed within 5s")
	}
}

func TestSocketModeReconnectAndRetry(t *testing.T) {
	clk := clocktest.New(clocktest.Opts{Start: time.Now()})
	ws, api := mustWorkspace(t, slacksim.Options{Now: clk.Now})
	attempts := make(chan int, 8)
	ackNow := make(chan bool, 8)
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		if evt.Type != socketmode.EventTypeEventsAPI {
			return
		}
		attempts <- evt.Request.RetryAttempt
		if <-ackNow {
			c.Ack(*evt.Request)
		}
	})
	waitFor(t, ws, "a connection", func() bool { return ws.Connections() == 1 })

	ws.RequestReconnect()
	waitFor(t, ws, "a reconnection", func() bool { return ws.Calls("apps.connections.open") >= 2 && ws.Connections() >= 1 })

	ackNow <- false // first delivery is not acked
	if _, err := ws.PostMessage(alice, tasks, "<@"+slacksim.BotUserID+"> hi", ""); err != nil {
		t.Fatal(err)
	}
	if got := <-attempts; got != 0 {
		t.Errorf("first delivery retry_attempt = %d, want 0", got)
	}
	if n := ws.RetryUnacked(); n != 0 {
		t.Errorf("RetryUnacked() before 3s = %d, want 0", n)
	}
	clk.Advance(3 * time.Second)
	ackNow <- true
	if n := ws.RetryUnacked(); n != 1 {
		t.Fatalf("RetryUnacked() after 3s = %d, want 1", n)
	}
	if got := <-attempts; got != 1 {
		t.Errorf("retry retry_attempt = %d, want 1", got)
	}
	waitFor(t, ws, "the retry's ack", func() bool {
		for _, e := range ws.Envelopes() {
			if e.RetryAttempt == 1 && e.Acked {
				return true
			}
		}
		return false
	})
	clk.Advance(3 * time.Second)
	if n := ws.RetryUnacked(); n != 0 {
		t.Errorf("RetryUnacked() after ack = %d, want 0", n)
	}

	ev := ws.Events()[0]
	ackNow <- true
	if err := ws.RedeliverEvent(ev["event_ts"].(string)); err == nil {
		t.Error("RedeliverEvent(not an event id) error = nil")
	}
	var eventID string
	for _, e := range ws.Envelopes() {
		eventID = e.EventID
	}
	if err := ws.RedeliverEvent(eventID); err != nil {
		t.Fatalf("RedeliverEvent() error = %v", err)
	}
	if got := <-attempts; got != 2 {
		t.Errorf("redelivery retry_attempt = %d, want 2", got)
	}
}

func TestSocketModeViewSubmissionErrors(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		if evt.Type != socketmode.EventTypeInteractive {
			return
		}
		cb := evt.Data.(slack.InteractionCallback)
		switch cb.Type {
		case slack.InteractionTypeBlockActions:
			c.Ack(*evt.Request)
			if _, err := api.OpenView(cb.TriggerID, rejectModal()); err != nil {
				t.Errorf("OpenView() error = %v", err)
			}
		case slack.InteractionTypeViewSubmission:
			reason := cb.View.State.Values["reason"]["reason_input"].Value
			if len(reason) < 5 {
				c.Ack(*evt.Request, slack.NewErrorsViewSubmissionResponse(map[string]string{"reason": "Give a longer reason."}))
				return
			}
			c.Ack(*evt.Request)
		}
	})
	ts := mustCard(t, api)
	if err := ws.Click(bob, approvals, ts, "reject"); err != nil {
		t.Fatalf("Click() error = %v", err)
	}
	waitFor(t, ws, "the modal", func() bool { return len(ws.OpenViews(bob)) == 1 })
	view := ws.OpenViews(bob)[0]
	if view.Title != "Reject" || view.CallbackID != "reject_modal" {
		t.Errorf("open view = %+v", view)
	}
	res, err := ws.SubmitView(bob, view.ID, map[string]map[string]any{"reason": {"reason_input": "no"}})
	if err != nil {
		t.Fatalf("SubmitView() error = %v", err)
	}
	if res.ResponseAction != "errors" || res.Errors["reason"] != "Give a longer reason." || res.Closed {
		t.Errorf("SubmitView(short) = %+v, want reason error", res)
	}
	if got := ws.OpenViews(bob); len(got) != 1 || got[0].Errors["reason"] == "" {
		t.Errorf("after errors OpenViews() = %+v, want the modal with its error", got)
	}
	res, err = ws.SubmitView(bob, view.ID, map[string]map[string]any{"reason": {"reason_input": "amount looks wrong"}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView(long) = %+v, %v, want closed", res, err)
	}
	if got := ws.OpenViews(bob); len(got) != 0 {
		t.Errorf("after submit OpenViews() = %+v, want none", got)
	}
}

// mustCard posts an approval card to the approvals channel and returns its ts.
func mustCard(t *testing.T, api *slack.Client) string {
	t.Helper()
	plain := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
	}
	_, ts, err := api.PostMessage(approvals,
		slack.MsgOptionText("Refund $64 for order 1234?", false),
		slack.MsgOptionBlocks(
			slack.NewSectionBlock(slack.NewTextBlockObject(slack.MarkdownType, "*Refund* $64 for order `1234`", false, false), nil, nil),
			slack.NewActionBlock("decide",
				slack.NewButtonBlockElement("approve", "req-1", plain("Approve")).WithStyle(slack.StylePrimary),
				slack.NewButtonBlockElement("reject", "req-1", plain("Reject")).WithStyle(slack.StyleDanger),
			),
		))
	if err != nil {
		t.Fatalf("post card: %v", err)
	}
	return ts
}

func rejectModal() slack.ModalViewRequest {
	plain := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
	}
	input := slack.NewInputBlock("reason", plain("Reason"), nil,
		slack.NewPlainTextInputBlockElement(plain("Why?"), "reason_input").WithMultiline(true))
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		Title:           plain("Reject"),
		Submit:          plain("Reject"),
		Close:           plain("Cancel"),
		CallbackID:      "reject_modal",
		PrivateMetadata: "req-1",
		Blocks:          slack.Blocks{BlockSet: []slack.Block{input}},
	}
}

func TestSocketModeConnectionLimitAndHello(t *testing.T) {
	ws, api := mustWorkspace(t, slacksim.Options{})
	for i := range 10 {
		_, url, err := api.StartSocketModeContext(context.Background())
		if err != nil {
			t.Fatalf("connection %d: apps.connections.open error = %v", i, err)
		}
		conn, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatalf("connection %d: dial error = %v", i, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		var hello socketmode.Request
		if err := conn.ReadJSON(&hello); err != nil || hello.Type != "hello" {
			t.Fatalf("connection %d: first message = %+v, %v, want hello", i, hello, err)
		}
		if _, _, err := websocket.DefaultDialer.Dial(url, nil); err == nil {
			t.Fatalf("connection %d: reusing the ticket succeeded", i)
		}
	}
	waitFor(t, ws, "10 connections", func() bool { return ws.Connections() == 10 })
	if _, _, err := api.StartSocketModeContext(context.Background()); err == nil || err.Error() != "too_many_websockets" {
		t.Errorf("11th apps.connections.open error = %v, want too_many_websockets", err)
	}
}
