package client

// This file: checking the signature of a webhook delivery.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Webhook headers. The signature is Slack's scheme with Countersign's
// names: "v0=" + hex HMAC-SHA256(secret, "v0:{timestamp}:{body}").
const (
	HeaderSignature = "X-Countersign-Signature"
	HeaderTimestamp = "X-Countersign-Request-Timestamp"
	HeaderDelivery  = "X-Countersign-Delivery"
)

// WebhookTolerance is how far a delivery's timestamp may be from now.
const WebhookTolerance = 5 * time.Minute

// SignedHeaders returns the headers of a delivery of body signed with
// secret at ts (HeaderTimestamp, HeaderSignature from Sign, and
// HeaderDelivery): what the API's webhooks and the audit's checkpoint
// webhook witness send, and what VerifyWebhook checks.
func SignedHeaders(secret []byte, ts time.Time, body []byte, delivery string) http.Header {
	h := http.Header{}
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, Sign(secret, ts, body))
	h.Set(HeaderDelivery, delivery)
	return h
}

// Sign returns the signature header value of body sent at ts: what the
// server sends with each delivery, and what VerifyWebhook expects.
func Sign(secret []byte, ts time.Time, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "v0:%d:", ts.Unix())
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// ErrBadSignature is returned by VerifyWebhook for a delivery that is not
// signed with the secret, or too old or too new.
var ErrBadSignature = errors.New("countersign: webhook signature invalid")

// WebhookEvent is the body of a webhook delivery.
type WebhookEvent struct {
	// Type is "request.final".
	Type string `json:"type"`
	// DeliveryID is the same on every retry of a delivery: dedupe on it.
	DeliveryID string  `json:"delivery_id"`
	Key        string  `json:"key"`
	Request    Request `json:"request"`
}

// VerifyWebhook checks a delivery's signature (HMAC-SHA256 of
// "v0:{timestamp}:{body}" with the endpoint's secret, compared in constant
// time) and that its timestamp is within WebhookTolerance of now, and
// returns the decoded event. Read the body raw, before any JSON decoding.
func VerifyWebhook(secret []byte, h http.Header, body []byte, now time.Time) (*WebhookEvent, error) {
	ts, err := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: no timestamp", ErrBadSignature)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > WebhookTolerance || d < -WebhookTolerance {
		return nil, fmt.Errorf("%w: timestamp %s from now", ErrBadSignature, d.Round(time.Second))
	}
	want := Sign(secret, time.Unix(ts, 0), body)
	if !hmac.Equal([]byte(want), []byte(h.Get(HeaderSignature))) {
		return nil, ErrBadSignature
	}
	var ev WebhookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("countersign: webhook body: %w", err)
	}
	return &ev, nil
}
