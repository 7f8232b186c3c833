package main

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/store"
)

// Tests of issue 12 (hardening under faults and hostile input), each
// against the production wiring (the demo's Main over signed HTTP).

// signedPost posts body to the process's path, signed with the demo's
// signing secret at the process clock, and returns the answer's status.
func signedPost(t *testing.T, d *Demo, path, contentType string, body []byte) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+d.Main.Addr()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Slack-Signature", slacksim.Sign(d.Main.Config.SlackSigningSecret, ts, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// auditEntries reads the demo's whole audit stream.
func auditEntries(t *testing.T, d *Demo) []approval.Entry {
	t.Helper()
	a := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := a.Range(context.Background(), "", 10000)
	if err != nil {
		t.Fatalf("audit Range: %v", err)
	}
	return entries
}

// startCards starts the demo task over signed HTTP and returns the demo
// and the email card once it is bound (its approvers: channel_members).
func startCards(t *testing.T) (*Demo, slacksim.Message, string) {
	t.Helper()
	d := startDemo(t, true)
	task := "<@" + slacksim.BotUserID + "> order 1234 arrived damaged — look it up, email an apology, refund the shipping"
	if _, err := d.Workspace.PostMessage(d.Cast.Requester.ID, d.Cast.Tasks.ID, task, ""); err != nil {
		t.Fatalf("PostMessage: %v", err)
	}
	var card slacksim.Message
	waitWS(t, d, "the email card", func() bool {
		var ok bool
		card, ok = cardFor(d, "send_email")
		return ok
	})
	id := buttonValue.FindStringSubmatch(string(card.Blocks))[1]
	return d, card, id
}

// TestBotUserNeverApproves (issue 12, point 5): a signed Approve click
// from the installation's own bot user — a member of the approvals
// channel, so an approver under channel_members — is refused and audited;
// the request stays pending and nothing runs.
func TestBotUserNeverApproves(t *testing.T) {
	d, card, id := startCards(t)
	if err := d.Workspace.Click(slacksim.BotUserID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(approve as the bot user): %v", err)
	}
	waitWS(t, d, "the bot user's click refused in the audit", func() bool {
		for _, e := range auditEntries(t, d) {
			if e.RequestID == id && e.Actor == slacksim.BotUserID &&
				(e.Event == approval.EventDecisionRefuse || e.Event == approval.EventDecided || e.Event == approval.EventApprovalVote) {
				return true
			}
		}
		return false
	})
	for _, e := range auditEntries(t, d) {
		if e.RequestID == id && e.Actor == slacksim.BotUserID && e.Event != approval.EventDecisionRefuse {
			t.Errorf("audit has %s by the bot user on %s, want only decision_refused", e.Event, id)
		}
	}
	r, err := d.Main.store.Request(context.Background(), id)
	if err != nil || r.Status != approval.StatusPending || len(r.Approvals) != 0 {
		t.Fatalf("request after the bot user's click: status %v, %d approvals, err %v; want pending with none", statusOf(r), len(r.Approvals), err)
	}
	if n := len(d.SoR.Emails()); n != 0 {
		t.Errorf("emails sent = %d, want 0", n)
	}
}

func statusOf(r *approval.Request) approval.Status {
	if r == nil {
		return ""
	}
	return r.Status
}

var _ = strings.Contains
