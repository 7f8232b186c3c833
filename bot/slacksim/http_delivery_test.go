package slacksim_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"

	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
)

const secret = "8f742231b10e8888abcd99yyyzzz85a5"

// verify checks a delivery's signature with slack-go's verifier.
func verify(t *testing.T, d delivered) {
	t.Helper()
	sv, err := slack.NewSecretsVerifier(d.Header, secret)
	if err != nil {
		t.Fatalf("NewSecretsVerifier() error = %v", err)
	}
	if _, err := sv.Write(d.Body); err != nil {
		t.Fatal(err)
	}
	if err := sv.Ensure(); err != nil {
		t.Errorf("signature of %s does not verify: %v", d.Path, err)
	}
}

// interaction decodes an interactive delivery the way a handler would.
func interaction(t *testing.T, d delivered) slack.InteractionCallback {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/interactive", bytes.NewReader(d.Body))
	r.Header = d.Header
	cb, err := slack.InteractionCallbackParse(r)
	if err != nil {
		t.Fatalf("InteractionCallbackParse() error = %v", err)
	}
	return cb
}

func TestHTTPDeliverySignedEventsAndRetries(t *testing.T) {
	app := newHTTPApp(t)
	clk := clocktest.New(clocktest.Opts{Start: time.Now()})
	opts := app.options(secret)
	opts.Now = clk.Now
	ws, _ := mustWorkspace(t, opts)

	app.setAnswer(func(delivered) (int, string) { return http.StatusInternalServerError, "" })
	if _, err := ws.PostMessage(alice, tasks, "hey <@"+slacksim.BotUserID+">", ""); err != nil {
		t.Fatal(err)
	}
	d := app.next(t)
	if d.Path != "/events" || d.Header.Get("X-Slack-Retry-Num") != "" {
		t.Errorf("first delivery %s retry=%q", d.Path, d.Header.Get("X-Slack-Retry-Num"))
	}
	verify(t, d)
	ev, err := slackevents.ParseEvent(d.Body, slackevents.OptionNoVerifyToken())
	if err != nil {
		t.Fatalf("ParseEvent() error = %v", err)
	}
	outer := ev.Data.(*slackevents.EventsAPICallbackEvent)
	if _, ok := ev.InnerEvent.Data.(*slackevents.AppMentionEvent); !ok || outer.EventID == "" || outer.TeamID != slacksim.TeamID {
		t.Fatalf("event = %T %+v", ev.InnerEvent.Data, outer)
	}

	// A 500 is no ack: after 3 s (injected clock) Slack retries.
	app.setAnswer(nil)
	clk.Advance(3 * time.Second)
	if n := ws.RetryUnacked(); n != 1 {
		t.Fatalf("RetryUnacked() = %d, want 1", n)
	}
	retry := app.next(t)
	if retry.Header.Get("X-Slack-Retry-Num") != "1" || retry.Header.Get("X-Slack-Retry-Reason") == "" {
		t.Errorf("retry headers = %v", retry.Header)
	}
	verify(t, retry)
	var again slackevents.EventsAPICallbackEvent
	if err := json.Unmarshal(retry.Body, &again); err != nil || again.EventID != outer.EventID {
		t.Errorf("retry event_id = %q, want %q (%v)", again.EventID, outer.EventID, err)
	}

	if err := ws.RedeliverEvent(outer.EventID); err != nil {
		t.Fatal(err)
	}
	if got := app.next(t).Header.Get("X-Slack-Retry-Num"); got != "2" {
		t.Errorf("RedeliverEvent retry num = %q, want 2", got)
	}
}

