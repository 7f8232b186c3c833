// Package metrics is Prometheus' only home: the series Countersign exports,
// fed from the typed audit events (Auditor wraps the audit appender and
// reads each entry through approval.DecodeEvent) and from the HTTP traffic
// of the Slack and OpenAI clients (SlackTransport, ModelTransport: plain
// round trippers; neither client library is imported here), plus the
// /readyz handler. It lives under approval because what it observes is
// approval's audit trail; bot and agent never know about it.
package metrics

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// Metrics holds every Prometheus series Countersign exports. The series are
// registered on a registry passed in (never the global one), so tests and
// several instances in one process do not collide.
//
// Nothing in bot or agent knows about metrics: the series are fed from the
// audit records (Auditor) and from the HTTP traffic of the Slack and
// OpenAI clients (the round trippers below). See docs/operations.md for the
// reference.
type Metrics struct {
	requests        *prometheus.CounterVec   // tool, outcome
	decision        *prometheus.HistogramVec // tool, verdict
	expired         *prometheus.CounterVec   // tool
	refusedClicks   *prometheus.CounterVec   // reason
	executions      *prometheus.CounterVec   // tool, outcome
	executionTime   *prometheus.HistogramVec // tool
	slackRequests   *prometheus.CounterVec   // method, status
	slackErrors     *prometheus.CounterVec   // method
	slackRateLimits *prometheus.CounterVec   // method
	modelRequests   *prometheus.CounterVec   // status
	modelTime       prometheus.Histogram
	modelTokens     *prometheus.CounterVec // kind
	auditErrors     *prometheus.CounterVec // event
	sampled         *prometheus.CounterVec // tool, outcome
	markedWrong     *prometheus.CounterVec // tool, ran
	apiRefusals     *prometheus.CounterVec // code
	webhooks        *prometheus.CounterVec // endpoint, outcome
}

// Buckets for time to decision: a human decides in seconds or in days.
var decisionBuckets = []float64{1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 3 * 24 * 3600}

// Buckets for model latency (whole response, streams included).
var modelBuckets = []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120}

// Buckets for tool execution.
var executionBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New creates the series and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: counter("countersign_requests_total",
			"Proposed tool calls by how they were settled: approved, edited, rejected, responded, expired, cancelled (a human was asked, or cancelled a call in its cancel window), run_now, window_elapsed (review: after), auto, remembered (no human needed), refused (unknown tool or invalid arguments).", "tool", "outcome"),
		sampled: counter("countersign_sampled_reviews_total",
			"Calls that ran without a human and were posted for review (sample:), by outcome: posted, right (an approver found it right), wrong (marked wrong). wrong / posted is the sampled error rate.", "tool", "outcome"),
		markedWrong: counter("countersign_marked_wrong_total",
			"Settled requests an approver later marked wrong, by whether the call ran (ran=true: approved, or sampled, then marked wrong).", "tool", "ran"),
		decision: histogram("countersign_decision_seconds", decisionBuckets,
			"Time from an approval request to its final human decision.", "tool", "verdict"),
		expired: counter("countersign_expired_total",
			"Approval requests whose deadline passed without a decision (treated as a rejection).", "tool"),
		refusedClicks: counter("countersign_refused_clicks_total",
			"Clicks on approval cards that changed nothing, by reason (not_approver, self_approval, already_decided, ...).", "reason"),
		executions: counter("countersign_tool_executions_total",
			"Tool executions by outcome: ok, error, unknown (the process stopped mid-execution), abandoned (approved, but the caller had gone before claiming it: nothing ran).", "tool", "outcome"),
		executionTime: histogram("countersign_tool_execution_seconds", executionBuckets,
			"Tool execution latency.", "tool"),
		slackRequests: counter("countersign_slack_api_requests_total",
			"Slack Web API calls by method and HTTP status (\"error\" when no response arrived).", "method", "status"),
		slackErrors: counter("countersign_slack_api_errors_total",
			"Slack Web API calls that failed: transport error, HTTP status other than 2xx and 429, or a reply with \"ok\": false.", "method"),
		slackRateLimits: counter("countersign_slack_rate_limited_total",
			"Slack Web API calls answered with HTTP 429 (rate limited; retried after Retry-After).", "method"),
		modelRequests: counter("countersign_model_requests_total",
			"Requests to the OpenAI-compatible endpoint by HTTP status (\"error\" when no response arrived).", "status"),
		modelTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "countersign_model_request_seconds",
			Help:    "Model request latency, from sending the request until the response body was read (whole stream).",
			Buckets: modelBuckets,
		}),
		modelTokens: counter("countersign_model_tokens_total",
			"Tokens reported in the model's usage, by kind (prompt, completion).", "kind"),
		auditErrors: counter("countersign_audit_append_errors_total",
			"Audit records that could not be appended to the stream (Redis failed), by event.", "event"),
		apiRefusals: counter("countersign_api_refusals_total",
			"HTTP API calls refused, by code (unauthenticated, forbidden_tool, invalid_field, body_too_large, rate_limited, ...).", "code"),
		webhooks: counter("countersign_webhook_attempts_total",
			"Webhook delivery attempts by endpoint and outcome: delivered, failed (retried), gave_up (the last attempt failed).", "endpoint", "outcome"),
	}
	reg.MustRegister(m.apiRefusals, m.webhooks)
	reg.MustRegister(m.requests, m.decision, m.expired, m.refusedClicks, m.executions,
		m.executionTime, m.slackRequests, m.slackErrors, m.slackRateLimits,
		m.modelRequests, m.modelTime, m.modelTokens, m.auditErrors, m.sampled, m.markedWrong)
	return m
}

