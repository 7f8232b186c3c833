package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
)

// Viewport of the browser, and so of the README screenshot.
const browserWidth, browserHeight = 1280, 900

// mustBrowser is the shared browser start-up (skips loudly without
// chromium, fails when CI=true) at the README screenshot's size.
func mustBrowser(t *testing.T) context.Context {
	t.Helper()
	return slacksimtest.Browser(t, browserWidth, browserHeight)
}

// saveScreenshot captures the page. With UPDATE_SCREENSHOT=1 it writes
// docs/<name> (the README's picture); otherwise a temporary file, so that
// a test run never dirties the tree.
func saveScreenshot(t *testing.T, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return fmt.Errorf("screenshot %s: %w", name, err)
		}
		dir := t.TempDir()
		if os.Getenv("UPDATE_SCREENSHOT") == "1" {
			dir = filepath.Join("..", "..", "docs")
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			return err
		}
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
		return nil
	})
}

// msgXPath selects the message with timestamp ts in the page's main list.
func msgXPath(ts string) string {
	return fmt.Sprintf(`//div[@data-testid="messages"]/div[@data-testid="message"][@data-ts=%q]`, ts)
}

// cardButton is the card button labelled label on the message ts.
func cardButton(ts, label string) chromedp.Search {
	return chromedp.Search(fmt.Sprintf(`%s//button[@data-testid="button"][normalize-space()=%q]`, msgXPath(ts), label))
}

// clickNow is slacksimtest.ClickNow.
var clickNow = slacksimtest.ClickNow

// modalField is the input block of the open modal labelled label (its
// control and its error line are inside).
func modalField(label string) string {
	return fmt.Sprintf(`//div[@data-testid="modal"]//div[contains(@class,"bk-input")][label[normalize-space()=%q]]`, label)
}

// retype replaces the text of an input as a person would: Ctrl+A, then
// type.
func retype(sel chromedp.Search, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Focus(sel),
		chromedp.KeyEvent("a", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.SendKeys(sel, text),
	)
}

// switchUser acts as the person whose name starts with initial, through
// the page's "Acting as" switcher: focus the select and type the initial,
// as a keyboard user would; the page reacts to the change event. A page
// refresh already in flight for the previous user can still win and put
// the old user back (app.js adopts the answer's "me"), so the switch is
// retried until the page has settled on the new user.
func switchUser(initial, id string) chromedp.Action[chromedp.Void] {
	sel := chromedp.CSS(`[data-testid="user-switcher"]`)
	settled := fmt.Sprintf(`document.querySelector('[data-testid="user-switcher"]').value === %q && location.search.includes(%q)`, id, "user="+id)
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		var err error
		for range 3 {
			if _, err = chromedp.Steps(chromedp.Focus(sel), chromedp.SendKeys(sel, initial))(ctx, tg); err != nil {
				return err
			}
			if _, err = chromedp.Poll[bool](settled, chromedp.WithPollingTimeout(3*time.Second))(ctx, tg); err == nil {
				return nil
			}
		}
		return fmt.Errorf("switch to %s: %w", id, err)
	})
}

