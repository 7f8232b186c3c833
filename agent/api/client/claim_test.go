package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/countersign/countersign/agent/api/client"
)

// TestClaimTriesAgainWhenNotConfirmed: a claim the server withdrew
// because Redis's replicas did not confirm it (503 not_confirmed) is made
// again, up to three more times; any other refusal is returned at once.
func TestClaimTriesAgainWhenNotConfirmed(t *testing.T) {
	tests := []struct {
		name       string
		unconfirm  int32 // answers of 503 not_confirmed before a 200
		code       string
		wantCalls  int32
		wantClaim  bool
		wantErrMsg string
	}{
		{name: "confirmed the third time", unconfirm: 2, wantCalls: 3, wantClaim: true},
		{name: "never confirmed", unconfirm: 100, wantCalls: 4, wantErrMsg: "not_confirmed"},
		{name: "another refusal", unconfirm: 100, code: "already_claimed", wantCalls: 1, wantErrMsg: "already_claimed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if calls.Add(1) <= tc.unconfirm {
					code, status := "not_confirmed", http.StatusServiceUnavailable
					if tc.code != "" {
						code, status = tc.code, http.StatusConflict
					}
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(status)
					_, _ = w.Write([]byte(`{"error":{"code":"` + code + `","message":"m"}}`))
					return
				}
				_, _ = w.Write([]byte(`{"claim_token":"cst_x","request":{"id":"req_1","status":"executing"}}`))
			}))
			defer srv.Close()
			cl := &client.Client{BaseURL: srv.URL, Key: "k"}
			got, err := cl.Claim(context.Background(), "req_1")
			if n := calls.Load(); n != tc.wantCalls {
				t.Errorf("claims sent = %d, want %d", n, tc.wantCalls)
			}
			var e *client.Error
			switch {
			case tc.wantClaim && (err != nil || got.Token != "cst_x"):
				t.Errorf("Claim = %+v, %v; want the claim", got, err)
			case !tc.wantClaim && (!errors.As(err, &e) || e.Code != tc.wantErrMsg):
				t.Errorf("Claim = %+v, %v; want the %s refusal", got, err, tc.wantErrMsg)
			}
		})
	}
}
