package agent_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent"
)

// modelCalls records what the model transport tells.
type modelCalls struct {
	mu       sync.Mutex // guards the fields below
	statuses []string
	times    int
	tokens   [][2]int
}

func (c *modelCalls) ModelRequest(status string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statuses = append(c.statuses, status)
}

func (c *modelCalls) ModelTime(time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times++
}

func (c *modelCalls) ModelTokens(prompt, completion int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens = append(c.tokens, [2]int{prompt, completion})
}

// TestModelTransportBodyUnchanged: a reply larger than the usage buffer
// passes through whole; its tokens are not counted, its time is. (Usage
// from plain and streamed replies through the real go-openai client is
// checked by the metrics' flow test, TestMetricsScrapeAfterFlow.)
func TestModelTransportBodyUnchanged(t *testing.T) {
	t.Parallel()
	big := `{"usage":{"prompt_tokens":1,"completion_tokens":1},"pad":"` + strings.Repeat("x", agent.MaxUsageBody) + `"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, big)
	}))
	defer srv.Close()
	calls := &modelCalls{}
	c := &http.Client{Transport: agent.ModelTransport(nil, calls, nil)}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != big {
		t.Fatalf("body through the transport: %d bytes, %v; want %d bytes unchanged", len(body), err, len(big))
	}
	calls.mu.Lock()
	defer calls.mu.Unlock()
	if len(calls.tokens) > 0 {
		t.Errorf("tokens counted from an over-long reply: %v", calls.tokens)
	}
	if calls.times != 1 || len(calls.statuses) != 1 || calls.statuses[0] != "200" {
		t.Errorf("times %d, statuses %v; want one request, 200, timed once", calls.times, calls.statuses)
	}
}
