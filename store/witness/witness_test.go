package witness_test

import (
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store/witness"
)

func signed(t *testing.T, seq int64) approval.Checkpoint {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(nil)
	hashes := []string{"0123456789abcdef"}
	return approval.SignCheckpoint(key, approval.Checkpoint{Stream: "s", From: seq, Seq: seq, Head: "ab", Hashes: hashes,
		Covered: approval.CoveredDigest(hashes), Time: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)})
}

func TestFileAppendsAndReadsBack(t *testing.T) {
	f := &witness.File{Path: filepath.Join(t.TempDir(), "cps.jsonl")}
	want := []approval.Checkpoint{signed(t, 1), signed(t, 2)}
	for _, c := range want {
		if err := f.Publish(t.Context(), c); err != nil {
			t.Fatalf("Publish = %v", err)
		}
	}
	got, err := witness.ReadFile(f.Path)
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadFile = %d, %v", len(got), err)
	}
	for i := range want {
		if got[i].Hash() != want[i].Hash() || len(got[i].Hashes) != 1 {
			t.Errorf("checkpoint %d read back differs: %+v", i, got[i])
		}
	}
}

func TestWebhookSignsLikeTheAPI(t *testing.T) {
	secret := []byte("s3cret")
	got := make(chan witness.WebhookEvent, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := client.VerifyWebhook(secret, r.Header, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev witness.WebhookEvent
		_ = json.Unmarshal(body, &ev)
		got <- ev
	}))
	defer srv.Close()
	c := signed(t, 7)
	if err := (&witness.Webhook{URL: srv.URL, Sign: signer(secret)}).Publish(t.Context(), c); err != nil {
		t.Fatalf("Publish = %v", err)
	}
	if ev := <-got; ev.Type != witness.WebhookEventType || ev.Checkpoint.Hash() != c.Hash() {
		t.Errorf("delivered %+v, want the checkpoint", ev)
	}
	if err := (&witness.Webhook{URL: srv.URL, Sign: signer([]byte("wrong"))}).Publish(t.Context(), c); err == nil {
		t.Error("Publish with the wrong secret = nil error, want the 401")
	}
}

// signer signs as cmd/countersign wires it: the API's webhook signing.
func signer(secret []byte) func(time.Time, []byte, string) http.Header {
	return func(now time.Time, body []byte, delivery string) http.Header {
		return client.SignedHeaders(secret, now, body, delivery)
	}
}
