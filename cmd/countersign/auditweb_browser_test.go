package main_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/store"
)

// The hostile texts of the browser test: if either were markup, the page
// would run script or load an image.
const (
	hostileScript = `<script>alert(1)</script>`
	hostileImg    = `<img src=x onerror=alert(1)>`
)

// TestBrowserAuditView opens the demo's audit view in Chromium on the
// history the product itself wrote (runDemoHistory: an auto-run lookup,
// an edited email, a rejected refund, a refused and then approved delete,
// an expired email), one more card left pending, and a request whose
// arguments and rejection reason are hostile markup, appended through
// store.Audit. It checks each page, that the filters narrow the history,
// and that the hostile text is shown as text: no script element, no
// image, no dialog. With UPDATE_SCREENSHOT=1 it writes
// docs/screenshot-audit-*.png.
func TestBrowserAuditView(t *testing.T) {
	t.Parallel() // a tab (in the shared browser) and a demo of its own
	clock := clocktest.New(clocktest.Opts{Start: time.Now().UTC()})
	d := startDemoClock(t, clock)
	h := runDemoHistory(t, d, clock)
	ws, cast := d.Workspace, d.Cast

	// One request left waiting, with a real card.
	clock.Advance(3 * time.Minute)
	if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 9012 is late, email the customer an apology", ""); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the pending email card", func() bool { return len(cardsFor(d, "send_email")) == 3 })
	pendingID := requestOfCard(t, cardsFor(d, "send_email")[2])
	waitAudit(t, d, pendingID, approval.EventCardPosted)
	// Review after: one call an approver runs at once (the charts' run_now),
	// one left in its 2m cancel window, pending until it runs at its deadline.
	if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> rush order 1234", ""); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the first rush card", func() bool { return len(cardsFor(d, "set_order_priority")) == 1 })
	rush := cardsFor(d, "set_order_priority")[0]
	waitAudit(t, d, requestOfCard(t, rush), approval.EventCardPosted)
	if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, rush.TS, "cs_run_now"); err != nil {
		t.Fatalf("Click(run now): %v", err)
	}
	waitAudit(t, d, requestOfCard(t, rush), approval.EventExecuted)
	if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> rush order 9012", ""); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the pending rush card", func() bool { return len(cardsFor(d, "set_order_priority")) == 2 })
	windowID := requestOfCard(t, cardsFor(d, "set_order_priority")[1])
	waitAudit(t, d, windowID, approval.EventCardPosted)
	clock.Advance(90 * time.Second)

	// A request with hostile arguments, written as the agent and bot write
	// theirs.
	hostileID := approval.NewID("req")
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream, Now: clock.Now})
	ctx := context.Background()
	for _, r := range []approval.Record{
		{Event: approval.EventRequested, RequestID: hostileID, RunID: "run_hostile", Actor: cast.Requester.ID, Tool: "send_email",
			Secret: []string{"api_key"},
			Data: map[string]any{"args": map[string]any{"to": "x@example.com", "subject": hostileScript, "body": hostileImg, "api_key": "sk-live-123"},
				"digest": "d1", "requester": cast.Requester.ID, "decisions": []string{"approve", "reject"}, "quorum": 1,
				"reason": hostileScript, "deadline": clock.Now().Add(time.Hour).Format(time.RFC3339)}},
		{Event: approval.EventDecided, RequestID: hostileID, RunID: "run_hostile", Actor: cast.Approver.ID, Tool: "send_email",
			Data: map[string]any{"verdict": "reject", "reason": hostileImg, "digest": "d1", "decision_ms": 12000}},
		// The second approver's passkey, vouched for by the first, and one
		// revoked, for the passkeys page.
		{Event: approval.EventPasskeyEnrolled, Actor: cast.SecondApprover.ID,
			Data: approval.PasskeyEvent{User: cast.SecondApprover.ID, Credential: "browserKEY1xxxxxxxxx", VouchedBy: cast.Approver.ID}},
		{Event: approval.EventPasskeyEnrolled, Actor: cast.SecondApprover.ID,
			Data: approval.PasskeyEvent{User: cast.SecondApprover.ID, Credential: "browserKEY2yyyyyyyyy", Email: hostileScript}},
		{Event: approval.EventPasskeyRevoked, Actor: cast.SecondApprover.ID,
			Data: approval.PasskeyEvent{User: cast.SecondApprover.ID, Credential: "browserKEY2yyyyyyyyy"}},
	} {
		if _, err := audit.Append(ctx, r); err != nil {
			t.Fatalf("Append(%s): %v", r.Event, err)
		}
	}

	base, user, pass := d.AuditURL()
	if base == "" {
		t.Fatal("the demo does not serve the audit view")
	}
	bctx := mustBrowser(t)
	var dialogs atomic.Int32
	if err := chromedp.Listen(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}); err != nil {
		t.Fatalf("listen for dialogs: %v", err)
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	if _, err := chromedp.Call(bctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enable network: %v", err)
	}
	if _, err := chromedp.Call(bctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatalf("set credentials: %v", err)
	}
	// texts returns the trimmed text of every element matching css.
	texts := func(css string) []string {
		t.Helper()
		js := fmt.Sprintf(`[...document.querySelectorAll(%q)].map(e => e.textContent.trim())`, css)
		out, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](js))
		if err != nil {
			t.Fatalf("read %s: %v", css, err)
		}
		return out
	}
	open := func(path, ready string) {
		t.Helper()
		if err := chromedp.Do(bctx, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS(ready))); err != nil {
			t.Fatalf("open %s (waiting for %s): %v", path, ready, err)
		}
	}
	shot := func(name string) {
		t.Helper()
		if err := chromedp.Do(bctx, saveScreenshot(t, name)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("pending", func(t *testing.T) {
		open("", "#pending")
		rows := texts("#pending tbody tr")
		row := func(id string) string {
			for _, r := range rows {
				if strings.Contains(r, id) {
					return r
				}
			}
			return ""
		}
		email, rush := row(pendingID), row(windowID)
		if len(rows) != 2 || !strings.Contains(email, "send_email") || !strings.Contains(email, "1m30s") || !strings.Contains(email, "open card") {
			t.Fatalf("pending rows = %q, want the email request, waiting 1m30s, with its card, and the rush in its window", rows)
		}
		// Each row says what its deadline does: the email is rejected,
		// the rush runs.
		if !strings.Contains(email, "then it is rejected") {
			t.Errorf("pending email row = %q, want its deadline to reject it", email)
		}
		if !strings.Contains(rush, "in 30s") || !strings.Contains(rush, "then it runs, unless an approver cancels it") || strings.Contains(rush, "rejected") {
			t.Errorf("pending rush row = %q, want it to run at its deadline in 30s, never said rejected", rush)
		}
		if lead := strings.Join(texts("main p.lead"), " "); strings.Contains(lead, "A deadline passing is a rejection") {
			t.Errorf("pending page says %q above a call that runs at its deadline", lead)
		}
		link, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS(`#pending a[rel="noreferrer"]`), "href"))
		if err != nil {
			t.Fatal(err)
		}
		if href := link.Value; !strings.HasPrefix(href, ws.BaseURL()+"/archives/"+cast.Approvals.ID+"/p") {
			t.Errorf("card link = %q, want the workspace's permalink", href)
		}
		shot("screenshot-audit-pending.png")
	})

	t.Run("history and filters", func(t *testing.T) {
		open("history", "#history")
		all := texts("#history tbody tr")
		if len(all) < 6 {
			t.Fatalf("history has %d rows, want the demo's decisions: %q", len(all), all)
		}
		shot("screenshot-audit-history.png")
		tests := []struct {
			name   string
			param  string // the form field
			value  string
			want   string // every row contains it
			wantID string // and one row is this request
		}{
			{"tool", "tool", "issue_refund", "issue_refund", h.refund},
			{"status", "status", "expired", "expired", h.expire},
			{"approver by name", "approver", cast.SecondApprover.RealName, cast.SecondApprover.RealName, h.del},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				open("history", "#filters")
				if err := chromedp.Do(bctx, chromedp.SetValue(chromedp.CSS(fmt.Sprintf(`#filters [name=%q]`, tt.param)), tt.value)); err != nil {
					t.Fatalf("set %s: %v", tt.param, err)
				}
				// RunResponse waits for the navigation the click starts.
				resp, err := chromedp.RunResponse(bctx, chromedp.Click(chromedp.CSS(`#filters button[type="submit"]`)))
				if err != nil || resp.Status != 200 {
					t.Fatalf("filter %s=%q: %v %v", tt.name, tt.value, resp, err)
				}
				if u, err := url.Parse(resp.URL); err != nil || u.Query().Get(tt.param) != tt.value {
					t.Fatalf("filter %s: page %s, want %s=%q in the address", tt.name, resp.URL, tt.param, tt.value)
				}
				rows := texts("#history tbody tr")
				if len(rows) == 0 || len(rows) >= len(all) {
					t.Fatalf("filter %s=%q gave %d of %d rows", tt.name, tt.value, len(rows), len(all))
				}
				found := false
				for _, r := range rows {
					if !strings.Contains(r, tt.want) {
						t.Errorf("filter %s=%q: row %q lacks %q", tt.name, tt.value, r, tt.want)
					}
					found = found || strings.Contains(r, tt.wantID)
				}
				if !found {
					t.Errorf("filter %s=%q: no row of request %s in %q", tt.name, tt.value, tt.wantID, rows)
				}
			})
		}
	})

	t.Run("hostile text is text", func(t *testing.T) {
		for _, path := range []string{"requests/" + hostileID, "history?status=rejected"} {
			open(path, "main")
			scripts, err1 := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("script").length`))
			images, err2 := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`))
			body, err3 := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
			if err := errors.Join(err1, err2, err3); err != nil {
				t.Fatal(err)
			}
			if scripts != 0 || images != 0 {
				t.Errorf("%s: %d script and %d img elements, want none", path, scripts, images)
			}
			if !strings.Contains(body, hostileImg) {
				t.Errorf("%s does not show %q as text:\n%s", path, hostileImg, body)
			}
			if strings.HasPrefix(path, "requests/") {
				if !strings.Contains(body, hostileScript) || !strings.Contains(body, "[redacted]") || strings.Contains(body, "sk-live-123") {
					t.Errorf("story shows the hostile subject as text and the api_key redacted? body:\n%s", body)
				}
			}
		}
		if n := dialogs.Load(); n != 0 {
			t.Errorf("%d JavaScript dialogs opened: a hostile argument ran", n)
		}
	})

	t.Run("story", func(t *testing.T) {
		open("requests/"+h.email, "#story")
		story := strings.Join(texts("#story tr"), "\n")
		for _, want := range []string{"outcome", "edited", "preview", "signal", "decision", "edit by", "execution", "executed", "timings", demoEmailSubject} {
			if !strings.Contains(story, want) {
				t.Errorf("story of the edited email lacks %q:\n%s", want, story)
			}
		}
		if len(texts("#entries tbody tr")) < 5 {
			t.Errorf("story lists fewer than 5 entries")
		}
		shot("screenshot-audit-story.png")
	})

	t.Run("charts", func(t *testing.T) {
		open("charts", "#chart-review")
		bars, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("svg.rates rect").length`))
		if err != nil {
			t.Fatal(err)
		}
		if bars < 4 {
			t.Errorf("charts draw %d rate bars, want the demo's tools and approvers", bars)
		}
		// The legends' items (run_now, window_elapsed among them) are laid
		// out side by side without running into each other.
		overlaps, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("ul.legend")].flatMap(ul => {
			const items = [...ul.querySelectorAll("li")].map(li => ({text: li.textContent, box: li.getBoundingClientRect(), fits: li.scrollWidth <= li.clientWidth + 1}));
			const out = items.filter(a => !a.fits).map(a => a.text + " is cut");
			items.forEach((a, i) => items.slice(i + 1).forEach(b => {
				if (a.box.left < b.box.right && b.box.left < a.box.right && a.box.top < b.box.bottom && b.box.top < a.box.bottom) out.push(a.text + " overlaps " + b.text);
			}));
			return out;
		})`))
		if err != nil {
			t.Fatal(err)
		}
		legend := texts("ul.legend li")
		if len(overlaps) > 0 || !slices.Contains(legend, "run_now") {
			t.Errorf("chart legends = %q: %q; want every outcome, run_now included, none overlapping", legend, overlaps)
		}
		shot("screenshot-audit-charts.png")
	})

	t.Run("passkeys", func(t *testing.T) {
		open("", "#pending")
		// Reached from the navigation, as a person would.
		if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`nav a[data-nav="passkeys"]`)), chromedp.WaitVisible(chromedp.CSS("#passkeys"))); err != nil {
			t.Fatalf("open passkeys from the navigation: %v", err)
		}
		rows := texts("#passkeys tbody tr")
		want := []string{cast.SecondApprover.RealName, "vouched for by " + cast.Approver.RealName, "revoked", "by themselves"}
		if len(rows) != 1 {
			t.Fatalf("passkeys rows = %q, want one for %s", rows, cast.SecondApprover.RealName)
		}
		for _, w := range want {
			if !strings.Contains(rows[0], w) {
				t.Errorf("passkeys row = %q, lacks %q", rows[0], w)
			}
		}
		if n := len(texts("#passkeys script")); n != 0 {
			t.Errorf("the passkeys page holds %d script elements from hostile text", n)
		}
		shot("screenshot-audit-passkeys.png")
	})

	t.Run("chain", func(t *testing.T) {
		open("chain", "#chain-result")
		got := strings.Join(texts("#chain-result"), " ")
		if !strings.Contains(got, "Intact.") {
			t.Errorf("chain result = %q, want intact", got)
		}
		if pill := strings.Join(texts("#chain-pill"), " "); !strings.Contains(pill, "chain intact") {
			t.Errorf("chain pill = %q", pill)
		}
		shot("screenshot-audit-chain.png")
	})
}