// counter makes a counter vector: one line of New per series, as
// docs/operations.md lists them.
func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// histogram makes a histogram vector with its buckets.
func histogram(name string, buckets []float64, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// Registry is where the series are registered; main makes one per process.
type Registry = prometheus.Registry

// NewRegistry is a registry with the Go runtime and process collectors.
func NewRegistry() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves the registry's series in the Prometheus text format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// RegisterPendingGauge exports countersign_pending_requests, read from count
// at scrape time (the store's number of pending requests). A scrape waits at
// most timeout for it; when count fails the gauge reads NaN, so a stale
// number never looks healthy.
func RegisterPendingGauge(reg prometheus.Registerer, count func(ctx context.Context) (int, error), timeout time.Duration) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "countersign_pending_requests",
		Help: "Approval requests waiting for a decision (NaN when the store could not be read).",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		n, err := count(ctx)
		if err != nil {
			return math.NaN()
		}
		return float64(n)
	}))
}

// pendingAges exports, from one read of the pending requests per scrape,
// countersign_oldest_pending_seconds (how long the oldest pending request
// has waited; 0 when none) and countersign_overdue_requests (pending
// requests past their deadline: the expiry sweeper should have expired
// them within a second). Both read NaN when the store cannot be read.
type pendingAges struct {
	pending func(ctx context.Context) ([]*approval.Request, error)
	now     func() time.Time
	timeout time.Duration
	oldest  *prometheus.Desc
	overdue *prometheus.Desc
}

// RegisterPendingAges registers a pendingAges on reg; pending returns the
// pending requests oldest first (store.Pending).
func RegisterPendingAges(reg prometheus.Registerer, pending func(ctx context.Context) ([]*approval.Request, error), now func() time.Time, timeout time.Duration) {
	reg.MustRegister(&pendingAges{pending: pending, now: now, timeout: timeout,
		oldest: prometheus.NewDesc("countersign_oldest_pending_seconds",
			"Age of the oldest approval request still waiting for a decision (0 when none; NaN when the store could not be read).", nil, nil),
		overdue: prometheus.NewDesc("countersign_overdue_requests",
			"Pending approval requests past their deadline, not yet expired (NaN when the store could not be read).", nil, nil),
	})
}

// Describe sends the two descriptors.
func (p *pendingAges) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.oldest
	ch <- p.overdue
}

