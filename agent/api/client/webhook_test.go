package client_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
)

// TestSignKnownVector: the webhook signature is docs/api.md's scheme,
// "v0=" + hex HMAC-SHA256(secret, "v0:{timestamp}:{body}"), checked
// against a value computed outside Go; VerifyWebhook accepts it and
// refuses a changed body.
func TestSignKnownVector(t *testing.T) {
	t.Parallel()
	secret, body := []byte("s3cret"), []byte(`{"type":"request.final"}`)
	at := time.Unix(1764667200, 0)
	const want = "v0=20707f2922fc98e6ae32eda8ad45152c3c68608863f48ad1f5ae69e20e43c123"
	if got := client.Sign(secret, at, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	h := http.Header{}
	h.Set(client.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(client.HeaderSignature, want)
	if ev, err := client.VerifyWebhook(secret, h, body, at); err != nil || ev.Type != "request.final" {
		t.Errorf("VerifyWebhook = %+v, %v, want the event", ev, err)
	}
	if _, err := client.VerifyWebhook(secret, h, []byte(`{"type":"request.fina1"}`), at); !errors.Is(err, client.ErrBadSignature) {
		t.Errorf("VerifyWebhook(changed body) = %v, want ErrBadSignature", err)
	}
}
