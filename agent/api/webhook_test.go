package api_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// TestWebhookRedactsSecretArguments: an argument the policy marks secret
// reaches the endpoint redacted, as the audit stores it (approval.Redact),
// in the arguments and in the arguments before an edit.
func TestWebhookRedactsSecretArguments(t *testing.T) {
	rc := &receiver{ch: make(chan struct{}, 10)}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	pol := testPolicy()
	refund := pol.Tools["refund"]
	refund.Secret = []string{"card_number"}
	pol.Tools["refund"] = refund
	h := newHarness(t, harnessOptions{policy: &pol, endpoints: []api.Endpoint{{Name: "ops-hook", URL: srv.URL, Secret: []byte("s")}}})
	const card = "4111111111111111"
	r, err := h.client(fullKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64,"card_number":"` + card + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")
	select {
	case <-rc.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("webhook not delivered")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	body := rc.got[0].body
	if strings.Contains(string(body), card) {
		t.Fatalf("delivered body holds the secret argument: %s", body)
	}
	ev, err := client.VerifyWebhook([]byte("s"), rc.got[0].header, body, h.clock.Now())
	if err != nil {
		t.Fatalf("VerifyWebhook: %v", err)
	}
	var args map[string]any
	if err := json.Unmarshal(ev.Request.Arguments, &args); err != nil || args["card_number"] != approval.Redacted || args["amount"] != float64(64) {
		t.Errorf("delivered arguments = %s, want card_number %q and the amount kept", ev.Request.Arguments, approval.Redacted)
	}
}

// TestWebhookKeyFilter: an endpoint limited to some keys is told only of
// their requests; an endpoint without a filter is told of every key's.
func TestWebhookKeyFilter(t *testing.T) {
	onlyFull := &receiver{ch: make(chan struct{}, 10)}
	every := &receiver{ch: make(chan struct{}, 10)}
	srvFull, srvEvery := httptest.NewServer(onlyFull), httptest.NewServer(every)
	defer srvFull.Close()
	defer srvEvery.Close()
	h := newHarness(t, harnessOptions{endpoints: []api.Endpoint{
		{Name: "full-only", URL: srvFull.URL, Secret: []byte("s"), Keys: []string{"full"}},
		{Name: "every", URL: srvEvery.URL, Secret: []byte("s")},
	}})
	// The narrow key's request is decided first: were it sent to
	// full-only, that endpoint's first delivery would be it.
	narrow, err := h.client(narrowKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "n1", Arguments: json.RawMessage(`{"amount":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(narrow.ID, approval.VerdictReject, "U0BOB0001", "no")
	h.waitAudit("the narrow key's delivery", func() bool { return len(h.events(approval.EventWebhookSent)) == 1 })
	full, err := h.client(fullKey).Request(h.ctx, client.Call{Tool: "refund", CallID: "f1", Arguments: json.RawMessage(`{"amount":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(full.ID, approval.VerdictApprove, "U0BOB0001", "")
	h.waitAudit("the full key's deliveries", func() bool { return len(h.events(approval.EventWebhookSent)) == 3 })

	ids := func(rc *receiver) []string {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		var out []string
		for _, d := range rc.got {
			ev, err := client.VerifyWebhook([]byte("s"), d.header, d.body, h.clock.Now())
			if err != nil {
				t.Fatalf("VerifyWebhook: %v", err)
			}
			out = append(out, ev.Key+":"+ev.Request.ID)
		}
		return out
	}
	if got, want := ids(onlyFull), []string{"full:" + full.ID}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("full-only endpoint got %v, want %v (never the narrow key's request)", got, want)
	}
	if got := ids(every); len(got) != 2 {
		t.Errorf("unfiltered endpoint got %v, want both keys' requests", got)
	}
}