// Collect reads the pending requests once, within the timeout.
func (p *pendingAges) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	reqs, err := p.pending(ctx)
	oldest, overdue := math.NaN(), math.NaN()
	if err == nil {
		now := p.now()
		oldest, overdue = 0, 0
		for _, r := range reqs {
			if age := now.Sub(r.Created).Seconds(); age > oldest {
				oldest = age
			}
			if !r.Deadline.IsZero() && now.After(r.Deadline) {
				overdue++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(p.oldest, prometheus.GaugeValue, oldest)
	ch <- prometheus.MustNewConstMetric(p.overdue, prometheus.GaugeValue, overdue)
}

var _ approval.Auditor = (*Auditor)(nil) // the one Append port, as the store's *Audit

// Auditor wraps an Appender and updates the metrics from every
// record that reached the stream. Bot and agent stay unaware of metrics: the
// audit trail already says everything that happens to a request.
//
// A record whose append failed is not counted, so the metrics agree with the
// audit stream.
type Auditor struct {
	next approval.Auditor
	m    *Metrics

	mu sync.Mutex // guards started
	// started maps a request id to the time of its executing entry, so that
	// executed/failed without duration_ms still give a latency. The process
	// that records executing also records the outcome; entries are removed
	// then, and the map is bounded by maxStarted.
	started map[string]time.Time
}

// maxStarted bounds Auditor.started (executions in flight in one
// process); beyond it latencies without duration_ms are not observed.
const maxStarted = 10000

// NewAuditor returns next instrumented with m.
func NewAuditor(next approval.Auditor, m *Metrics) *Auditor {
	return &Auditor{next: next, m: m, started: map[string]time.Time{}}
}

// Append appends r through the wrapped auditor, then observes it.
func (a *Auditor) Append(ctx context.Context, r approval.Record) (approval.Entry, error) {
	e, err := a.next.Append(ctx, r)
	if err != nil {
		a.m.auditErrors.WithLabelValues(string(r.Event)).Inc()
		return e, err
	}
	a.observe(e)
	return e, nil
}

// observe updates the series for one audit entry. It reads the (redacted)
// JSON data the stream holds, tolerating missing fields.
func (a *Auditor) observe(e approval.Entry) {
	m := a.m
	d := auditreport.ParseEventData(e)
	tool := e.Tool
	if tool == "" {
		tool = "unknown"
	}
	switch e.Event {
	case approval.EventAutoApproved:
		m.requests.WithLabelValues(tool, "auto").Inc()
	case approval.EventRemembered:
		m.requests.WithLabelValues(tool, "remembered").Inc()
	case approval.EventPreauthorized:
		m.requests.WithLabelValues(tool, "preauthorized").Inc()
	case approval.EventCallRefused:
		m.requests.WithLabelValues(tool, "refused").Inc()
	case approval.EventDecided:
		v := approval.Verdict(d.Verdict)
		if !v.Human() {
			// Expiry and cancellation are counted from their own events.
			return
		}
		m.requests.WithLabelValues(tool, auditreport.OutcomeOf(v)).Inc()
		if dur, ok := d.DecisionTime(e.Time); ok {
			m.decision.WithLabelValues(tool, string(v)).Observe(dur.Seconds())
		}
	case approval.EventExpired:
		m.requests.WithLabelValues(tool, "expired").Inc()
		m.expired.WithLabelValues(tool).Inc()
	case approval.EventCancelled:
		m.requests.WithLabelValues(tool, "cancelled").Inc()
	case approval.EventRunNow:
		m.requests.WithLabelValues(tool, "run_now").Inc()
		if dur, ok := d.DecisionTime(e.Time); ok {
			m.decision.WithLabelValues(tool, string(approval.VerdictRunNow)).Observe(dur.Seconds())
		}
	case approval.EventWindowElapsed:
		m.requests.WithLabelValues(tool, "window_elapsed").Inc()
	case approval.EventAbandoned:
		// Approved (counted then), but never run: its caller had gone.
		m.executions.WithLabelValues(tool, "abandoned").Inc()
	case approval.EventSampled:
		m.sampled.WithLabelValues(tool, "posted").Inc()
	case approval.EventSampleReviewed:
		m.sampled.WithLabelValues(tool, "right").Inc()
	case approval.EventMarkedWrong:
		ran := d.Sampled || approval.Verdict(d.Verdict).Runs()
		m.markedWrong.WithLabelValues(tool, strconv.FormatBool(ran)).Inc()
		if d.Sampled {
			m.sampled.WithLabelValues(tool, "wrong").Inc()
		}
	case approval.EventDecisionRefuse:
		m.refusedClicks.WithLabelValues(refusalReason(d)).Inc()
	case approval.EventAPIRefused:
		if ev, ok := approval.DecodeEvent(e).(*approval.APIRefusedEvent); ok && ev.Code != "" {
			// One entry stands for Count refusals without a valid key
			// (counted per source, written once a minute).
			m.apiRefusals.WithLabelValues(ev.Code).Add(float64(max(ev.Count, 1)))
		}
	case approval.EventWebhookSent, approval.EventWebhookFailed:
		if ev, ok := approval.DecodeEvent(e).(*approval.WebhookEvent); ok {
			outcome := "delivered"
			switch {
			case e.Event == approval.EventWebhookFailed && ev.GaveUp:
				outcome = "gave_up"
			case e.Event == approval.EventWebhookFailed:
				outcome = "failed"
			}
			m.webhooks.WithLabelValues(ev.Endpoint, outcome).Inc()
		}
	case approval.EventExecuting:
		if e.RequestID != "" {
			a.mu.Lock()
			if len(a.started) < maxStarted {
				a.started[e.RequestID] = e.Time
			}
			a.mu.Unlock()
		}
	case approval.EventExecuted, approval.EventFailed, approval.EventOutcomeUnknown:
		a.mu.Lock()
		start, ran := a.started[e.RequestID]
		delete(a.started, e.RequestID)
		a.mu.Unlock()
		if d.DurationMS != nil {
			ran = true
		}
		// A failure with no execution behind it (the request could not be
		// saved, the arguments differ from the approved ones) is not a tool
		// execution.
		if e.Event == approval.EventFailed && !ran {
			return
		}
		outcome := map[approval.Event]string{
			approval.EventExecuted:       "ok",
			approval.EventFailed:         "error",
			approval.EventOutcomeUnknown: "unknown",
		}[e.Event]
		m.executions.WithLabelValues(tool, outcome).Inc()
		switch {
		case e.Event == approval.EventOutcomeUnknown:
		case d.DurationMS != nil:
			m.executionTime.WithLabelValues(tool).Observe(*d.DurationMS / 1000)
		case !start.IsZero() && !e.Time.Before(start):
			m.executionTime.WithLabelValues(tool).Observe(e.Time.Sub(start).Seconds())
		}
	}
}

var reasonCode = regexp.MustCompile(`^[a-z][a-z0-9_]{0,39}$`)

// refusalReason returns a bounded label for a refused click: the data's
// "code", else its "reason" when that is a short snake_case code, else
// "other" (free text would make a series per sentence).
func refusalReason(d auditreport.EventData) string {
	for _, s := range []string{d.Code, d.Reason} {
		if reasonCode.MatchString(s) {
			return s
		}
	}
	return "other"
}

// slackTransport counts Slack Web API calls. The method is the last segment
// of the URL path (…/api/chat.postMessage). A reply is an error when the
// transport fails, the status is neither 2xx nor 429, or the JSON body says
// "ok": false; the body is inspected as the caller reads it, never
// buffered ahead of it.
type slackTransport struct {
	next http.RoundTripper
	m    *Metrics
}

// SlackTransport instruments next (nil means http.DefaultTransport).
func SlackTransport(next http.RoundTripper, m *Metrics) http.RoundTripper {
	next = cmp.Or(next, http.DefaultTransport)
	return &slackTransport{next: next, m: m}
}

var slackMethod = regexp.MustCompile(`^[a-zA-Z]+(\.[a-zA-Z]+)+$`)

// RoundTrip sends req and counts the outcome.
func (t *slackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	method := path.Base(req.URL.Path)
	if !slackMethod.MatchString(method) {
		method = "other"
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.m.slackRequests.WithLabelValues(method, "error").Inc()
		t.m.slackErrors.WithLabelValues(method).Inc()
		return nil, err
	}
	t.m.slackRequests.WithLabelValues(method, strconv.Itoa(resp.StatusCode)).Inc()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		t.m.slackRateLimits.WithLabelValues(method).Inc()
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		t.m.slackErrors.WithLabelValues(method).Inc()
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
		resp.Body = newTeeBody(resp.Body, 64<<10, func(head []byte, _ bool) {
			if ok, found := slackOK(head); found && !ok {
				t.m.slackErrors.WithLabelValues(method).Inc()
			}
		})
	}
	return resp, nil
}

// slackOK finds the top-level "ok" field of a Slack reply in head, which
// may be cut short.
func slackOK(head []byte) (ok, found bool) {
	dec := json.NewDecoder(bytes.NewReader(head))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false, false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return false, false
		}
		if key == "ok" {
			var v bool
			if err := dec.Decode(&v); err != nil {
				return false, false
			}
			return v, true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false, false
		}
	}
	return false, false
}

