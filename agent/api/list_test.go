package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// getJSON sends GET path with key and decodes the answer into out (an
// error body into e); it returns the status.
func getJSON(t *testing.T, h *harness, key, path string, out any) (int, map[string]string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb struct {
			Error map[string]string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return resp.StatusCode, eb.Error
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: decode: %v", path, err)
	}
	return resp.StatusCode, nil
}

// ask creates a pending refund request with key and call id.
func askRefund(t *testing.T, h *harness, key, callID string) *client.Request {
	t.Helper()
	r, err := h.client(key).Request(h.ctx, client.Call{Tool: "refund", CallID: callID, Arguments: json.RawMessage(`{"amount":10}`)})
	if err != nil {
		t.Fatalf("Request(%s): %v", callID, err)
	}
	if r.Status != client.Pending {
		t.Fatalf("Request(%s) = %s, want pending", callID, r.Status)
	}
	return r
}

// TestListPending: GET /v1/requests?status=pending lists the key's own
// pending requests, oldest first, in pages joined by a cursor; never
// another key's, never a final one.
func TestListPending(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var want []string
	for i := range 5 {
		want = append(want, askRefund(t, h, fullKey, fmt.Sprintf("list-%d", i)).ID)
		h.clock.Advance(time.Second)
	}
	other := askRefund(t, h, narrowKey, "list-other")
	h.decide(want[2], approval.VerdictReject, "U0BOB0001", "no")

	full := h.client(fullKey)
	var got []string
	cursor, pages := "", 0
	for {
		p, err := full.List(h.ctx, 2, cursor)
		if err != nil {
			t.Fatalf("List(2, %q): %v", cursor, err)
		}
		pages++
		if len(p.Requests) > 2 {
			t.Fatalf("List(2) gave %d requests", len(p.Requests))
		}
		for _, r := range p.Requests {
			if r.Status != client.Pending {
				t.Errorf("List gave %s, %s; want only pending", r.ID, r.Status)
			}
			got = append(got, r.ID)
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
		if pages > 5 {
			t.Fatal("List pages never end")
		}
	}
	wantIDs := []string{want[0], want[1], want[3], want[4]}
	if strings.Join(got, ",") != strings.Join(wantIDs, ",") {
		t.Errorf("List (pages of 2) = %q, want %q (oldest first, the rejected one left out)", got, wantIDs)
	}

	p, err := h.client(narrowKey).List(h.ctx, 0, "")
	if err != nil {
		t.Fatalf("narrow List: %v", err)
	}
	if len(p.Requests) != 1 || p.Requests[0].ID != other.ID || p.NextCursor != "" {
		t.Errorf("narrow List = %+v, want only its own request %s", p, other.ID)
	}

	var raw map[string]json.RawMessage
	if status, e := getJSON(t, h, fullKey, "/v1/requests?status=pending", &raw); status != 200 || string(raw["requests"]) == "" {
		t.Errorf("GET /v1/requests?status=pending = %d %v %s", status, e, raw)
	}
	for _, c := range []struct{ query, field string }{
		{"status=approved", "status"},
		{"limit=0", "limit"},
		{"limit=101", "limit"},
		{"limit=x", "limit"},
		{"cursor=%21%21", "cursor"},
	} {
		status, e := getJSON(t, h, fullKey, "/v1/requests?"+c.query, &raw)
		if status != http.StatusBadRequest || e["code"] != "invalid_field" || e["field"] != c.field {
			t.Errorf("GET /v1/requests?%s = %d %v, want 400 invalid_field %s", c.query, status, e, c.field)
		}
	}
}

// TestCancelWithdraws: the caller withdraws its pending request through
// the lifecycle: the request is cancelled with the reason "Withdrawn by
// the caller (key …) — nothing ran", audited as cancelled by the key,
// its long poll is answered, its card redrawn, and it can be neither
// claimed nor withdrawn again (409 not_pending with its state).
func TestCancelWithdraws(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	full := h.client(fullKey)
	r := askRefund(t, h, fullKey, "cancel-1")

	polled := make(chan *client.Request, 1)
	go func() { got, _ := full.Wait(h.ctx, r.ID); polled <- got }() // ends with the final answer or the test's ctx
	h.waitPolls(1)

	got, err := full.Cancel(h.ctx, r.ID)
	const why = "Withdrawn by the caller (key full) — nothing ran"
	if err != nil || got.Status != client.Cancelled || got.Reason != why {
		t.Fatalf("Cancel = %+v, %v; want cancelled with reason %q", got, err, why)
	}
	select {
	case w := <-polled:
		if w == nil || w.Status != client.Cancelled {
			t.Errorf("the waiting long poll answered %+v, want cancelled", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting long poll was not answered after the cancel")
	}
	cancelled := h.events(approval.EventCancelled)
	if len(cancelled) != 1 || cancelled[0].RequestID != r.ID || cancelled[0].Actor != "api:full" || !strings.Contains(string(cancelled[0].Data), why) {
		t.Errorf("audit cancelled = %+v, want one by api:full saying %q", cancelled, why)
	}
	if card, ok := h.cards.Drawn(r.ID); !ok || card.Status != approval.StatusCancelled || card.Decision == nil || card.Decision.Text != why {
		t.Errorf("card last drawn with %+v, want cancelled saying %q", card, why)
	}
	if p, err := full.List(h.ctx, 0, ""); err != nil || len(p.Requests) != 0 {
		t.Errorf("List after the cancel = %+v, %v; want none pending", p, err)
	}

	var apiErr *client.Error
	if _, err := full.Claim(h.ctx, r.ID); !errors.As(err, &apiErr) || apiErr.Code != "not_approved" {
		t.Errorf("Claim of a withdrawn request = %v, want 409 not_approved", err)
	}
	_, err = full.Cancel(h.ctx, r.ID)
	if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusConflict || apiErr.Code != "not_pending" || apiErr.Request == nil || apiErr.Request.Status != client.Cancelled {
		t.Errorf("second Cancel = %v (request %+v), want 409 not_pending with the cancelled request", err, apiErr)
	}
}

// TestCancelRefused: a request a person decided first is not withdrawn
// (409 not_pending, with the decided request: the caller may still claim
// an approval); another key's request is not found.
func TestCancelRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	full := h.client(fullKey)
	r := askRefund(t, h, fullKey, "cancel-approved")
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")

	var apiErr *client.Error
	_, err := full.Cancel(h.ctx, r.ID)
	if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusConflict || apiErr.Code != "not_pending" || apiErr.Request == nil || apiErr.Request.Status != client.Approved {
		t.Fatalf("Cancel of an approved request = %v, want 409 not_pending with the approved request", err)
	}
	if _, err := full.Claim(h.ctx, r.ID); err != nil {
		t.Errorf("Claim after a refused cancel: %v, want the approval intact", err)
	}
	if n := len(h.events(approval.EventCancelled)); n != 0 {
		t.Errorf("%d cancelled entries, want none", n)
	}

	mine := askRefund(t, h, fullKey, "cancel-not-yours")
	_, err = h.client(narrowKey).Cancel(context.Background(), mine.ID)
	if !errors.As(err, &apiErr) || apiErr.HTTPStatus != http.StatusNotFound {
		t.Errorf("another key's Cancel = %v, want 404", err)
	}
	if cur, err := full.Get(h.ctx, mine.ID, 0); err != nil || cur.Status != client.Pending {
		t.Errorf("after another key's Cancel: %+v, %v; want still pending", cur, err)
	}
}
