package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval/bodytap"
	"github.com/countersign/countersign/approval/option"
)

// ModelCalls is told of every request to the OpenAI-compatible endpoint,
// for the metrics (cmd/countersign wires the Prometheus series; the agent
// knows nothing of Prometheus).
type ModelCalls interface {
	// ModelRequest: one request, by HTTP status ("error" when no response
	// arrived).
	ModelRequest(status string)
	// ModelTime: from sending the request until its body was read (the
	// whole stream), or until the transport failed.
	ModelTime(d time.Duration)
	// ModelTokens: the usage a reply (or a stream's usage chunk) reported.
	ModelTokens(prompt, completion int)
}

// modelTransport times requests to the OpenAI-compatible endpoint and
// reads the tokens of the replies' usage: from the JSON body, or from the
// data: lines of a stream (stream_options.include_usage). The body reaches
// the caller unchanged and as it arrives.
type modelTransport struct {
	next  http.RoundTripper
	calls ModelCalls
	now   func() time.Time
}

// ModelTransport is next (nil means http.DefaultTransport) telling calls of
// each model request: the HTTP client of the go-openai client.
func ModelTransport(next http.RoundTripper, calls ModelCalls, now func() time.Time) http.RoundTripper {
	return &modelTransport{next: cmp.Or(next, http.DefaultTransport), calls: calls, now: option.FuncOr(now, time.Now)}
}

// maxSSELine bounds a line of a stream kept to find its usage: a longer
// one is not a usage chunk worth keeping.
const maxSSELine = 1 << 20

// maxUsageBody bounds how much of a non-streamed reply is kept to find its
// usage; a larger reply is passed through but its tokens are not counted.
const maxUsageBody = 4 << 20

// RoundTrip sends req, and tells the latency and usage once the body is read.
func (t *modelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := t.now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.calls.ModelRequest("error")
		t.calls.ModelTime(t.now().Sub(start))
		return nil, err
	}
	t.calls.ModelRequest(strconv.Itoa(resp.StatusCode))
	done := func() { t.calls.ModelTime(t.now().Sub(start)) }
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = bodytap.Lines(resp.Body, maxSSELine, func(line []byte) {
			data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
			if ok && bytes.Contains(data, []byte(`"usage"`)) {
				t.countUsage(bytes.TrimSpace(data))
			}
		}, done)
		return resp, nil
	}
	resp.Body = bodytap.Head(resp.Body, maxUsageBody, func(body []byte, cut, eof bool) {
		done()
		// Closed before EOF: whole only if what was kept parses.
		complete := !cut && (eof || json.Valid(body))
		if complete && resp.StatusCode/100 == 2 {
			t.countUsage(body)
		}
	})
	return resp, nil
}

// countUsage tells the tokens of a chat completion (or stream chunk); JSON
// without usage tells nothing.
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
	t.calls.ModelTokens(r.Usage.PromptTokens, r.Usage.CompletionTokens)
}
