package api_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// directory names the users it knows, as the bot's users.info lookup does.
type directory map[string]string

func (d directory) Name(_ context.Context, id string) string { return d[id] }

// TestViewNamesTheApprover: the API's answers and its webhooks carry the
// approver's name beside the id (approver_name, approver_names); an id the
// directory cannot name is shown as the id.
func TestViewNamesTheApprover(t *testing.T) {
	rc := &receiver{ch: make(chan struct{}, 10)}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	h := newHarness(t, harnessOptions{names: directory{"U0BOB0001": "Bob Baker"},
		endpoints: []api.Endpoint{{Name: "ops-hook", URL: srv.URL, Secret: []byte("s")}}})
	c := h.client(fullKey)

	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c1", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictReject, "U0BOB0001", "not today")
	got, err := c.Get(h.ctx, r.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Approver != "U0BOB0001" || got.ApproverName != "Bob Baker" {
		t.Errorf("Get = approver %q, approver_name %q; want U0BOB0001 and Bob Baker", got.Approver, got.ApproverName)
	}
	select {
	case <-rc.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("webhook not delivered")
	}
	rc.mu.Lock()
	body := rc.got[0].body
	rc.mu.Unlock()
	var ev struct {
		Request client.Request `json:"request"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.Request.ApproverName != "Bob Baker" {
		t.Errorf("webhook request = %s, want approver_name Bob Baker", body)
	}

	// An approver the directory does not know is shown by id.
	r2, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c2", Arguments: json.RawMessage(`{"amount":65}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r2.ID, approval.VerdictApprove, "U0CAROL01", "")
	got, err = c.Get(h.ctx, r2.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.ApproverName != "U0CAROL01" || !slices.Equal(got.ApproverNames, []string{"U0CAROL01"}) || !slices.Equal(got.Approvers, []string{"U0CAROL01"}) {
		t.Errorf("Get = approver_name %q, approver_names %v, approvers %v; want the id where no name is known", got.ApproverName, got.ApproverNames, got.Approvers)
	}
}
