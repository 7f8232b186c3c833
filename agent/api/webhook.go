package api

// This file: signed webhooks on every final decision of an API request.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
)

// Endpoint is one webhook receiver.
type Endpoint struct {
	// Name names it in the audit, logs and metrics (never the secret).
	Name   string
	URL    string
	Secret []byte
	// Keys, when not empty, are the names of the API keys whose requests
	// this endpoint is told of; empty, it is told of every key's.
	Keys []string
}

// wants tells whether e is told of the requests of the key named key.
func (e Endpoint) wants(key string) bool {
	return len(e.Keys) == 0 || slices.Contains(e.Keys, key)
}

// Event is the body of a webhook delivery: the Go client's WebhookEvent,
// which a receiver decodes (client.VerifyWebhook).
type Event = client.WebhookEvent

// Endpoints are the receivers of the policy file's api.webhooks, each
// secret read with env from the variable the file names (never from the
// file itself). An empty secret is an error naming the policy key.
func Endpoints(hooks []policyfile.Webhook, env func(string) string) ([]Endpoint, error) {
	var eps []Endpoint
	for i, w := range hooks {
		secret := env(w.SecretEnv)
		if secret == "" {
			return nil, fmt.Errorf("policy api.webhooks[%d].secret_env: environment variable %s is empty; it must hold the signing secret", i, w.SecretEnv)
		}
		eps = append(eps, Endpoint{Name: w.Name, URL: w.URL, Secret: []byte(secret), Keys: slices.Clone(w.Keys)})
	}
	return eps, nil
}

// Defaults for WebhookOptions.
const (
	DefaultWebhookAttempts = 6
	DefaultWebhookBackoff  = 2 * time.Second
	DefaultWebhookMaxDelay = 5 * time.Minute
	DefaultWebhookQueue    = 10000
	DefaultWebhookWorkers  = 4
)

// WebhookOptions configure Webhooks. Audit is required.
type WebhookOptions struct {
	Endpoints []Endpoint
	Audit     approval.Auditor
	// Client sends the deliveries, default a client with a 10 s timeout.
	Client *http.Client
	// Attempts per delivery and endpoint, default DefaultWebhookAttempts.
	Attempts int
	// Backoff is the wait after the first failed attempt, doubled after
	// each (capped at DefaultWebhookMaxDelay), default
	// DefaultWebhookBackoff.
	Backoff time.Duration
	// Now is the clock and Sleep waits on it (tests advance a fake clock),
	// defaults time.Now and a timer that honours ctx.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	// Workers deliver in parallel, default DefaultWebhookWorkers; Queue
	// bounds the deliveries waiting for one, default DefaultWebhookQueue.
	Workers, Queue int
	Logger         *slog.Logger
	// Names names the approvers in the deliveries; nil shows ids.
	Names Names
	// Secret names, per tool, the argument properties the policy marks
	// secret: a delivery carries them redacted (approval.Redact, as the
	// audit does). Nil redacts by the built-in names only.
	Secret func(tool string) []string
}

// Webhooks tells each endpoint of every final decision on an API request,
// signed, retried with backoff, each delivery with an id receivers dedupe
// on. Each attempt is audited (webhook_delivered, webhook_failed), which
// the process's metrics count. Deliveries queued when the process stops
// are lost (their requests can still be read with GET).
type Webhooks struct {
	endpoints []Endpoint
	audit     approval.Auditor
	client    *http.Client
	attempts  int
	backoff   time.Duration
	now       func() time.Time
	sleep     func(context.Context, time.Duration) error
	workers   int
	queue     chan *approval.Request
	log       *slog.Logger
	names     Names
	secret    func(tool string) []string

	wg sync.WaitGroup // the workers; each exits when Run's ctx ends
}

// NewWebhooks returns the webhook sender; Run starts it.
func NewWebhooks(opts WebhookOptions) (*Webhooks, error) {
	if err := option.Required("api: WebhookOptions.Audit", opts.Audit == nil); err != nil {
		return nil, err
	}
	w := &Webhooks{endpoints: opts.Endpoints, audit: opts.Audit, client: opts.Client, attempts: opts.Attempts,
		backoff: opts.Backoff, now: opts.Now, sleep: opts.Sleep, workers: opts.Workers, log: opts.Logger,
		names: cmp.Or[Names](opts.Names, noNames{}), secret: opts.Secret}
	w.secret = option.FuncOr(w.secret, func(string) []string { return nil })
	for _, e := range w.endpoints {
		if _, err := url.Parse(e.URL); err != nil || len(e.Secret) == 0 {
			return nil, fmt.Errorf("api: webhook %q: a URL and a secret are required", e.Name)
		}
	}
	w.client = cmp.Or(w.client, &http.Client{Timeout: 10 * time.Second})
	w.attempts = option.PositiveOr(w.attempts, DefaultWebhookAttempts)
	w.backoff = option.PositiveOr(w.backoff, DefaultWebhookBackoff)
	w.now = option.FuncOr(w.now, time.Now)
	w.sleep = option.FuncOr(w.sleep, clock.Sleep)
	w.workers = option.PositiveOr(w.workers, DefaultWebhookWorkers)
	w.queue = make(chan *approval.Request, option.PositiveOr(opts.Queue, DefaultWebhookQueue))
	w.log = cmp.Or(w.log, slog.New(slog.DiscardHandler))
	return w, nil
}

