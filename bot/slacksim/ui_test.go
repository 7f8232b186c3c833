package slacksim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slackevents"
	"github.com/slack-go/slack/socketmode"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

func uiPost(t *testing.T, ws *slacksim.Workspace, path string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(ws.BaseURL()+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUIPostEncodesMentionsAndEscapes(t *testing.T) {
	ws, _ := mustWorkspace(t, slacksim.Options{})
	res := uiPost(t, ws, "/ui/post", map[string]any{"user": alice, "channel": tasks, "text": "@countersign refund <b> & @bob"})
	if res["ok"] != true {
		t.Fatalf("/ui/post = %v", res)
	}
	msgs := ws.Messages(tasks)
	want := "<@" + slacksim.BotUserID + "> refund &lt;b&gt; &amp; <@" + bob + ">"
	if len(msgs) != 1 || msgs[0].Text != want {
		t.Errorf("posted text = %q, want %q", msgs[0].Text, want)
	}
	if res := uiPost(t, ws, "/ui/post", map[string]any{"user": carol, "channel": random, "text": "hi"}); res["ok"] != false {
		t.Errorf("/ui/post into a channel carol is not in = %v, want an error", res)
	}

	resp, err := http.Get(ws.BaseURL() + "/ui/state?user=" + alice + "&channel=" + tasks)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Me       string `json:"me"`
		Channels []struct {
			ID   string `json:"id"`
			IsIM bool   `json:"is_im"`
		} `json:"channels"`
		Messages []struct {
			Text string `json:"text"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range st.Channels {
		ids = append(ids, c.ID)
	}
	if st.Me != alice || len(st.Messages) != 1 || strings.Contains(strings.Join(ids, ","), approvals) || len(ids) != 3 {
		t.Errorf("/ui/state = %+v, want alice's view: tasks, random, her DM, not approvals", st)
	}
}

// approvalBot is a tiny app that behaves like Countersign's bot: a mention
// gets a threaded reply, an ephemeral note and an approval card; Reject
// opens a modal whose reason must be 5+ characters.
func approvalBot(t *testing.T, api *slack.Client) {
	plainText := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
	}
	md := func(s string) *slack.TextBlockObject {
		return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
	}
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		switch evt.Type {
		case socketmode.EventTypeEventsAPI:
			c.Ack(*evt.Request)
			ev := evt.Data.(slackevents.EventsAPIEvent)
			m, ok := ev.InnerEvent.Data.(*slackevents.AppMentionEvent)
			if !ok {
				return
			}
			_, _, _ = api.PostMessage(m.Channel, slack.MsgOptionTS(m.TimeStamp), slack.MsgOptionText("On it. Refunds need approval; I'll wait.", false))
			_, _ = api.PostEphemeral(m.Channel, m.User, slack.MsgOptionText("Only you can see this: request `req-1` created.", false))
			_, _, _ = api.PostMessage(approvals,
				slack.MsgOptionText("Approval needed: refund $64", false),
				slack.MsgOptionBlocks(
					slack.NewHeaderBlock(plainText("Refund needs approval")),
					slack.NewSectionBlock(md("*Refund* $64.00 for order `1234` &lt;vip&gt;\nRequested by <@"+m.User+">"), []*slack.TextBlockObject{
						md("*Tool*\nrefund"), md("*Risk*\n~low~ _medium_"),
					}, nil),
					slack.NewContextBlock("ctx", md("> Model's reason: customer says the parcel never arrived")),
					slack.NewDividerBlock(),
					slack.NewActionBlock("decide",
						slack.NewButtonBlockElement("approve", "req-1", plainText("Approve")).WithStyle(slack.StylePrimary),
						slack.NewButtonBlockElement("reject", "req-1", plainText("Reject")).WithStyle(slack.StyleDanger),
					),
				))
		case socketmode.EventTypeInteractive:
			cb := evt.Data.(slack.InteractionCallback)
			switch cb.Type {
			case slack.InteractionTypeBlockActions:
				c.Ack(*evt.Request)
				v := rejectModal()
				v.PrivateMetadata = cb.Container.ChannelID + "|" + cb.Container.MessageTs
				if _, err := api.OpenView(cb.TriggerID, v); err != nil {
					t.Errorf("OpenView() error = %v", err)
				}
			case slack.InteractionTypeViewSubmission:
				reason := cb.View.State.Values["reason"]["reason_input"].Value
				if len(reason) < 5 {
					c.Ack(*evt.Request, slack.NewErrorsViewSubmissionResponse(map[string]string{"reason": "Give a longer reason."}))
					return
				}
				c.Ack(*evt.Request)
				ch, ts, _ := strings.Cut(cb.View.PrivateMetadata, "|")
				_, _, _, _ = api.UpdateMessage(ch, ts, slack.MsgOptionText("Rejected", false), slack.MsgOptionBlocks(
					slack.NewSectionBlock(md(":x: *Rejected* by <@"+cb.User.ID+">: "+reason), nil, nil),
				))
			}
		}
	})
}

func TestBrowserApprovalFlow(t *testing.T) {
	t.Parallel() // a tab of its own in the shared browser: the two overlap
	ctx := slacksimtest.Browser(t, 1400, 860)
	ws, api := mustWorkspace(t, slacksim.Options{})
	approvalBot(t, api)

	base := ws.BaseURL()
	composer := chromedp.CSS(`[data-testid="composer-input"]`)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+alice+"&channel="+tasks),
		chromedp.WaitVisible(composer),
		chromedp.SendKeys(composer, "@countersign please refund order 1234"+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="thread-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="ephemeral-note"]`)),
	); err != nil {
		t.Fatalf("requester steps: %v", err)
	}
	if msgs := ws.Messages(tasks); len(msgs) != 1 || msgs[0].Text != "<@"+slacksim.BotUserID+"> please refund order 1234" {
		t.Fatalf("Messages(tasks) = %+v", msgs)
	}
	mention, err := chromedp.Run(ctx, slacksimtest.TextNow(`//*[@data-testid="message"]//*[contains(concat(" ", normalize-space(@class), " "), " mention ")]`))
	if err != nil || mention != "@countersign" {
		t.Errorf("rendered mention = %q, %v, want @countersign", mention, err)
	}

	const rejectXPath = `//div[@data-testid="message"][contains(., "Refund needs approval")]//button[normalize-space()="Reject"]`
	reject := chromedp.Search(rejectXPath)
	input := chromedp.CSS(`[data-testid="input-reason"]`)
	submit := chromedp.CSS(`[data-testid="modal-submit"]`)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+bob+"&channel="+approvals),
		chromedp.WaitVisible(reject),
		screenshot(t, "card.png"),
		slacksimtest.ClickNow(rejectXPath),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="modal"]`)),
		chromedp.SendKeys(input, "no"),
		chromedp.Click(submit),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="error-reason"][normalize-space()="Give a longer reason."]`)),
		screenshot(t, "modal.png"),
		chromedp.SetValue(input, "amount looks wrong"),
		chromedp.Click(submit),
		chromedp.WaitNotPresent(chromedp.CSS(`[data-testid="modal"]`)),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="message"][contains(., "Rejected")]`)),
	); err != nil {
		t.Fatalf("approver steps: %v", err)
	}
	text, err := chromedp.Run(ctx, slacksimtest.TextNow(`//div[@data-testid="message"][contains(., "Rejected")]`))
	if err != nil || !strings.Contains(text, "Rejected by @bob: amount looks wrong") {
		t.Errorf("card text = %q, %v", text, err)
	}

	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+alice+"&channel="+tasks+"&thread="+ws.Messages(tasks)[0].TS),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="thread-panel"]`)),
		screenshot(t, "thread.png"),
	); err != nil {
		t.Fatalf("thread view: %v", err)
	}
}

// screenshot saves the page to $SLACKSIM_SCREENSHOTS/name when that
// directory is set (for the README), and does nothing otherwise.
func screenshot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		dir := os.Getenv("SLACKSIM_SCREENSHOTS")
		if dir == "" {
			return chromedp.Void{}, nil
		}
		png, err := chromedp.CaptureScreenshot()(ctx, tg)
		if err != nil {
			return chromedp.Void{}, err
		}
		t.Logf("screenshot %s", filepath.Join(dir, name))
		return chromedp.Void{}, os.WriteFile(filepath.Join(dir, name), png, 0o644)
	}
}

func TestBrowserEditModalHomeAndThreadReply(t *testing.T) {
	t.Parallel() // a tab of its own in the shared browser: the two overlap
	ctx := slacksimtest.Browser(t, 1400, 860)
	ws, api := mustWorkspace(t, slacksim.Options{})
	submitted := make(chan map[string]map[string]slack.BlockAction, 1)
	socketApp(t, api, func(c *socketmode.Client, evt socketmode.Event) {
		switch evt.Type {
		case socketmode.EventTypeEventsAPI:
			c.Ack(*evt.Request)
			ev := evt.Data.(slackevents.EventsAPIEvent)
			if h, ok := ev.InnerEvent.Data.(*slackevents.AppHomeOpenedEvent); ok {
				home := slack.HomeTabViewRequest{Type: slack.VTHomeTab, Blocks: slack.Blocks{BlockSet: []slack.Block{
					slack.NewHeaderBlock(plain("Your pending approvals")),
					slack.NewActionBlock("home", slack.NewButtonBlockElement("refresh", "", plain("Refresh"))),
				}}}
				if _, err := api.PublishView(h.User, home, ""); err != nil {
					t.Errorf("PublishView() error = %v", err)
				}
			}
		case socketmode.EventTypeInteractive:
			c.Ack(*evt.Request)
			cb := evt.Data.(slack.InteractionCallback)
			switch {
			case cb.Type == slack.InteractionTypeBlockActions && cb.Container.Type == "view":
				_, _, _ = api.PostMessage(cb.User.ID, slack.MsgOptionText("Refreshed: nothing pending.", false))
			case cb.Type == slack.InteractionTypeBlockActions:
				if _, err := api.OpenView(cb.TriggerID, editModal()); err != nil {
					t.Errorf("OpenView() error = %v", err)
				}
			case cb.Type == slack.InteractionTypeViewSubmission:
				submitted <- cb.View.State.Values
			}
		}
	})
	ts := mustCard(t, api)
	base := ws.BaseURL()
	const approveXPath = `//div[@data-testid="message"]//button[normalize-space()="Approve"]`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+bob+"&channel="+approvals),
		slacksimtest.ClickNow(approveXPath),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="input-currency"]`)),
		chromedp.SetValue(chromedp.CSS(`[data-testid="input-amount"]`), "60"),
		chromedp.SetValue(chromedp.CSS(`[data-testid="input-currency"]`), "eur"),
		chromedp.Click(chromedp.CSS(`[data-testid="check-flags-notify"]`)),
		chromedp.SendKeys(chromedp.CSS(`[data-testid="input-email"]`), "a@example.com"),
		chromedp.Click(chromedp.CSS(`[data-testid="modal-submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`[data-testid="modal"]`)),
	); err != nil {
		t.Fatalf("edit modal steps: %v", err)
	}
	select {
	case v := <-submitted:
		if v["amount"]["amount_input"].Value != "60" || v["currency"]["currency_input"].SelectedOption.Value != "eur" ||
			len(v["flags"]["flags_input"].SelectedOptions) != 1 || v["email"]["email_input"].Value != "a@example.com" {
			t.Errorf("submitted values = %+v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no view_submission within 5s")
	}

	if err := chromedp.Do(ctx,
		slacksimtest.ClickNow(`//*[@data-testid="app-home"]`),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="home"]//div[normalize-space()="Your pending approvals"]`)),
		slacksimtest.ClickNow(`//div[@data-testid="home"]//button[normalize-space()="Refresh"]`),
	); err != nil {
		t.Fatalf("home steps: %v", err)
	}
	dm := ws.DM(bob)
	waitFor(t, ws, "the bot's DM", func() bool { return len(ws.Messages(dm)) == 1 })

	reply := chromedp.CSS(`[data-testid="thread-input"]`)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+bob+"&channel="+approvals+"&thread="+ts),
		chromedp.WaitVisible(reply),
		chromedp.SendKeys(reply, "looks fine to me"+kb.Enter),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="thread-messages"]//div[contains(@class,"msg-text")][normalize-space()="looks fine to me"]`)),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="thread-link"][contains(., "1 reply")]`)),
	); err != nil {
		t.Fatalf("thread steps: %v", err)
	}
	if r := ws.Replies(approvals, ts); len(r) != 1 || r[0].User != bob {
		t.Errorf("Replies() = %+v, want bob's reply", r)
	}
}
