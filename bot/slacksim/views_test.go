package slacksim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
)

func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

// editModal has one input of each type the bot's Edit modal uses.
func editModal() slack.ModalViewRequest {
	opts := []*slack.OptionBlockObject{
		slack.NewOptionBlockObject("usd", plain("USD"), nil),
		slack.NewOptionBlockObject("eur", plain("EUR"), nil),
	}
	checks := []*slack.OptionBlockObject{
		slack.NewOptionBlockObject("notify", plain("Notify customer"), nil),
		slack.NewOptionBlockObject("restock", plain("Restock"), nil),
	}
	return slack.ModalViewRequest{
		Type:       slack.VTModal,
		Title:      plain("Edit refund"),
		Submit:     plain("Save"),
		Close:      plain("Cancel"),
		CallbackID: "edit_modal",
		Blocks: slack.Blocks{BlockSet: []slack.Block{
			slack.NewInputBlock("amount", plain("Amount"), nil, slack.NewNumberInputBlockElement(nil, "amount_input", true).WithInitialValue("64")),
			slack.NewInputBlock("currency", plain("Currency"), nil, slack.NewOptionsSelectBlockElement(slack.OptTypeStatic, nil, "currency_input", opts...)),
			slack.NewInputBlock("flags", plain("Flags"), nil, slack.NewCheckboxGroupsBlockElement("flags_input", checks...)).WithOptional(true),
			slack.NewInputBlock("email", plain("Email"), nil, slack.NewEmailTextInputBlockElement(nil, "email_input")),
		}},
	}
}

