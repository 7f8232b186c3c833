package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	openai "github.com/sashabaranov/go-openai"
	"github.com/slack-go/slack"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// scrape GETs /metrics from h and returns every sample as
// `name{labels}` → value, labels as the text format prints them (in
// declaration order, le last).
func scrape(t *testing.T, h http.Handler) map[string]float64 {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// closedAudit is an audit observed by m whose every append fails: its
// Redis client is closed (redis.ErrClosed).
func closedAudit(t *testing.T, m *Metrics) *store.Audit {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	if err := rdb.Close(); err != nil {
		t.Fatal(err)
	}
	return store.NewAudit(rdb, store.AuditOptions{Observer: NewAuditor(m)})
}

func TestMetricsScrapeAfterFlow(t *testing.T) {
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	m := New(reg)
	pending := 3
	RegisterPendingGauge(reg, func(context.Context) (int, error) { return pending, nil }, time.Second)

	// (a) audit records onto a real audit stream, observed.
	rdb, prefix := storetest.New(t)
	clock := clocktest.New(clocktest.Opts{Start: time.Now()})
	auditor := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Now: clock.Now, Observer: NewAuditor(m)})
	created := clock.Now().Add(-90 * time.Second).UTC().Format(time.RFC3339Nano)
	for _, r := range []approval.Record{
		{Event: approval.EventProposed, Tool: "refund"},
		{Event: approval.EventAutoApproved, Tool: "lookup_order"},
		{Event: approval.EventRemembered, Tool: "refund"},
		{Event: approval.EventCallRefused, Tool: "bogus", Data: map[string]any{"error": "unknown tool"}},
		{Event: approval.EventRequested, RequestID: "req_1", Tool: "refund"},
		{Event: approval.EventDecisionRefuse, RequestID: "req_1", Tool: "refund", Data: map[string]any{"verdict": "approve", "reason": "self_approval"}},
		{Event: approval.EventDecisionRefuse, RequestID: "req_1", Tool: "refund", Data: map[string]any{"verdict": "approve", "reason": "Request already approved by U1 at 10:00"}},
		{Event: approval.EventDecisionRefuse, RequestID: "req_1", Tool: "refund", Data: map[string]any{"code": "not_approver", "reason": "You are not an approver."}},
		{Event: approval.EventApprovalVote, RequestID: "req_1", Tool: "refund", Data: map[string]any{"verdict": "approve", "decision_ms": 1000}},
		{Event: approval.EventDecided, RequestID: "req_1", Tool: "refund", Data: map[string]any{"verdict": "approve", "decision_ms": 4000}},
		{Event: approval.EventDecided, RequestID: "req_2", Tool: "refund", Data: map[string]any{"verdict": "edit", "created": created}},
		{Event: approval.EventDecided, RequestID: "req_3", Tool: "send_email", Data: map[string]any{"verdict": "reject", "reason": "no", "decision_ms": 2500}},
		{Event: approval.EventDecided, RequestID: "req_4", Tool: "send_email", Data: map[string]any{"verdict": "expire"}},
		{Event: approval.EventExpired, RequestID: "req_4", Tool: "send_email"},
		{Event: approval.EventCancelled, RequestID: "req_5", Tool: "refund"},
		{Event: approval.EventExecuted, RequestID: "req_1", Tool: "refund", Data: map[string]any{"result": "ok", "duration_ms": 200}},
		{Event: approval.EventExecuted, RequestID: "req_2", Tool: "refund", Data: map[string]any{"result": "ok", "duration_ms": 40}},
		{Event: approval.EventFailed, RequestID: "req_6", Tool: "refund", Data: map[string]any{"error": "500", "duration_ms": 3000}},
		{Event: approval.EventExecuting, RequestID: "req_7", Tool: "refund"},
		{Event: approval.EventOutcomeUnknown, RequestID: "req_7", Tool: "refund"},
		// No duration_ms: the latency is the time since this process's executing entry.
		{Event: approval.EventExecuting, RequestID: "req_8", Tool: "refund"},
		{Event: approval.EventExecuted, RequestID: "req_8", Tool: "refund", Data: map[string]any{"result": "ok"}},
		// A failure before any execution is not a tool execution.
		{Event: approval.EventFailed, RequestID: "req_9", Tool: "refund", Data: map[string]any{"error": "the approval request could not be saved"}},
	} {
		if r.RequestID == "req_8" && r.Event == approval.EventExecuted {
			clock.Set(clock.Now().Add(1500 * time.Millisecond))
		}
		if _, err := auditor.Append(ctx, r); err != nil {
			t.Fatalf("Append(%s) = %v", r.Event, err)
		}
	}
	// A record that never reached the stream is not counted.
	if _, err := closedAudit(t, m).Append(ctx, approval.Record{Event: approval.EventExpired, Tool: "refund"}); err == nil {
		t.Fatal("Append through a failing auditor = nil error")
	}

	// (c) Slack Web API calls through the real slack-go client.
	slackSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		switch r.URL.Path {
		case "/api/auth.test":
			fmt.Fprint(w, `{"ok":true,"url":"https://x.slack.com/","team":"T","user":"bot","team_id":"T1","user_id":"U1","bot_id":"B1"}`)
		case "/api/chat.postMessage":
			fmt.Fprint(w, `{"ok":true,"channel":"C1","ts":"1.2"}`)
		case "/api/chat.update":
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"ok":false,"error":"ratelimited"}`)
		case "/api/conversations.info":
			fmt.Fprint(w, `{"ok":false,"error":"channel_not_found"}`)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer slackSrv.Close()
	api := slack.New("xoxb-test", slack.OptionAPIURL(slackSrv.URL+"/api/"),
		slack.OptionHTTPClient(&http.Client{Transport: bot.Transport(nil, m)}))
	if _, err := api.AuthTestContext(ctx); err != nil {
		t.Fatalf("AuthTest = %v", err)
	}
	for range 2 {
		if _, _, err := api.PostMessageContext(ctx, "C1", slack.MsgOptionText("hi", false)); err != nil {
			t.Fatalf("PostMessage = %v", err)
		}
	}
	var rl *slack.RateLimitedError
	if _, _, _, err := api.UpdateMessageContext(ctx, "C1", "1.2", slack.MsgOptionText("x", false)); !errors.As(err, &rl) {
		t.Fatalf("UpdateMessage = %v, want *slack.RateLimitedError", err)
	}
	if _, err := api.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: "C9"}); err == nil {
		t.Fatal("GetConversationInfo = nil error, want channel_not_found")
	}
	if _, err := api.GetUserInfoContext(ctx, "U1"); err == nil {
		t.Fatal("GetUserInfo = nil error, want a 500")
	}
	dead := slack.New("xoxb-test", slack.OptionAPIURL("http://127.0.0.1:1/api/"),
		slack.OptionHTTPClient(&http.Client{Transport: bot.Transport(nil, m)}))
	if _, err := dead.AuthTestContext(ctx); err == nil {
		t.Fatal("AuthTest against nothing = nil error")
	}

	// (d) model requests through the real go-openai client: one plain, one streamed.
	modelSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, chunk := range []string{
				`{"id":"c2","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}`,
				`{"id":"c2","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`,
				`{"id":"c2","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":7,"total_tokens":27}}`,
				`[DONE]`,
			} {
				fmt.Fprintf(w, "data: %s\n\n", chunk)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
	}))
	defer modelSrv.Close()
	modelClock := clocktest.New(clocktest.Opts{Step: 2 * time.Second}) // every request lasts 2 s
	cfg := openai.DefaultConfig("sk-test")
	cfg.BaseURL = modelSrv.URL + "/v1"
	cfg.HTTPClient = &http.Client{Transport: agent.ModelTransport(nil, m, modelClock.Now)}
	client := openai.NewClientWithConfig(cfg)
	req := openai.ChatCompletionRequest{Model: "m", Messages: []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}}
	resp, err := client.CreateChatCompletion(ctx, req)
	if err != nil || resp.Choices[0].Message.Content != "Hello" || resp.Usage.PromptTokens != 12 {
		t.Fatalf("CreateChatCompletion = %+v, %v", resp, err)
	}
	req.Stream = true
	req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	stream, err := client.CreateChatCompletionStream(ctx, req)
	if err != nil {
		t.Fatalf("CreateChatCompletionStream = %v", err)
	}
	var text string
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream.Recv = %v", err)
		}
		if len(chunk.Choices) > 0 {
			text += chunk.Choices[0].Delta.Content
		}
	}
	stream.Close()
	if text != "Hello" {
		t.Errorf("streamed text = %q, want Hello (the stream must reach the caller intact)", text)
	}

	got := scrape(t, Handler(reg))
	want := map[string]float64{
		`countersign_requests_total{outcome="auto",tool="lookup_order"}`:   1,
		`countersign_requests_total{outcome="remembered",tool="refund"}`:   1,
		`countersign_requests_total{outcome="refused",tool="bogus"}`:       1,
		`countersign_requests_total{outcome="approved",tool="refund"}`:     1,
		`countersign_requests_total{outcome="edited",tool="refund"}`:       1,
		`countersign_requests_total{outcome="rejected",tool="send_email"}`: 1,
		`countersign_requests_total{outcome="expired",tool="send_email"}`:  1,
		`countersign_requests_total{outcome="cancelled",tool="refund"}`:    1,
		`countersign_expired_total{tool="send_email"}`:                     1,

		`countersign_decision_seconds_count{tool="refund",verdict="approve"}`:                1,
		`countersign_decision_seconds_sum{tool="refund",verdict="approve"}`:                  4,
		`countersign_decision_seconds_bucket{tool="refund",verdict="approve",le="5"}`:        1,
		`countersign_decision_seconds_bucket{tool="refund",verdict="approve",le="2"}`:        0,
		`countersign_decision_seconds_count{tool="refund",verdict="edit"}`:                   1,
		`countersign_decision_seconds_bucket{tool="refund",verdict="edit",le="60"}`:          0,
		`countersign_decision_seconds_bucket{tool="refund",verdict="edit",le="120"}`:         1,
		`countersign_decision_seconds_sum{tool="send_email",verdict="reject"}`:               2.5,
		`countersign_refused_clicks_total{reason="self_approval"}`:                           1,
		`countersign_refused_clicks_total{reason="other"}`:                                   1,
		`countersign_refused_clicks_total{reason="not_approver"}`:                            1,
		`countersign_tool_executions_total{outcome="ok",tool="refund"}`:                      3,
		`countersign_tool_executions_total{outcome="error",tool="refund"}`:                   1,
		`countersign_tool_executions_total{outcome="unknown",tool="refund"}`:                 1,
		`countersign_tool_execution_seconds_count{tool="refund"}`:                            4,
		`countersign_tool_execution_seconds_sum{tool="refund"}`:                              4.74,
		`countersign_tool_execution_seconds_bucket{tool="refund",le="0.05"}`:                 1,
		`countersign_pending_requests`:                                                       3,
		`countersign_slack_api_requests_total{method="auth.test",status="200"}`:              1,
		`countersign_slack_api_requests_total{method="auth.test",status="error"}`:            1,
		`countersign_slack_api_requests_total{method="chat.postMessage",status="200"}`:       2,
		`countersign_slack_api_requests_total{method="chat.update",status="429"}`:            1,
		`countersign_slack_api_requests_total{method="conversations.info",status="200"}`:     1,
		`countersign_slack_api_requests_total{method="users.info",status="500"}`:             1,
		`countersign_slack_api_errors_total{method="auth.test"}`:                             1,
		`countersign_slack_api_errors_total{method="conversations.info"}`:                    1,
		`countersign_slack_api_errors_total{method="users.info"}`:                            1,
		`countersign_slack_rate_limited_total{method="chat.update"}`:                         1,
		`countersign_model_requests_total{status="200"}`:                                     2,
		`countersign_model_request_seconds_count`:                                            2,
		`countersign_model_request_seconds_sum`:                                              4,
		`countersign_model_request_seconds_bucket{le="2"}`:                                   2,
		`countersign_model_request_seconds_bucket{le="1"}`:                                   0,
		`countersign_model_tokens_total{kind="prompt"}`:                                      32,
		`countersign_model_tokens_total{kind="completion"}`:                                  12,
		`countersign_requests_total{outcome="expired",tool="refund"}`:                        -1, // the failed append
		`countersign_slack_api_errors_total{method="chat.postMessage"}`:                      -1,
		`countersign_slack_api_errors_total{method="chat.update"}`:                           -1,
		`countersign_decision_seconds_count{tool="send_email",verdict="expire"}`:             -1,
		`countersign_requests_total{outcome="approved",tool="lookup_order"}`:                 -1,
		`countersign_decision_seconds_bucket{tool="refund",verdict="approve",le="+Inf"}`:     1,
		`countersign_tool_execution_seconds_bucket{tool="refund",le="+Inf"}`:                 4,
		`countersign_decision_seconds_count{tool="refund",verdict="approval_counted"}`:       -1,
		`countersign_requests_total{outcome="other",tool="refund"}`:                          -1,
		`countersign_requests_total{outcome="approved",tool="send_email"}`:                   -1,
		`countersign_decision_seconds_count{tool="send_email",verdict="reject"}`:             1,
		`countersign_decision_seconds_bucket{tool="send_email",verdict="reject",le="2"}`:     0,
		`countersign_decision_seconds_bucket{tool="send_email",verdict="reject",le="5"}`:     1,
		`countersign_slack_api_requests_total{method="chat.postMessage",status="error"}`:     -1,
		`countersign_tool_execution_seconds_bucket{tool="refund",le="5"}`:                    4,
		`countersign_tool_execution_seconds_bucket{tool="refund",le="2.5"}`:                  3,
		`countersign_model_request_seconds_bucket{le="+Inf"}`:                                2,
		`countersign_requests_total{outcome="expired",tool="unknown"}`:                       -1,
		`countersign_refused_clicks_total{reason="Request already approved by U1 at 10:00"}`: -1,
	}
	for k, w := range want {
		v, ok := got[k]
		switch {
		case w < 0 && ok:
			t.Errorf("/metrics has %s = %v, want no such series", k, v)
		case w >= 0 && !ok:
			t.Errorf("/metrics lacks %s (want %v)", k, w)
		case w >= 0 && math.Abs(v-w) > 1e-9:
			t.Errorf("/metrics %s = %v, want %v", k, v, w)
		}
	}
	// Edit: decided 90 s after created (from the data).
	if v := got[`countersign_decision_seconds_sum{tool="refund",verdict="edit"}`]; math.Abs(v-90) > 1e-6 {
		t.Errorf("edit decision seconds = %v, want about 90", v)
	}
	if t.Failed() {
		for k, v := range got {
			if strings.HasPrefix(k, "countersign_") {
				t.Logf("%s %v", k, v)
			}
		}
	}

	// The pending gauge reads the store at scrape time; NaN when it fails.
	pending = 5
	if v := scrape(t, Handler(reg))["countersign_pending_requests"]; v != 5 {
		t.Errorf("countersign_pending_requests = %v after the count changed, want 5", v)
	}
	reg2 := prometheus.NewRegistry()
	RegisterPendingGauge(reg2, func(context.Context) (int, error) { return 0, redis.ErrClosed }, time.Second)
	if v := scrape(t, Handler(reg2))["countersign_pending_requests"]; !math.IsNaN(v) {
		t.Errorf("countersign_pending_requests = %v when the store fails, want NaN", v)
	}
}