// modelTransport times requests to the OpenAI-compatible endpoint and
// counts the tokens in the replies' usage: from the JSON body, or from the
// data: lines of a stream (stream_options.include_usage). The body reaches
// the caller unchanged and as it arrives.
type modelTransport struct {
	next http.RoundTripper
	m    *Metrics
	now  func() time.Time
}

// ModelTransport instruments next (nil means http.DefaultTransport).
func ModelTransport(next http.RoundTripper, m *Metrics, now func() time.Time) http.RoundTripper {
	next = cmp.Or(next, http.DefaultTransport)
	now = approval.FuncOr(now, time.Now)
	return &modelTransport{next: next, m: m, now: now}
}

// maxUsageBody bounds how much of a non-streamed reply is kept to find its
// usage; a larger reply is passed through but its tokens are not counted.
const maxUsageBody = 4 << 20

// RoundTrip sends req, and observes latency and usage once the body is read.
func (t *modelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := t.now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.m.modelRequests.WithLabelValues("error").Inc()
		t.m.modelTime.Observe(t.now().Sub(start).Seconds())
		return nil, err
	}
	t.m.modelRequests.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
	done := func() { t.m.modelTime.Observe(t.now().Sub(start).Seconds()) }
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &sseUsageBody{ReadCloser: resp.Body, done: done, usage: t.countUsage}
		return resp, nil
	}
	resp.Body = newTeeBody(resp.Body, maxUsageBody, func(body []byte, complete bool) {
		done()
		if complete && resp.StatusCode/100 == 2 {
			t.countUsage(body)
		}
	})
	return resp, nil
}