func TestViewsTypedValuesPushUpdatePublish(t *testing.T) {
	app := newHTTPApp(t)
	ws, api := mustWorkspace(t, app.options(secret))
	ts := mustCard(t, api)
	if err := ws.Click(bob, approvals, ts, "approve"); err != nil {
		t.Fatal(err)
	}
	trigger := interaction(t, app.next(t)).TriggerID
	view, err := api.OpenView(trigger, editModal())
	if err != nil {
		t.Fatalf("OpenView() error = %v", err)
	}
	if view.View.State == nil || view.View.State.Values["amount"]["amount_input"].Value != "64" {
		t.Errorf("opened view state = %+v, want the initial amount", view.View.State)
	}

	// views.update by ID changes the open modal in place.
	updated := editModal()
	updated.Title = plain("Edit refund (2)")
	if _, err := api.UpdateView(updated, "", "", view.ID); err != nil {
		t.Fatalf("UpdateView() error = %v", err)
	}
	if got := ws.OpenViews(bob); len(got) != 1 || got[0].Title != "Edit refund (2)" {
		t.Errorf("after update OpenViews() = %+v", got)
	}
	if _, err := api.UpdateView(updated, "", "stale-hash", view.ID); err == nil || err.Error() != "hash_conflict" {
		t.Errorf("UpdateView(stale hash) error = %v, want hash_conflict", err)
	}

	app.setAnswer(func(d delivered) (int, string) {
		return 200, `{"response_action":"push","view":{"type":"modal","title":{"type":"plain_text","text":"Confirm"},"blocks":[{"type":"section","text":{"type":"mrkdwn","text":"Sure?"}}]}}`
	})
	res, err := ws.SubmitView(bob, view.ID, map[string]map[string]any{
		"amount":   {"amount_input": "60"},
		"currency": {"currency_input": "eur"},
		"flags":    {"flags_input": []string{"notify"}},
		"email":    {"email_input": "a@example.com"},
	})
	if err != nil || res.ResponseAction != "push" {
		t.Fatalf("SubmitView() = %+v, %v", res, err)
	}
	sub := interaction(t, app.next(t))
	vals := sub.View.State.Values
	if vals["amount"]["amount_input"].Value != "60" ||
		vals["currency"]["currency_input"].SelectedOption.Value != "eur" ||
		len(vals["flags"]["flags_input"].SelectedOptions) != 1 || vals["flags"]["flags_input"].SelectedOptions[0].Value != "notify" ||
		vals["email"]["email_input"].Value != "a@example.com" {
		t.Errorf("submitted values = %+v", vals)
	}
	stack := ws.OpenViews(bob)
	if len(stack) != 2 || stack[1].Title != "Confirm" || stack[1].PreviousViewID != view.ID {
		t.Fatalf("after push OpenViews() = %+v", stack)
	}
	if err := ws.CloseView(bob, stack[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := ws.OpenViews(bob); len(got) != 0 {
		t.Errorf("after closing the root OpenViews() = %+v, want none", got)
	}

	// views.publish sets the App Home; OpenHome delivers app_home_opened.
	home := slack.HomeTabViewRequest{Type: slack.VTHomeTab, Blocks: slack.Blocks{BlockSet: []slack.Block{
		slack.NewHeaderBlock(plain("Your pending approvals")),
	}}}
	if _, err := api.PublishView(bob, home, ""); err != nil {
		t.Fatalf("PublishView() error = %v", err)
	}
	if h, ok := ws.Home(bob); !ok || !strings.Contains(string(h.Blocks), "Your pending approvals") {
		t.Errorf("Home(bob) = %+v, %v", h, ok)
	}
	ws.OpenHome(bob)
	if d := app.next(t); !strings.Contains(string(d.Body), `"app_home_opened"`) || !strings.Contains(string(d.Body), "Your pending approvals") {
		t.Errorf("app_home_opened body = %s", d.Body)
	}
}

func TestViewLimits(t *testing.T) {
	app := newHTTPApp(t)
	ws, api := mustWorkspace(t, app.options(secret))
	ts := mustCard(t, api)
	tests := []struct {
		name   string
		modify func(*slack.ModalViewRequest)
		hint   string
	}{
		{"title 25", func(v *slack.ModalViewRequest) { v.Title = plain(strings.Repeat("t", 25)) }, "/view/title/text"},
		{"submit 25", func(v *slack.ModalViewRequest) { v.Submit = plain(strings.Repeat("s", 25)) }, "/view/submit/text"},
		{"private_metadata 3001", func(v *slack.ModalViewRequest) { v.PrivateMetadata = strings.Repeat("m", 3001) }, "/view/private_metadata"},
		{"input label 2001", func(v *slack.ModalViewRequest) {
			v.Blocks.BlockSet = []slack.Block{slack.NewInputBlock("x", plain(strings.Repeat("l", 2001)), nil, slack.NewPlainTextInputBlockElement(nil, "y"))}
		}, "/view/blocks/0/label/text"},
		{"initial_value 3001", func(v *slack.ModalViewRequest) {
			v.Blocks.BlockSet = []slack.Block{slack.NewInputBlock("x", plain("l"), nil, slack.NewPlainTextInputBlockElement(nil, "y").WithInitialValue(strings.Repeat("i", 3001)))}
		}, "/view/blocks/0/element/initial_value"},
		{"placeholder 151", func(v *slack.ModalViewRequest) {
			v.Blocks.BlockSet = []slack.Block{slack.NewInputBlock("x", plain("l"), nil, slack.NewPlainTextInputBlockElement(plain(strings.Repeat("p", 151)), "y"))}
		}, "/view/blocks/0/element/placeholder/text"},
		{"101 blocks", func(v *slack.ModalViewRequest) {
			var bs []slack.Block
			for range 101 {
				bs = append(bs, slack.NewDividerBlock())
			}
			v.Blocks.BlockSet = bs
		}, "must be less than 101 items"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := ws.Click(bob, approvals, ts, "reject"); err != nil {
				t.Fatal(err)
			}
			trigger := interaction(t, app.next(t)).TriggerID
			v := rejectModal()
			tt.modify(&v)
			_, err := api.OpenView(trigger, v)
			var serr slack.SlackErrorResponse
			if !errors.As(err, &serr) || serr.Err != "invalid_arguments" || !strings.Contains(strings.Join(serr.ResponseMetadata.Messages, " "), tt.hint) {
				t.Errorf("OpenView() error = %v (%v), want invalid_arguments naming %s", err, serr.ResponseMetadata.Messages, tt.hint)
			}
		})
	}
}

func TestSubmitViewClientSideChecks(t *testing.T) {
	app := newHTTPApp(t)
	ws, api := mustWorkspace(t, app.options(secret))
	ts := mustCard(t, api)
	if err := ws.Click(bob, approvals, ts, "approve"); err != nil {
		t.Fatal(err)
	}
	view, err := api.OpenView(interaction(t, app.next(t)).TriggerID, editModal())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		values map[string]map[string]any
		want   map[string]string
	}{
		{"missing required", map[string]map[string]any{"email": {"email_input": "a@example.com"}}, map[string]string{"currency": "Please complete this required field."}},
		{"not a number", map[string]map[string]any{"amount": {"amount_input": "6x"}, "currency": {"currency_input": "usd"}, "email": {"email_input": "a@example.com"}}, map[string]string{"amount": "Please enter a number."}},
		{"bad email", map[string]map[string]any{"currency": {"currency_input": "usd"}, "email": {"email_input": "nope"}}, map[string]string{"email": "Please enter a valid email address."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := ws.SubmitView(bob, view.ID, tt.values)
			if err != nil || res.ResponseAction != "errors" || len(res.Errors) != len(tt.want) {
				t.Fatalf("SubmitView() = %+v, %v, want errors %v", res, err, tt.want)
			}
			for k, v := range tt.want {
				if res.Errors[k] != v {
					t.Errorf("SubmitView() error[%s] = %q, want %q", k, res.Errors[k], v)
				}
			}
		})
	}
	if _, err := ws.SubmitView(bob, view.ID, map[string]map[string]any{"nope": {"x": "1"}}); !errors.Is(err, slacksim.ErrNotFound) {
		t.Errorf("SubmitView(unknown input) error = %v, want ErrNotFound", err)
	}
	if got := ws.Calls("views.open"); got != 1 {
		t.Errorf("Calls(views.open) = %d, want 1", got)
	}
	select {
	case d := <-app.got:
		t.Errorf("a refused submission reached the app: %s", d.Body)
	default:
	}
}