// Notify queues the deliveries of a request that became final; it is the
// lifecycle's OnFinal and returns at once. Requests that did not come
// through the API are ignored. A full queue drops the delivery, audited.
func (w *Webhooks) Notify(r *approval.Request) {
	if r.Caller.Kind != approval.CallerAPI || len(w.endpoints) == 0 {
		return
	}
	select {
	case w.queue <- r:
	default:
		for _, e := range w.endpoints {
			if !e.wants(r.Caller.Name) {
				continue
			}
			w.record(context.Background(), r, approval.EventWebhookFailed, approval.WebhookEvent{DeliveryID: DeliveryID(r.ID, r.Status, e.Name),
				Endpoint: e.Name, Error: "delivery queue full; dropped", GaveUp: true})
		}
	}
}

// Run delivers queued requests until ctx ends; it returns once its
// workers have.
func (w *Webhooks) Run(ctx context.Context) {
	for range w.workers {
		w.wg.Add(1)
		go func() { // exits when ctx ends
			defer w.wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case r := <-w.queue:
					for _, e := range w.endpoints {
						if e.wants(r.Caller.Name) {
							w.deliver(ctx, e, r)
						}
					}
				}
			}
		}()
	}
	w.wg.Wait()
}

// DeliveryID is the id of the delivery of request id reaching status st to
// the named endpoint: the same on every attempt and from every process.
func DeliveryID(id string, st approval.Status, endpoint string) string {
	sum := sha256.Sum256([]byte(id + "\x00" + string(st) + "\x00" + endpoint))
	return "whd_" + strings.ToLower(requestIDEncoding.EncodeToString(sum[:16]))
}

// deliver sends r to e until a 2xx answer or the attempts run out.
func (w *Webhooks) deliver(ctx context.Context, e Endpoint, r *approval.Request) {
	id := DeliveryID(r.ID, r.Status, e.Name)
	body, err := json.Marshal(Event{Type: "request.final", DeliveryID: id, Key: r.Caller.Name, Request: named(ctx, w.names, w.redacted(r))})
	if err != nil {
		w.log.Error("webhook body", "request_id", r.ID, "err", err)
		return
	}
	delay := w.backoff
	for attempt := 1; ; attempt++ {
		status, err := w.send(ctx, e, id, body)
		if err == nil {
			w.record(ctx, r, approval.EventWebhookSent, approval.WebhookEvent{DeliveryID: id, Endpoint: e.Name, Attempt: attempt, HTTPStatus: status})
			return
		}
		if ctx.Err() != nil {
			return // stopping: not the endpoint's failure
		}
		last := attempt >= w.attempts
		w.record(ctx, r, approval.EventWebhookFailed, approval.WebhookEvent{DeliveryID: id, Endpoint: e.Name, Attempt: attempt, HTTPStatus: status,
			Error: err.Error(), GaveUp: last})
		w.log.Warn("webhook delivery failed", "request_id", r.ID, "delivery_id", id, "endpoint", e.Name, "attempt", attempt, "gave_up", last, "err", err)
		if last {
			return
		}
		if w.sleep(ctx, delay) != nil {
			return
		}
		delay = min(delay*2, DefaultWebhookMaxDelay)
	}
}

// redacted is r as a delivery shows it: its arguments (and the arguments
// before an edit) redacted as the audit stores them, so a value the policy
// marks secret never leaves the process in a webhook.
func (w *Webhooks) redacted(r *approval.Request) RequestView {
	v := view(r)
	secret := w.secret(r.Tool)
	v.Arguments = approval.Redact(v.Arguments, secret)
	if len(v.OriginalArguments) > 0 {
		v.OriginalArguments = approval.Redact(v.OriginalArguments, secret)
	}
	return v
}

// send makes one attempt; a non-2xx answer is an error.
func (w *Webhooks) send(ctx context.Context, e Endpoint, id string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	ts := w.now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Countersign-Webhooks/1")
	// Signed as the client checks it (client.VerifyWebhook).
	for k, v := range client.SignedHeaders(e.Secret, ts, body, id) {
		req.Header[k] = v
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, errors.New("endpoint not reachable")
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

func (w *Webhooks) record(ctx context.Context, r *approval.Request, ev approval.Event, data approval.WebhookEvent) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := w.audit.Append(actx, approval.Record{Event: ev, RequestID: r.ID, RunID: r.RunID, Actor: "webhooks", Tool: r.Tool, Data: data}); err != nil {
		w.log.Error("audit append failed", "event", ev, "request_id", r.ID, "err", err)
	}
}