func TestMetricsPendingAges(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name                string
		oldest              time.Time
		overdue             int
		err                 error
		wantOldest, wantDue float64 // NaN: unreadable
	}{
		{"none pending", time.Time{}, 0, nil, 0, 0},
		{"oldest 90 s ago, one overdue", now.Add(-90 * time.Second), 1, nil, 90, 1},
		{"oldest created by a clock ahead", now.Add(time.Second), 0, nil, 0, 0},
		{"store unreadable", time.Time{}, 0, redis.ErrClosed, math.NaN(), math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			RegisterPendingAges(reg, func(_ context.Context, at time.Time) (time.Time, int, error) {
				if !at.Equal(now) {
					t.Errorf("ages asked at %v, want the clock's %v", at, now)
				}
				return tt.oldest, tt.overdue, tt.err
			}, func() time.Time { return now }, time.Second)
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range fams {
				got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
			for name, want := range map[string]float64{"countersign_oldest_pending_seconds": tt.wantOldest, "countersign_overdue_requests": tt.wantDue} {
				if g := got[name]; g != want && !(math.IsNaN(g) && math.IsNaN(want)) {
					t.Errorf("%s = %v, want %v", name, g, want)
				}
			}
		})
	}
}

func TestMetricsAuditAppendErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := closedAudit(t, New(reg))
	for _, ev := range []approval.Event{approval.EventDecided, approval.EventDecided, approval.EventExecuted} {
		if _, err := a.Append(t.Context(), approval.Record{Event: ev, Tool: "refund"}); !errors.Is(err, redis.ErrClosed) {
			t.Fatalf("Append(%s) = %v, want the store's error", ev, err)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "countersign_audit_append_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if got["decided"] != 2 || got["executed"] != 1 || len(got) != 2 {
		t.Errorf("countersign_audit_append_errors_total = %v, want decided 2, executed 1", got)
	}
}

