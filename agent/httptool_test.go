package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval/policyfile"
)

const httpToolsPolicy = `version: 1
slack: {approvals_channel: C1}
tools:
  - name: big
    risk: low
    review: never
    capabilities: [read]
    http:
      method: GET
      url: '{{env "BASE"}}/big?key={{env "API_KEY"}}&q={{urlquery .Args.q}}'
      max_response_bytes: 10
  - name: post
    risk: low
    review: never
    capabilities: [read]
    http:
      method: POST
      url: '{{env "BASE"}}/post/{{urlquery .Args.id}}'
      headers: {X-Token: '{{env "API_KEY"}}'}
      body: '{"wrapped": {{json .Args}}, "req": {{json .RequestID}}}'
  - name: down
    risk: low
    review: never
    capabilities: [read]
    http:
      method: DELETE
      url: 'http://127.0.0.1:1/unreachable?key={{env "API_KEY"}}'
`

func TestHTTPTools(t *testing.T) {
	var got struct {
		body, token, key, ctype string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = io.WriteString(w, "0123456789abcdef")
		case "/post/7":
			b, _ := io.ReadAll(r.Body)
			got.body, got.token, got.key, got.ctype = string(b), r.Header.Get("X-Token"), r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "upstream broke")
		}
	}))
	t.Cleanup(srv.Close)
	f, err := policyfile.Parse([]byte(httpToolsPolicy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	env := map[string]string{"BASE": srv.URL, "API_KEY": "sk-very-secret"}
	tools, err := agent.HTTPTools(f, func(k string) string { return env[k] }, srv.Client())
	if err != nil {
		t.Fatalf("HTTPTools: %v", err)
	}
	byName := map[string]agent.Tool{}
	for _, tl := range tools {
		byName[tl.Name()] = tl
		if rs, ok := tl.(agent.RetrySafe); !ok || !rs.RetrySafe() {
			t.Errorf("%s is not RetrySafe; HTTP tools send an Idempotency-Key", tl.Name())
		}
	}
	ctx := context.Background()

	out, err := byName["big"].Run(ctx, agent.Invocation{RequestID: "req_1", Args: json.RawMessage(`{"q":"a b"}`)})
	if err != nil || out != "0123456789\n[response truncated at 10 bytes]" {
		t.Errorf("big = %q, %v; want the body cut at 10 bytes with a note", out, err)
	}

	_, err = byName["post"].Run(ctx, agent.Invocation{RequestID: "req_2", Args: json.RawMessage(`{"id":"7"}`)})
	if err == nil || err.Error() != "POST "+srv.URL+"/post/7 returned 502: upstream broke" {
		t.Errorf("post error = %v", err)
	}
	if got.body != `{"wrapped": {"id":"7"}, "req": "req_2"}` || got.token != "sk-very-secret" || got.key != "req_2" || got.ctype != "application/json" {
		t.Errorf("post sent body %q token %q key %q type %q", got.body, got.token, got.key, got.ctype)
	}

	_, err = byName["down"].Run(ctx, agent.Invocation{RequestID: "req_3", Args: json.RawMessage(`{}`)})
	if err == nil || strings.Contains(err.Error(), "sk-very-secret") || !strings.Contains(err.Error(), "key=[redacted]") {
		t.Errorf("down error = %v, want the secret redacted from the URL", err)
	}
}
