package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// unconfirmedClaims refuses the first claims as store.Claim does with
// WaitReplicas when Redis's replicas do not confirm them: withdrawn,
// ErrClaimNotConfirmed, the record untouched.
type unconfirmedClaims struct {
	*store.Ledger
	refuse atomic.Int32
}

func (u *unconfirmedClaims) Claim(ctx context.Context, id, owner, tokenHash, digest string, p approval.Prepared) (*approval.Request, error) {
	if u.refuse.Add(-1) >= 0 {
		return nil, fmt.Errorf("claim %s: 0 of 1 replicas within 1s: %w", id, approval.ErrClaimNotConfirmed)
	}
	return u.Ledger.Claim(ctx, id, owner, tokenHash, digest, p)
}

// TestClaimNotConfirmedOverHTTP: a claim Redis's replicas did not confirm
// is 503 not_confirmed with Retry-After and no claim token, the request
// still approved; claiming again wins, once. A HumanLayer poll that meets
// one answers the call as not decided yet (the SDK polls again) and the
// next poll hands it over.
func TestClaimNotConfirmedOverHTTP(t *testing.T) {
	recs := &unconfirmedClaims{}
	h := newHarness(t, harnessOptions{records: func(st *store.Ledger) approval.Records {
		recs.Ledger = st
		return recs
	}})
	c := h.client(fullKey)
	r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "c-unconfirmed", Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil {
		t.Fatal(err)
	}
	h.decide(r.ID, approval.VerdictApprove, "U0BOB0001", "")

	recs.refuse.Store(1)
	req, err := http.NewRequestWithContext(h.ctx, http.MethodPost, h.url+"/v1/requests/"+r.ID+"/claim", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+fullKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(string(body), `"code":"not_confirmed"`) || strings.Contains(string(body), "cst_") {
		t.Fatalf("claim not confirmed = %d Retry-After %q %s; want 503 not_confirmed, Retry-After 1, no token", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if cur, err := h.store.Request(h.ctx, r.ID); err != nil || cur.Status != approval.StatusApproved {
		t.Fatalf("request after the withdrawn claim = %+v, %v; want approved", cur, err)
	}
	claim, err := c.Claim(h.ctx, r.ID)
	if err != nil || claim.Token == "" {
		t.Fatalf("Claim again = %+v, %v; want it won", claim, err)
	}
	var e *client.Error
	if _, err := c.Claim(h.ctx, r.ID); !errors.As(err, &e) || e.Code != "already_claimed" {
		t.Errorf("a third claim = %v; want already_claimed", err)
	}
}

// TestHumanLayerClaimNotConfirmed: a HumanLayer poll whose hand-off claim
// Redis's replicas did not confirm answers the call as not decided yet
// (approved: null), so the SDK polls again and runs nothing; the next
// poll hands it over (approved: true), once.
func TestHumanLayerClaimNotConfirmed(t *testing.T) {
	recs := &unconfirmedClaims{}
	h := newHarness(t, harnessOptions{policy: hlPolicy(), records: func(st *store.Ledger) approval.Records {
		recs.Ledger = st
		return recs
	}})
	code, body := h.hlSend("POST", "/humanlayer/v1/function_calls", fullKey, json.RawMessage(
		`{"run_id":"r1","call_id":"call-unconfirmed","spec":{"fn":"refund","kwargs":{"amount":64}}}`))
	if code != http.StatusCreated {
		t.Fatalf("POST function_calls = %d %s", code, body)
	}
	var created struct {
		Countersign struct {
			RequestID string `json:"request_id"`
		} `json:"countersign"`
	}
	if err := json.Unmarshal(body, &created); err != nil || created.Countersign.RequestID == "" {
		t.Fatalf("POST function_calls answer %s: %v", body, err)
	}
	h.decide(created.Countersign.RequestID, approval.VerdictApprove, "U0BOB0001", "")
	approved := func() any {
		t.Helper()
		code, body := h.hlSend("GET", "/humanlayer/v1/function_calls/call-unconfirmed", fullKey, nil)
		var got struct {
			Status struct {
				Approved any `json:"approved"`
			} `json:"status"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil {
			t.Fatalf("GET function_calls = %d %s", code, body)
		}
		return got.Status.Approved
	}
	recs.refuse.Store(1)
	if got := approved(); got != nil {
		t.Errorf("approved after a claim not confirmed = %v; want null (not decided yet: poll again)", got)
	}
	if got := approved(); got != true {
		t.Errorf("approved on the next poll = %v; want true, handed over", got)
	}
	if got := approved(); got != false {
		t.Errorf("approved on a later poll = %v; want false (handed over once)", got)
	}
}
