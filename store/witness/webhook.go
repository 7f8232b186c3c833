package witness

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
)

// WebhookEventType is the type of a checkpoint delivery's body.
const WebhookEventType = "audit.checkpoint"

// WebhookEvent is the body of a checkpoint delivery.
type WebhookEvent struct {
	// Type is WebhookEventType.
	Type       string              `json:"type"`
	Checkpoint approval.Checkpoint `json:"checkpoint"`
}

// Webhook POSTs each checkpoint to a URL outside Redis. Sign adds the
// transport's signature headers: cmd/countersign wires the API's webhook
// signing (client.Sign: HMAC-SHA256 of "v0:{timestamp}:{body}"), so a
// receiver checks it with client.VerifyWebhook's scheme, with one
// implementation of it in the tree. The checkpoint itself is signed with
// the audit key whatever the transport.
type Webhook struct {
	URL string
	// Sign returns the headers that sign body, sent at now as delivery
	// (a stable id per checkpoint); nil sends none.
	Sign func(now time.Time, body []byte, delivery string) http.Header
	// Client sends the request; default a client with a 10 s timeout.
	Client *http.Client
	// Now stamps the signature; default time.Now.
	Now func() time.Time
}

// Name says which witness it is.
func (w *Webhook) Name() string { return "webhook " + w.URL }

// Publish POSTs c; any status but 2xx is an error.
func (w *Webhook) Publish(ctx context.Context, c approval.Checkpoint) error {
	body, err := json.Marshal(WebhookEvent{Type: WebhookEventType, Checkpoint: c})
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	now := option.FuncOr(w.Now, time.Now)()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if w.Sign != nil {
		for k, v := range w.Sign(now, body, "cpk_"+strconv.FormatInt(c.Seq, 10)+"_"+c.Hash()[:16]) {
			req.Header[k] = v
		}
	}
	hc := cmp.Or(w.Client, defaultClient)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", w.URL, resp.Status)
	}
	return nil
}

var defaultClient = &http.Client{Timeout: 10 * time.Second}