func TestHTTPDeliveryClickOpensModalAndSubmit(t *testing.T) {
	app := newHTTPApp(t)
	clk := clocktest.New(clocktest.Opts{Start: time.Now()})
	opts := app.options(secret)
	opts.Now = clk.Now
	ws, api := mustWorkspace(t, opts)
	ts := mustCard(t, api)

	if err := ws.Click(bob, approvals, ts, "approve"); err != nil {
		t.Fatalf("Click() error = %v", err)
	}
	d := app.next(t)
	verify(t, d)
	cb := interaction(t, d)
	if cb.Type != slack.InteractionTypeBlockActions || cb.User.ID != bob || cb.Channel.ID != approvals ||
		cb.Container.MessageTs != ts || cb.Container.ChannelID != approvals || cb.Message.Timestamp != ts ||
		cb.APIAppID != slacksim.AppID || cb.TriggerID == "" || cb.ResponseURL == "" {
		t.Errorf("block_actions = %+v", cb)
	}
	if len(cb.ActionCallback.BlockActions) != 1 {
		t.Fatalf("actions = %+v", cb.ActionCallback)
	}
	act := cb.ActionCallback.BlockActions[0]
	if act.ActionID != "approve" || act.BlockID != "decide" || act.Value != "req-1" || act.Type != "button" {
		t.Errorf("action = %+v", act)
	}

	// A trigger older than 3 s is refused; a fresh one is single use.
	clk.Advance(3*time.Second + time.Millisecond)
	if _, err := api.OpenView(cb.TriggerID, rejectModal()); err == nil || err.Error() != "expired_trigger_id" {
		t.Errorf("OpenView(old trigger) error = %v, want expired_trigger_id", err)
	}
	if err := ws.Click(bob, approvals, ts, "reject"); err != nil {
		t.Fatal(err)
	}
	trigger := interaction(t, app.next(t)).TriggerID
	view, err := api.OpenView(trigger, rejectModal())
	if err != nil {
		t.Fatalf("OpenView() error = %v", err)
	}
	if _, err := api.OpenView(trigger, rejectModal()); err == nil {
		t.Error("OpenView(used trigger) error = nil, want exchanged_trigger_id")
	}
	if _, err := api.OpenView("nonsense", rejectModal()); err == nil || err.Error() != "invalid_trigger_id" {
		t.Errorf("OpenView(unknown trigger) error = %v, want invalid_trigger_id", err)
	}

	// The modal answer comes back in the HTTP response body.
	app.setAnswer(func(d delivered) (int, string) {
		if d.Path != "/interactive" {
			return http.StatusOK, ""
		}
		return http.StatusOK, `{"response_action":"errors","errors":{"reason":"Too short."}}`
	})
	res, err := ws.SubmitView(bob, view.ID, map[string]map[string]any{"reason": {"reason_input": "no"}})
	if err != nil || res.Errors["reason"] != "Too short." {
		t.Fatalf("SubmitView() = %+v, %v, want errors", res, err)
	}
	sub := interaction(t, app.next(t))
	if sub.Type != slack.InteractionTypeViewSubmission || sub.View.ID != view.ID || sub.View.CallbackID != "reject_modal" ||
		sub.View.PrivateMetadata != "req-1" || sub.View.State.Values["reason"]["reason_input"].Value != "no" {
		t.Errorf("view_submission = %+v", sub.View)
	}

	// Required inputs left empty are refused before reaching the app.
	res, err = ws.SubmitView(bob, view.ID, map[string]map[string]any{"reason": {"reason_input": ""}})
	if err != nil || res.Errors["reason"] == "" {
		t.Errorf("SubmitView(empty) = %+v, %v, want a required-field error", res, err)
	}
}

func TestHTTPSlashCommandAndResponseURL(t *testing.T) {
	app := newHTTPApp(t)
	ws, api := mustWorkspace(t, app.options(secret))
	app.setAnswer(func(d delivered) (int, string) {
		return http.StatusOK, `{"response_type":"ephemeral","text":"Working on it"}`
	})
	if err := ws.SlashCommand(alice, tasks, "/countersign", "status"); err != nil {
		t.Fatal(err)
	}
	d := app.next(t)
	verify(t, d)
	r := httptest.NewRequest(http.MethodPost, "/commands", bytes.NewReader(d.Body))
	r.Header = d.Header
	cmd, err := slack.SlashCommandParse(r)
	if err != nil || cmd.Command != "/countersign" || cmd.Text != "status" || cmd.UserID != alice || cmd.ChannelID != tasks {
		t.Fatalf("SlashCommandParse() = %+v, %v", cmd, err)
	}
	waitFor(t, ws, "the ephemeral reply", func() bool { return len(ws.Ephemerals(alice)) == 1 })

	// response_url with replace_original updates the card.
	app.setAnswer(nil)
	ts := mustCard(t, api)
	if err := ws.Click(bob, approvals, ts, "approve"); err != nil {
		t.Fatal(err)
	}
	cb := interaction(t, app.next(t))
	if _, _, err := api.PostMessage("", slack.MsgOptionReplaceOriginal(cb.ResponseURL), slack.MsgOptionText("Approved by bob", false)); err != nil {
		t.Fatalf("response_url replace error = %v", err)
	}
	if m, _ := ws.Message(approvals, ts); m.Text != "Approved by bob" {
		t.Errorf("card text = %q, want replaced", m.Text)
	}
}