// TestMetricsAppendWake: an entry appended with its wake-up behind it
// (store.Audit.AppendWake, as the ledger writes a final transition's) is
// observed as any other; an audit that cannot push the wake-up reports it
// not pushed, and its failure is counted.
func TestMetricsAppendWake(t *testing.T) {
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	m := New(reg)
	rdb, prefix := storetest.New(t)
	st := store.New(rdb, store.Options{Prefix: prefix})
	t.Cleanup(func() { _ = st.Close() })
	a := store.NewAudit(rdb, store.AuditOptions{Stream: prefix + ":{audit}", Wakes: st, Observer: NewAuditor(m)})
	rec := approval.Record{Event: approval.EventDecided, RequestID: "req_1", Tool: "refund", Data: map[string]any{"verdict": "approve"}}
	if _, _, err := a.AppendWake(ctx, rec, "req_1", approval.StatusApproved); err != nil {
		t.Fatalf("AppendWake = %v", err)
	}
	if _, woke, err := closedAudit(t, m).AppendWake(ctx, rec, "req_1", approval.StatusApproved); woke || !errors.Is(err, redis.ErrClosed) {
		t.Errorf("AppendWake through an auditor without wake-ups = %v, %v; want not pushed, the store's error", woke, err)
	}
	got := map[string]float64{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, mm := range f.GetMetric() {
			got[f.GetName()] += mm.GetCounter().GetValue()
		}
	}
	if got["countersign_requests_total"] != 1 || got["countersign_audit_append_errors_total"] != 1 {
		t.Errorf("requests %v, append errors %v; want 1 and 1", got["countersign_requests_total"], got["countersign_audit_append_errors_total"])
	}
}
