package slacksim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
)

// Sign returns the X-Slack-Signature value for body sent at timestamp ts
// (Unix seconds): "v0=" + hex HMAC-SHA256(secret, "v0:ts:body").
func Sign(secret string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%d:", ts)
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// postHTTP delivers one attempt over HTTP and records a 2xx answer as the
// ack (its JSON body, if any, as the ack payload).
func (w *Workspace) postHTTP(d *delivery, envID string, attempt int, reason string) {
	var target, ctype string
	var body []byte
	switch d.kind {
	case kindEvents:
		target, ctype, body = w.opts.EventsURL, "application/json", d.payload
	case kindInteractive:
		target, ctype = w.opts.InteractiveURL, "application/x-www-form-urlencoded"
		body = []byte(url.Values{"payload": {string(d.payload)}}.Encode())
	case kindSlash:
		target, ctype = w.opts.CommandsURL, "application/x-www-form-urlencoded"
		var fields map[string]any
		_ = json.Unmarshal(d.payload, &fields)
		form := url.Values{}
		for k, v := range fields {
			form.Set(k, fmt.Sprint(v))
		}
		body = []byte(form.Encode())
	}
	if target == "" {
		w.log.Warn("slacksim: no HTTP delivery URL", "type", d.kind)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.AckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		w.log.Warn("slacksim: build delivery", "err", err)
		return
	}
	ts := w.now().Unix()
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("User-Agent", "Slackbot 1.0 (+https://api.slack.com/robots)")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Slack-Signature", Sign(w.opts.SigningSecret, ts, body))
	if attempt > 0 {
		req.Header.Set("X-Slack-Retry-Num", strconv.Itoa(attempt))
		req.Header.Set("X-Slack-Retry-Reason", reason)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		reason := "connection_failed"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "http_timeout"
		}
		w.failDelivery(d, reason)
		w.log.Info("slacksim: delivery failed", "type", d.kind, "envelope_id", envID, "err", err)
		return
	}
	defer resp.Body.Close()
	respBody, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		w.failDelivery(d, "http_error")
		w.log.Info("slacksim: delivery refused", "type", d.kind, "envelope_id", envID, "status", resp.StatusCode)
		return
	}
	var ack json.RawMessage
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" && json.Valid(respBody) {
		ack = respBody
	} else if len(bytes.TrimSpace(respBody)) > 0 && d.kind == kindSlash {
		ack, _ = json.Marshal(map[string]string{"text": string(respBody)})
	}
	w.ackEnvelope(envID, ack)
}
