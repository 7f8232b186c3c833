package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/bot/slacksim"
)

// saveCard captures the message ts of the page, alone. With
// UPDATE_SCREENSHOT=1 it writes docs/<name>; otherwise a temporary file.
func saveCard(t *testing.T, ctx context.Context, ts, name string) {
	t.Helper()
	// The message list scrolls inside the page: bring the card to its top
	// first, or the picture is of what covers it.
	scroll := fmt.Sprintf(`(document.querySelector('[data-testid="messages"] [data-ts=%q]').scrollIntoView({block: "start"}), true)`, ts)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](scroll)); err != nil {
		t.Fatalf("scroll to %s: %v", name, err)
	}
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.Search(msgXPath(ts))))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := t.TempDir()
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		dir = filepath.Join("..", "..", "docs")
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// TestBrowserCardKinds takes a picture of a card of each kind the docs
// show, pending, as an approver sees it in the page: the destructive
// delete_customer (no system-of-record summary: the policy's description of
// what will happen, then the facts read), a review-after call in its
// cancel window, a call through the HTTP API, one through the MCP gateway
// (its upstream named), one through the HumanLayer endpoints (no model
// confidence asked of them), a question asked through them (a Respond
// card) and a coding agent's shell command as the Claude Code hook sends
// it (the command shown once, among the arguments). Each card is checked
// for what the pictures are meant to show.
func TestBrowserCardKinds(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	ctx := mustBrowser(t)
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	alice, carol := cast.Requester, cast.SecondApprover
	tasks, approvals := cast.Tasks.ID, cast.Approvals.ID
	for _, task := range []string{"please delete customer C-300", "please rush order 1234"} {
		if _, err := ws.PostMessage(alice.ID, tasks, "<@"+slacksim.BotUserID+"> "+task, ""); err != nil {
			t.Fatalf("PostMessage(%q): %v", task, err)
		}
	}
	c := apiClient(d)
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	no := false
	api, err := c.Request(rctx, client.Call{Tool: "crm.update_ticket", CallID: "call-api-1", RunID: "support-run-7",
		Arguments: json.RawMessage(`{"ticket":"T-881","status":"closed","note":"Refund sent; customer confirmed."}`),
		Reason:    "The customer confirmed the refund arrived.",
		Facts:     []client.Fact{{Label: "Ticket", Value: "T-881 · Table arrived damaged"}}})
	if err != nil {
		t.Fatalf("API request: %v", err)
	}
	mcp, err := c.Request(rctx, client.Call{Tool: "github__create_issue", CallID: "call-mcp-1", Upstream: "github",
		Arguments:   json.RawMessage(`{"repo":"acme/shop","title":"Order 1234: damaged in transit","body":"Customer reports the table arrived broken."}`),
		Annotations: &client.Annotations{Destructive: &no}})
	if err != nil {
		t.Fatalf("MCP-shaped request: %v", err)
	}
	code, hl := hlCall(t, d, d.APIKey, "POST", "/function_calls", `{"run_id": "deploy-agent-x1", "call_id": "call-hl-1",
	  "spec": {"fn": "deploy_service", "kwargs": {"service": "web", "version": "1.4.2"}, "channel": null,
	    "reject_options": null, "state": null}, "status": null}`)
	hlID, _ := field(hl, "countersign.request_id").(string)
	if code != http.StatusCreated || hlID == "" {
		t.Fatalf("HumanLayer POST /function_calls = %d %v", code, hl)
	}
	code, hq := hlCall(t, d, d.APIKey, "POST", "/contact_requests", `{"run_id": "support-agent-7", "call_id": "ask-1",
	  "spec": {"msg": "Which warehouse should ship order 1234? The north one shows no stock since Monday.", "subject": "Order 1234", "channel": null,
	    "response_options": [{"name": "north", "title": "North", "description": null, "prompt_fill": null, "interactive": false},
	      {"name": "south", "title": "South", "description": "has stock", "prompt_fill": "ship from south", "interactive": false}],
	    "state": null}, "status": null}`)
	hqID, _ := field(hq, "countersign.request_id").(string)
	if code != http.StatusCreated || hqID == "" {
		t.Fatalf("HumanLayer POST /contact_requests = %d %v", code, hq)
	}
	const command = "rm -rf build && make release"
	bash, err := c.Request(rctx, client.Call{Tool: "Bash", CallID: "toolu_01", RunID: "claude-session-3f2a",
		Arguments: json.RawMessage(`{"command":"rm -rf build && make release","description":"Clean the build and cut a release"}`),
		Facts: []client.Fact{{Label: "Command", Value: command}, {Label: "Working directory", Value: "/home/alice/shop"},
			{Label: "Claude Code session", Value: "claude-session-3f2a"}, {Label: "Permission mode", Value: "default"}}})
	if err != nil {
		t.Fatalf("Bash request: %v", err)
	}
	apiMsg, mcpMsg, hlMsg := apiCard(t, d, api.ID), apiCard(t, d, mcp.ID), apiCard(t, d, hlID)
	hqMsg, bashMsg := apiCard(t, d, hqID), apiCard(t, d, bash.ID)
	waitWS(t, d, "the delete and review-after cards", func() bool {
		_, x := cardFor(d, "delete_customer")
		_, p := cardFor(d, "set_order_priority")
		return x && p
	})
	del, _ := cardFor(d, "delete_customer")
	after, _ := cardFor(d, "set_order_priority")

	cards := []struct {
		name, ts string
		want     []string // in the card's text
		not      []string
	}{
		{"screenshot-card-delete.png", del.TS, []string{"*What will happen*\nPermanently delete a customer record.\n_The policy's description of the tool; its arguments are below._",
			"Facts from the demo's customer records", "it can delete (a sensitive capability)"}, []string{"no system of record", "GET ", "args sha256"}},
		{"screenshot-card-after.png", after.TS, []string{"⏱ *Runs unless cancelled* · <!date^"}, nil},
		{"screenshot-card-api.png", apiMsg.TS, []string{"through the API by key `demo-agent`"}, []string{"no confidence"}},
		{"screenshot-card-mcp.png", mcpMsg.TS, []string{"through MCP upstream `github`"}, []string{"no confidence", "through the API"}},
		{"screenshot-card-humanlayer.png", hlMsg.TS, []string{"through the HumanLayer API by key `demo-agent`"}, []string{"no confidence"}},
		{"screenshot-card-question.png", hqMsg.TS, []string{"*The agent asks:*\n> Which warehouse should ship order 1234?", "• South — has stock"}, []string{"Approve"}},
		{"screenshot-card-bash.png", bashMsg.TS, []string{`command: "rm -rf build &amp;&amp; make release"`, "*Working directory*"}, []string{"*Command*"}},
	}
	for _, c := range cards {
		m, _ := ws.Message(approvals, c.ts)
		text := strings.Join(blockTextsOf(m.Blocks), "\n")
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: card lacks %q:\n%s", c.name, w, text)
			}
		}
		for _, n := range c.not {
			if strings.Contains(text, n) {
				t.Errorf("%s: card says %q:\n%s", c.name, n, text)
			}
		}
		if c.ts == bashMsg.TS && strings.Count(text, "rm -rf build") != 1 {
			t.Errorf("%s: the command is on the card %d times, want once:\n%s", c.name, strings.Count(text, "rm -rf build"), text)
		}
	}

	if err := chromedp.Do(ctx,
		chromedp.Navigate(d.URL()+"/?user="+carol.ID+"&channel="+approvals),
		chromedp.WaitVisible(cardButton(hlMsg.TS, "Approve")),
		chromedp.MouseEvent("mouseMoved", browserWidth-100, 20),
	); err != nil {
		t.Fatalf("carol opens #approvals: %v", err)
	}
	for _, c := range cards {
		saveCard(t, ctx, c.ts, c.name)
	}
}

// blockTextsOf returns every text string in a Block Kit JSON array.
func blockTextsOf(raw json.RawMessage) []string {
	var blocks []any
	_ = json.Unmarshal(raw, &blocks)
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if s, ok := x["text"].(string); ok {
				out = append(out, s)
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
	walk(blocks)
	return out
}
