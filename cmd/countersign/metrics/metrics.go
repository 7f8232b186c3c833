// Package metrics is Prometheus' only home: the series Countersign exports,
// fed from the typed audit events (Auditor wraps the audit appender and
// reads each entry through approval.DecodeEvent), from the Slack and model
// calls the bot's and the agent's transports tell it of (Metrics is their
// bot.SlackCalls and agent.ModelCalls, satisfied without importing either),
// and from gauges read at scrape time (pending requests, the audit
// stream's size, MCP upstreams).
package metrics

import (
	"context"
	"math"
	"net/http"
	"regexp"
	"strconv"
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
// Nothing in bot or agent knows about Prometheus: the series are fed from
// the audit records (Auditor) and from the calls the Slack and model
// transports tell of (the methods below). See docs/operations.md for the
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

// pendingAges exports, per scrape, countersign_oldest_pending_seconds (how
// long the oldest pending request has waited; 0 when none) and
// countersign_overdue_requests (pending requests past their deadline: the
// expiry sweeper should have expired them within a second). Both read NaN
// when the store cannot be read.
type pendingAges struct {
	ages    PendingAges
	now     func() time.Time
	timeout time.Duration
	oldest  *prometheus.Desc
	overdue *prometheus.Desc
}

// PendingAges returns when the oldest pending request was created (zero
// when none) and how many pending requests are past their deadline at now
// (store.PendingAges: from the indexes, not every record, so a scrape
// costs the same with 10,000 pending as with none).
type PendingAges func(ctx context.Context, now time.Time) (oldest time.Time, overdue int, err error)

// RegisterPendingAges registers a pendingAges on reg.
func RegisterPendingAges(reg prometheus.Registerer, ages PendingAges, now func() time.Time, timeout time.Duration) {
	reg.MustRegister(&pendingAges{ages: ages, now: now, timeout: timeout,
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

// Collect reads the ages once, within the timeout.
func (p *pendingAges) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	now := p.now()
	first, due, err := p.ages(ctx, now)
	oldest, overdue := math.NaN(), math.NaN()
	if err == nil {
		oldest, overdue = 0, float64(due)
		if !first.IsZero() && now.After(first) {
			oldest = now.Sub(first).Seconds()
		}
	}
	ch <- prometheus.MustNewConstMetric(p.oldest, prometheus.GaugeValue, oldest)
	ch <- prometheus.MustNewConstMetric(p.overdue, prometheus.GaugeValue, overdue)
}

// Auditor updates the metrics from every entry the audit wrote, told
// after the fact (store.AuditOptions.Observer): nothing on the way to
// Redis passes through it. Bot and agent stay unaware of metrics: the
// audit trail already says everything that happens to a request.
//
// An append that failed is not counted as what it describes, so the
// metrics agree with the audit stream.
type Auditor struct {
	m *Metrics

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

// NewAuditor returns the audit's observer that updates m.
func NewAuditor(m *Metrics) *Auditor {
	return &Auditor{m: m, started: map[string]time.Time{}}
}

// Appended observes an entry written to the stream.
func (a *Auditor) Appended(e approval.Entry) { a.observe(e) }

// Failed counts an append of ev that failed.
func (a *Auditor) Failed(ev approval.Event) {
	a.m.auditErrors.WithLabelValues(string(ev)).Inc()
}

// observe updates the series for one audit entry. The events whose series
// need more than the entry's fields (a verdict, a decision time, a
// refusal's code, a duration) read the (redacted) JSON data the stream
// holds, tolerating missing fields (auditreport.ParseEventData); the
// others are counted with no decoding on their writer's way back.
func (a *Auditor) observe(e approval.Entry) {
	m := a.m
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
		d := auditreport.ParseEventData(e)
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
		if dur, ok := auditreport.ParseEventData(e).DecisionTime(e.Time); ok {
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
		d := auditreport.ParseEventData(e)
		ran := d.Sampled || approval.Verdict(d.Verdict).Runs()
		m.markedWrong.WithLabelValues(tool, strconv.FormatBool(ran)).Inc()
		if d.Sampled {
			m.sampled.WithLabelValues(tool, "wrong").Inc()
		}
	case approval.EventDecisionRefuse:
		m.refusedClicks.WithLabelValues(refusalReason(auditreport.ParseEventData(e))).Inc()
	case approval.EventAPIRefused:
		if ev, ok := approval.DecodeEvent(e).(*approval.APIRefusedEvent); ok && ev.Code != "" {
			// One entry stands for Count refusals (counted per source,
			// or per key and code, and written once a minute).
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
		d := auditreport.ParseEventData(e)
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

// SlackRequest counts a Slack Web API call by method and status: Metrics
// is the bot's SlackCalls (bot.Transport).
func (m *Metrics) SlackRequest(method, status string) {
	m.slackRequests.WithLabelValues(method, status).Inc()
}

// SlackError counts a failed Slack Web API call.
func (m *Metrics) SlackError(method string) { m.slackErrors.WithLabelValues(method).Inc() }

// SlackRateLimited counts a Slack Web API call answered with HTTP 429.
func (m *Metrics) SlackRateLimited(method string) { m.slackRateLimits.WithLabelValues(method).Inc() }

// ModelRequest counts a request to the model endpoint by status: Metrics
// is the agent's ModelCalls (agent.ModelTransport).
func (m *Metrics) ModelRequest(status string) { m.modelRequests.WithLabelValues(status).Inc() }

// ModelTime observes one model request's latency.
func (m *Metrics) ModelTime(d time.Duration) { m.modelTime.Observe(d.Seconds()) }

// ModelTokens adds the tokens a reply's usage reported.
func (m *Metrics) ModelTokens(prompt, completion int) {
	m.modelTokens.WithLabelValues("prompt").Add(float64(prompt))
	m.modelTokens.WithLabelValues("completion").Add(float64(completion))
}
