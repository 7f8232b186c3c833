package witness_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// TestFileLast: the checkpointer starts from the file's last checkpoint;
// a missing or empty file has none, a damaged one is an error.
func TestFileLast(t *testing.T) {
	f := &witness.File{Path: filepath.Join(t.TempDir(), "cps.jsonl")}
	if got, err := f.Last(t.Context()); got != nil || err != nil {
		t.Fatalf("Last of a missing file = %v, %v, want none", got, err)
	}
	want := []approval.Checkpoint{signed(t, 1), signed(t, 2)}
	for _, c := range want {
		if err := f.Publish(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := f.Last(t.Context()); err != nil || got == nil || got.Hash() != want[1].Hash() {
		t.Errorf("Last = %+v, %v, want the second checkpoint", got, err)
	}
	if err := os.WriteFile(f.Path, []byte("{not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Last(t.Context()); err == nil {
		t.Errorf("Last of a damaged file = %+v, want an error", got)
	}
}

// posterFunc is a witness.Poster from a function.
type posterFunc func(channel, text, eventType string, payload map[string]any) error

func (p posterFunc) PostWitness(_ context.Context, channel, text, eventType string, payload map[string]any) error {
	return p(channel, text, eventType, payload)
}

// TestSlackAlarms: an alarm and its end are posted to the channel, with
// their own event type and the reason in text and metadata.
func TestSlackAlarms(t *testing.T) {
	var got []string
	a := &witness.SlackAlarms{Channel: "C0OPS", Poster: posterFunc(func(channel, text, eventType string, payload map[string]any) error {
		got = append(got, fmt.Sprintf("%s %s %v %v %q", channel, eventType, payload["state"], payload["alarm"], text))
		return nil
	})}
	if err := a.Alarm(t.Context(), "s", "refusing to sign"); err != nil {
		t.Fatal(err)
	}
	if err := a.Cleared(t.Context(), "s", "refusing to sign"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "C0OPS "+witness.SlackAlarmEventType+" raised refusing to sign") ||
		!strings.HasPrefix(got[1], "C0OPS "+witness.SlackAlarmEventType+" cleared refusing to sign") || !strings.Contains(got[0], "Audit checkpoints of s: refusing to sign") {
		t.Errorf("posted %q", got)
	}
}
