package main_test

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
)

// hrefs matches link targets.
var hrefs = regexp.MustCompile(`href="[^"]*"`)

// getAudit fetches a page of d's audit view with its credentials.
func getAudit(t *testing.T, d *main.Demo, path string) string {
	t.Helper()
	base, user, pass := d.AuditURL()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, %v", path, resp.StatusCode, err)
	}
	return string(b)
}

// TestAuditViewNamesFromSlack: the audit view that Main serves names the
// people, channel and group it shows through the bot (users.info,
// conversations.info, usergroups.list against the workspace, cached), not
// by their ids: `serve` and the demo share this wiring.
func TestAuditViewNamesFromSlack(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	ws, cast := d.Workspace, d.Cast
	if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 9012 is late, email the customer an apology", ""); err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the email card", func() bool { _, ok := cardFor(d, "send_email"); return ok })
	card, _ := cardFor(d, "send_email")
	id := requestOfCard(t, card)
	waitAudit(t, d, id, approval.EventCardPosted)

	pending := hrefs.ReplaceAllString(getAudit(t, d, ""), `href=""`)
	for _, want := range []string{cast.Requester.RealName, "#" + cast.Approvals.Name} {
		if !strings.Contains(pending, want) {
			t.Errorf("pending page does not show %q", want)
		}
	}
	for _, raw := range []string{cast.Requester.ID, cast.Approvals.ID} {
		if strings.Contains(pending, raw) {
			t.Errorf("pending page shows the raw id %q", raw)
		}
	}
	before := ws.Calls("users.info") + ws.Calls("conversations.info")
	getAudit(t, d, "")
	if after := ws.Calls("users.info") + ws.Calls("conversations.info"); after != before {
		t.Errorf("Slack lookups on a second load = %d, want 0 (cached)", after-before)
	}

	if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
		t.Fatalf("Click(reject): %v", err)
	}
	v := openModal(t, d, cast.Approver.ID)
	if res, err := ws.SubmitView(cast.Approver.ID, v.ID, map[string]map[string]any{"reason": {"text": "Call them instead."}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(reason) = %+v, %v; want closed", res, err)
	}
	waitAudit(t, d, id, approval.EventDecided)
	if story := getAudit(t, d, "requests/"+id); !strings.Contains(story, "#"+cast.Approvals.Name) {
		t.Errorf("the story does not name the card's channel #%s", cast.Approvals.Name)
	}
	for _, path := range []string{"history", "requests/" + id} {
		// Links to the card carry the channel id; what people read must not.
		page := hrefs.ReplaceAllString(getAudit(t, d, path), `href=""`)
		if !strings.Contains(page, cast.Approver.RealName) {
			t.Errorf("%s does not show the approver as %q", path, cast.Approver.RealName)
		}
		if strings.Contains(page, cast.Approver.ID) {
			t.Errorf("%s shows the approver's id %s", path, cast.Approver.ID)
		}
		if strings.Contains(page, cast.Approvals.ID) {
			t.Errorf("%s shows the approvals channel's id %s", path, cast.Approvals.ID)
		}
	}
}