// countUsage adds the tokens of a chat completion (or stream chunk) to the
// counters; JSON without usage counts nothing.
func (t *modelTransport) countUsage(body []byte) {
	var r struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		return
	}
	t.m.modelTokens.WithLabelValues("prompt").Add(float64(r.Usage.PromptTokens))
	t.m.modelTokens.WithLabelValues("completion").Add(float64(r.Usage.CompletionTokens))
}

// teeBody passes a response body through and keeps its first max bytes.
// When the caller reaches EOF or closes the body (whichever comes first),
// done gets the kept bytes and whether they are the whole body. JSON
// decoders often stop at the end of the value without reading EOF, so Close
// counts too.
type teeBody struct {
	rc       io.ReadCloser
	buf      bytes.Buffer
	max      int
	overflow bool
	eof      bool
	once     sync.Once
	done     func(kept []byte, complete bool)
}

func newTeeBody(rc io.ReadCloser, max int, done func([]byte, bool)) *teeBody {
	return &teeBody{rc: rc, max: max, done: done}
}

// Read reads from the wrapped body, keeping a copy.
func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 && !b.overflow {
		if b.buf.Len()+n > b.max {
			b.overflow = true
			b.buf.Write(p[:b.max-b.buf.Len()])
		} else {
			b.buf.Write(p[:n])
		}
	}
	if errors.Is(err, io.EOF) {
		b.eof = true
		b.finish()
	}
	return n, err
}