// TestBrowserDemo is the acceptance test of the demo in a real browser, on
// the production wiring of `serve` (Socket Mode) with the local workspace:
// the requester types the seeds' scenario into #tasks; a second task asks
// for a delete that only the leads group may approve. As carol (approver
// and lead), through the page: approve the delete with one click; edit the
// email's subject, see the schema's field error in the modal, fix it and
// approve; reject the refund with a reason. The system of record and the
// task thread then say what happened, and the page shows it.
func TestBrowserDemo(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	ctx := mustBrowser(t)
	start := time.Now()
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	alice, carol := cast.Requester, cast.SecondApprover
	tasks, approvals := cast.Tasks.ID, cast.Approvals.ID
	base := d.URL()

	// The requester types the scenario into the composer.
	const task = "@countersign order 1234 arrived damaged — look it up, email an apology, refund the shipping"
	composer := chromedp.CSS(`[data-testid="composer-input"]`)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+alice.ID+"&channel="+tasks),
		chromedp.WaitVisible(composer),
		chromedp.SendKeys(composer, task+kb.Enter),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="messages"]//div[@data-testid="thread-link"]`)),
	); err != nil {
		t.Fatalf("alice posts the task: %v", err)
	}
	var root string
	for _, m := range ws.Messages(tasks) {
		if m.User == alice.ID && m.ThreadTS == "" {
			root = m.TS
			if want := "<@" + slacksim.BotUserID + ">" + strings.TrimPrefix(task, "@countersign"); m.Text != want {
				t.Errorf("posted task = %q, want %q", m.Text, want)
			}
		}
	}
	if root == "" {
		t.Fatalf("no task from alice in #tasks: %+v", ws.Messages(tasks))
	}

	// A second task, through the API: a delete only the leads may approve.
	if _, err := ws.PostMessage(alice.ID, tasks, "<@"+slacksim.BotUserID+"> please delete customer C-300", ""); err != nil {
		t.Fatalf("PostMessage(delete task): %v", err)
	}
	waitWS(t, d, "the email, refund and delete cards", func() bool {
		_, e := cardFor(d, "send_email")
		_, r := cardFor(d, "issue_refund")
		_, x := cardFor(d, "delete_customer")
		return e && r && x
	})
	email, _ := cardFor(d, "send_email")
	refund, _ := cardFor(d, "issue_refund")
	del, _ := cardFor(d, "delete_customer")
	if n := len(d.SoR.Emails()) + len(d.SoR.Refunds()) + len(d.SoR.Deleted()); n != 0 {
		t.Fatalf("before any decision: %d emails/refunds/deletes done, want 0", n)
	}

	// Switch to carol through the page and open #approvals: three pending
	// cards with their buttons.
	if err := chromedp.Do(ctx,
		switchUser("c", carol.ID),
		clickNow(`//*[@data-testid="channel-approvals"]`),
		chromedp.WaitVisible(cardButton(email.TS, "Edit")),
		chromedp.WaitVisible(cardButton(refund.TS, "Reject")),
		chromedp.WaitVisible(cardButton(del.TS, "Approve")),
	); err != nil {
		t.Fatalf("carol opens #approvals: %v", err)
	}
	t.Logf("cards pending in the page after %v", time.Since(start).Round(time.Millisecond))

	// The README's picture: the refund card (amounts in dollars, the rule's
	// reason, who may decide), pending, at the top of the list, with the
	// pointer parked on the header so nothing shows hover.
	scrollTo := fmt.Sprintf(`(document.querySelector('[data-testid="messages"] [data-ts=%q]').scrollIntoView({block: "start"}), true)`, refund.TS)
	if err := chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](scrollTo)(ctx, tg)
			return err
		}),
		chromedp.MouseEvent("mouseMoved", browserWidth-100, 20),
		saveScreenshot(t, "screenshot.png"),
	); err != nil {
		t.Fatalf("screenshot of the pending cards: %v", err)
	}

	// 1. Approve the delete (a high-risk tool): Slack's "are you sure?"
	// dialog comes first, naming what will run; accepting it approves.
	dialogs := make(chan string, 4)
	if err := chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs <- d.Message
			go func() { // not on the event goroutine: the call waits for its answer
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	}); err != nil {
		t.Fatalf("listen for dialogs: %v", err)
	}
	freshStepUp(t, d, carol.ID) // delete_customer asks a passkey (TestBrowserStepUp)
	if err := chromedp.Do(ctx,
		clickNow(string(cardButton(del.TS, "Approve"))),
		chromedp.WaitVisible(chromedp.Search(msgXPath(del.TS)+`//b[normalize-space()="Approved"]`)),
		chromedp.WaitNotPresent(cardButton(del.TS, "Approve")),
	); err != nil {
		t.Fatalf("approve the delete: %v", err)
	}
	select {
	case msg := <-dialogs:
		if !strings.Contains(msg, "Run delete_customer?") {
			t.Errorf("confirm dialog = %q, want it to name the tool", msg)
		}
	default:
		t.Errorf("approving the high-risk delete asked no confirmation")
	}

	// 2. Edit the email: "Hi" breaks the schema (minLength 3) and the modal
	// says so on the field; a real subject is accepted and the modal closes.
	subject := chromedp.Search(modalField("subject") + `//input`)
	subjectErr := chromedp.Search(modalField("subject") + `//div[@data-testid][contains(@class,"field-error")][normalize-space()!=""]`)
	const newSubject = "We're sorry about your table"
	if err := chromedp.Do(ctx,
		clickNow(string(cardButton(email.TS, "Edit"))),
		chromedp.WaitVisible(chromedp.Search(`//div[@data-testid="modal"]//h2[normalize-space()="Edit arguments"]`)),
		retype(subject, "Hi"),
		clickNow(`//*[@data-testid="modal-submit"]`),
		chromedp.WaitVisible(subjectErr),
	); err != nil {
		t.Fatalf("edit with a short subject: %v", err)
	}
	fieldErr, err := chromedp.Run(ctx, slacksimtest.TextNow(string(subjectErr)))
	if err != nil {
		t.Fatalf("read the field error: %v", err)
	}
	if !strings.Contains(fieldErr, "3") {
		t.Errorf("subject field error = %q, want it to name the minimum length 3", fieldErr)
	}
	if got := d.SoR.Emails(); len(got) != 0 {
		t.Fatalf("emails after a refused edit = %+v, want none", got)
	}
	if err := chromedp.Do(ctx,
		saveScreenshot(t, "screenshot-modal.png"),
		retype(subject, newSubject),
		clickNow(`//*[@data-testid="modal-submit"]`),
		chromedp.WaitNotPresent(chromedp.CSS(`[data-testid="modal"]`)),
		chromedp.WaitVisible(chromedp.Search(msgXPath(email.TS)+`//b[normalize-space()="Approved with edits"]`)),
	); err != nil {
		t.Fatalf("edit with a valid subject: %v", err)
	}

	// 3. Reject the refund with a reason.
	const reason = "Shipping was free on this order; nothing to refund."
	reasonInput := chromedp.CSS(`[data-testid="input-reason"]`)
	if err := chromedp.Do(ctx,
		clickNow(string(cardButton(refund.TS, "Reject"))),
		chromedp.WaitVisible(reasonInput),
		chromedp.SendKeys(reasonInput, reason),
		clickNow(`//*[@data-testid="modal-submit"]`),
		chromedp.WaitNotPresent(chromedp.CSS(`[data-testid="modal"]`)),
		chromedp.WaitVisible(chromedp.Search(msgXPath(refund.TS)+`//b[normalize-space()="Rejected"]`)),
		chromedp.WaitNotPresent(chromedp.Search(`//div[@data-testid="messages"]//button[@data-testid="button"][normalize-space()="Approve"]`)),
	); err != nil {
		t.Fatalf("reject the refund: %v", err)
	}

	// The system of record and the task thread say what happened: the
	// run's answer reports the edited email as sent and the refund as not
	// run; the refund's own line gives carol's reason, once in the thread.
	var answer string
	waitWS(t, d, "the run's answer in the task thread", func() bool {
		for _, m := range ws.Replies(tasks, root) {
			if m.BotID != "" && strings.Contains(m.Text, "send_email") && strings.Contains(m.Text, "issue_refund") && strings.Contains(m.Text, "Not run") {
				answer = m.Text
				return len(d.SoR.Emails()) == 1 && len(d.SoR.Deleted()) == 1
			}
		}
		return false
	})
	said := 0
	for _, m := range ws.Replies(tasks, root) {
		if m.BotID != "" {
			said += strings.Count(m.Text, reason)
		}
	}
	if said != 1 {
		t.Errorf("carol's reason is in the task thread %d times, want once", said)
	}
	if emails := d.SoR.Emails(); len(emails) != 1 || emails[0].Subject != newSubject || emails[0].To != "dana@example.com" {
		t.Errorf("emails sent = %+v, want one to dana@example.com with subject %q", emails, newSubject)
	}
	if rf := d.SoR.Refunds(); len(rf) != 0 {
		t.Errorf("refunds = %+v, want none (rejected)", rf)
	}
	if got := d.SoR.Deleted(); len(got) != 1 || got[0] != "C-300" {
		t.Errorf("deleted = %v, want [C-300]", got)
	}
	if !strings.Contains(answer, newSubject) || !strings.Contains(answer, "Not run") {
		t.Errorf("answer = %q, want the email sent with subject %q and the refund not run", answer, newSubject)
	}
	for _, c := range []struct{ ts, want string }{{email.TS, "*Approved with edits* by"}, {refund.TS, "*Rejected* by"}, {del.TS, "*Approved* by"}} {
		m, _ := ws.Message(approvals, c.ts)
		if b := string(m.Blocks); !strings.Contains(b, c.want) || !strings.Contains(b, carol.ID) || strings.Contains(b, `"cs_approve"`) {
			t.Errorf("card %s blocks = %s, want %q carol and no buttons", c.ts, b, c.want)
		}
	}

	// The page shows the final cards, and the requester sees the answer in
	// her thread.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/?user="+alice.ID+"&channel="+tasks+"&thread="+root),
		chromedp.WaitVisible(chromedp.Search(fmt.Sprintf(`//div[@data-testid="thread-messages"]//div[@data-testid="message"][contains(., %q)][contains(., %q)]`, "Not run", newSubject))),
		saveScreenshot(t, "screenshot-thread.png"),
	); err != nil {
		t.Fatalf("alice reads the answer: %v", err)
	}
	t.Logf("browser demo done in %v", time.Since(start).Round(time.Millisecond))
}