// Close closes the wrapped body and reports what was read.
func (b *teeBody) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

func (b *teeBody) finish() {
	b.once.Do(func() {
		complete := !b.overflow
		if !b.eof {
			// Closed before EOF: whole only if what was kept parses.
			complete = complete && json.Valid(b.buf.Bytes())
		}
		b.done(b.buf.Bytes(), complete)
	})
}

// sseUsageBody passes a server-sent-event stream through, looking at each
// complete "data:" line for a usage object. It keeps at most one partial
// line.
type sseUsageBody struct {
	io.ReadCloser
	line  []byte
	once  sync.Once
	done  func()
	usage func([]byte)
}

// Read reads from the stream and scans the lines read so far.
func (b *sseUsageBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.scan(p[:n])
	if errors.Is(err, io.EOF) {
		b.finish()
	}
	return n, err
}

// Close closes the stream.
func (b *sseUsageBody) Close() error {
	err := b.ReadCloser.Close()
	b.finish()
	return err
}

const maxSSELine = 1 << 20

func (b *sseUsageBody) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(b.line)+len(p) <= maxSSELine {
				b.line = append(b.line, p...)
			} else {
				b.line = b.line[:0] // too long to be a usage chunk worth keeping
			}
			return
		}
		line := append(b.line, p[:i]...)
		b.line = b.line[:0]
		p = p[i+1:]
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if ok && bytes.Contains(data, []byte(`"usage"`)) {
			b.usage(bytes.TrimSpace(data))
		}
	}
}

func (b *sseUsageBody) finish() { b.once.Do(b.done) }

// Check is one readiness condition; its error says what is wrong.
type Check func(ctx context.Context) error

// readyTimeout bounds a readiness answer: a check that has not answered by
// then has failed.
const readyTimeout = 3 * time.Second

// ReadyHandler answers 200 "ok" when every check passes within 3 s
// (readyTimeout) and 503 with the failures otherwise. With no checks it is
// a liveness probe (/healthz: the process serves HTTP).
func ReadyHandler(checks ...Check) http.Handler { return readyHandler(readyTimeout, checks, nil) }

// Detail lists what a readiness answer tells without failing on it: a
// degraded part (an MCP upstream that is down) the replica still serves
// around. Taking the replica out of service would not bring it back.
type Detail func() []string

// ReadyWithDetails is ReadyHandler whose body also lists details' lines
// after "ok" (or after the failures); they never fail the probe.
func ReadyWithDetails(checks []Check, details ...Detail) http.Handler {
	return readyHandler(readyTimeout, checks, details)
}

// readyHandler is ReadyHandler with its timeout; tests shorten it.
func readyHandler(timeout time.Duration, checks []Check, details []Detail) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Go(func() { errs[i] = c(ctx) })
		}
		wg.Wait() // each check honours ctx, so this ends within the timeout
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := errors.Join(errs...); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready\n%v\n", err)
		} else {
			fmt.Fprintln(w, "ok")
		}
		for _, d := range details {
			for _, line := range d() {
				fmt.Fprintln(w, line)
			}
		}
	})
}

// Named prefixes check's errors with name (e.g. "slack auth.test").
func Named(name string, check Check) Check {
	return func(ctx context.Context) error {
		if err := check(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
}

// Cached remembers a passing result of check for ttl, so that probes
// every few seconds from every replica do not each call Slack's auth.test.
// Failures are not cached: a recovering dependency is seen at the next
// probe.
func Cached(check Check, ttl time.Duration, now func() time.Time) Check {
	var (
		mu     sync.Mutex // guards okAt
		okAt   time.Time
		hasRun bool
	)
	return func(ctx context.Context) error {
		mu.Lock()
		fresh := hasRun && now().Sub(okAt) < ttl
		mu.Unlock()
		if fresh {
			return nil
		}
		if err := check(ctx); err != nil {
			return err
		}
		mu.Lock()
		okAt, hasRun = now(), true
		mu.Unlock()
		return nil
	}
}
