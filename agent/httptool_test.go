package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
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
	byName := mustHTTPTools(t, httpToolsPolicy, map[string]string{"BASE": srv.URL, "API_KEY": "sk-very-secret"}, srv.Client())
	for _, tl := range byName {
		if rs, ok := tl.(agent.RetrySafe); !ok || !rs.RetrySafe() {
			t.Errorf("%s is not RetrySafe; HTTP tools send an Idempotency-Key", tl.Name())
		}
	}
	ctx := context.Background()

	out, err := byName["big"].Run(ctx, agent.Invocation{RequestID: "req_1", Args: json.RawMessage(`{"q":"a b"}`)})
	if err != nil || out != "0123456…" {
		t.Errorf("big = %q, %v; want the body cut to 10 bytes, clip's marker included", out, err)
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

// TestHTTPToolRedirects: a redirect within the tool's origin is followed
// with the headers; one to another host (here the same address on another
// port) is not — no secret header and no re-sent body reach it — and the
// 3xx is the call's error result. Previews behave the same.
func TestHTTPToolRedirects(t *testing.T) {
	type hit struct{ path, token, auth, key, body string }
	var (
		mu        sync.Mutex // guards elsewhere, origin
		elsewhere []hit
		origin    []hit
	)
	record := func(list *[]hit, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		*list = append(*list, hit{r.URL.Path, r.Header.Get("X-Token"), r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key"), string(b)})
		mu.Unlock()
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(&elsewhere, r)
		_, _ = io.WriteString(w, `{"name":"from elsewhere"}`)
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(&origin, r)
		switch r.URL.Path {
		case "/post/away", "/preview/away":
			http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
		case "/post/here":
			http.Redirect(w, r, "/post/final", http.StatusTemporaryRedirect)
		case "/post/final":
			_, _ = io.WriteString(w, `{"ok":true}`)
		}
	}))
	t.Cleanup(srv.Close)
	const policy = `version: 1
slack: {approvals_channel: C1}
tools:
  - name: post
    risk: low
    review: never
    capabilities: [read]
    http:
      method: POST
      url: '{{env "BASE"}}/post/{{urlquery .Args.id}}'
      headers: {X-Token: '{{env "API_KEY"}}', Authorization: 'Bearer {{env "API_KEY"}}'}
    preview:
      url: '{{env "BASE"}}/preview/{{urlquery .Args.id}}'
      headers: {X-Token: '{{env "API_KEY"}}'}
      fields:
        - {label: Name, path: name}
`
	f, err := policyfile.Parse([]byte(policy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	env := map[string]string{"BASE": srv.URL, "API_KEY": "sk-very-secret"}
	client := srv.Client()
	tools, err := agent.HTTPTools(f, func(k string) string { return env[k] }, client)
	if err != nil || len(tools) != 1 {
		t.Fatalf("HTTPTools = %v, %v", tools, err)
	}
	if client.CheckRedirect != nil {
		t.Error("HTTPTools changed the caller's client")
	}
	ctx := context.Background()

	out, err := tools[0].Run(ctx, agent.Invocation{RequestID: "req_here", Args: json.RawMessage(`{"id":"here"}`)})
	if err != nil || out != `{"ok":true}` {
		t.Errorf("Run(same-origin redirect) = %q, %v; want it followed", out, err)
	}
	_, err = tools[0].Run(ctx, agent.Invocation{RequestID: "req_away", Args: json.RawMessage(`{"id":"away"}`)})
	if err == nil || !strings.Contains(err.Error(), "returned 307") {
		t.Errorf("Run(redirect to another host) error = %v, want the 307 as an error result", err)
	}
	p, err := tools[0].Preview(ctx, json.RawMessage(`{"id":"away"}`))
	if err != nil || !strings.Contains(p.Error, "returned 307") || len(p.Facts) != 0 {
		t.Errorf("Preview(redirect to another host) = %+v, %v; want unavailable, returned 307", p, err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) != 0 {
		t.Errorf("the other host received %+v, want nothing", elsewhere)
	}
	var final *hit
	for i := range origin {
		if origin[i].path == "/post/final" {
			final = &origin[i]
		}
	}
	if final == nil || final.token != "sk-very-secret" || final.key != "req_here" || final.body != `{"id":"here"}` {
		t.Errorf("same-origin redirect target got %+v, want headers, key and body", final)
	}
}

// TestHTTPToolURLEscaping: whatever the model puts in an argument fills one
// path segment or one query value of the URL template: it cannot climb
// with "..", add segments, start a query or a fragment, or leave a path
// segment empty. Operator values from env are left as written.
func TestHTTPToolURLEscaping(t *testing.T) {
	type hit struct {
		path  string
		query url.Values
	}
	var (
		mu   sync.Mutex // guards hits
		hits []hit
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, hit{r.URL.EscapedPath(), r.URL.Query()})
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	const policy = `version: 1
slack: {approvals_channel: C1}
tools:
  - name: items
    risk: low
    review: never
    capabilities: [read]
    http:
      method: GET
      url: '{{env "BASE"}}/orders/{{.Args.id}}/items?note={{.Args.note}}&n={{.Args.n}}&key={{env "KEY"}}'
  - name: quoted
    risk: low
    review: never
    capabilities: [read]
    http:
      method: GET
      url: '{{env "BASE"}}/customers/{{urlquery .Args.id}}'
  - name: search
    risk: low
    review: never
    capabilities: [read]
    http:
      method: GET
      url: '{{env "BASE"}}/search{{if .Args.q}}?q={{.Args.q}}{{end}}'
`
	byName := mustHTTPTools(t, policy, map[string]string{"BASE": srv.URL, "KEY": "k1"}, srv.Client())
	for _, tc := range []struct {
		tool, args string
		path       string     // EscapedPath seen by the server; "" = refused
		query      url.Values // nil: not checked
	}{
		{"items", `{"id":"../admin?x=1#f","note":"a&b=c d+e","n":5}`, "/orders/..%2Fadmin%3Fx%3D1%23f/items",
			url.Values{"note": {"a&b=c d+e"}, "n": {"5"}, "key": {"k1"}}},
		{"items", `{"id":"1234","note":""}`, "/orders/1234/items", url.Values{"note": {""}, "n": {""}, "key": {"k1"}}},
		{"items", `{"id":"..","note":"x"}`, "", nil},
		{"items", `{"id":".","note":"x"}`, "", nil},
		{"items", `{"id":"","note":"x"}`, "", nil},
		{"items", `{"note":"x"}`, "", nil},
		{"quoted", `{"id":"a b/c"}`, "/customers/a%20b%2Fc", url.Values{}},
		{"search", `{"q":"x y&z=1"}`, "/search", url.Values{"q": {"x y&z=1"}}},
		{"search", `{}`, "/search", url.Values{}},
	} {
		mu.Lock()
		hits = nil
		mu.Unlock()
		_, err := byName[tc.tool].Run(context.Background(), agent.Invocation{RequestID: "req_1", Args: json.RawMessage(tc.args)})
		mu.Lock()
		got := hits
		mu.Unlock()
		if tc.path == "" {
			if err == nil || len(got) != 0 || !strings.Contains(err.Error(), "path segment") {
				t.Errorf("%s %s = %v, hits %v; want refused before any request", tc.tool, tc.args, err, got)
			}
			continue
		}
		if err != nil || len(got) != 1 {
			t.Errorf("%s %s = %v, hits %v; want one request", tc.tool, tc.args, err, got)
			continue
		}
		if got[0].path != tc.path || !reflect.DeepEqual(got[0].query, tc.query) {
			t.Errorf("%s %s reached %s ? %v, want %s ? %v", tc.tool, tc.args, got[0].path, got[0].query, tc.path, tc.query)
		}
	}
}

// mustHTTPTools builds the HTTP tools of a policy file with env as the
// process environment, by name.
func mustHTTPTools(t testing.TB, policy string, env map[string]string, client *http.Client) map[string]agent.Tool {
	t.Helper()
	f, err := policyfile.Parse([]byte(policy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	tools, err := agent.HTTPTools(f, func(k string) string { return env[k] }, client)
	if err != nil {
		t.Fatalf("HTTPTools: %v", err)
	}
	byName := map[string]agent.Tool{}
	for _, tl := range tools {
		byName[tl.Name()] = tl
	}
	return byName
}

// TestHTTPToolRendersConcurrently: a tool's templates are cloned once and
// shared by its calls; calls at once each show their own URL with the
// operator's secret redacted (each execution records the env values it
// used in a clone of its own) and never race (go test -race).
func TestHTTPToolRendersConcurrently(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)
	byName := mustHTTPTools(t, httpToolsPolicy, map[string]string{"BASE": srv.URL, "API_KEY": "sk-very-secret"}, srv.Client())
	var wg sync.WaitGroup
	errs := make(chan error, 16*20)
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				id := fmt.Sprintf("req_%d_%d", g, i)
				_, err := byName["down"].Run(context.Background(), agent.Invocation{RequestID: id, Args: json.RawMessage(`{}`)})
				if err == nil || strings.Contains(err.Error(), "sk-very-secret") || !strings.Contains(err.Error(), "key=[redacted]") {
					errs <- fmt.Errorf("%s: %v", id, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("down, run at once with others: %v, want the secret redacted from the URL", err)
	}
}

// BenchmarkHTTPToolCall is one call of an HTTP tool whose URL, header and
// body are templates (the "post" tool above) to a local server answering
// 200: the tool's own work around the request.
//
//	go test ./agent -run '^$' -bench HTTPToolCall -benchmem
func BenchmarkHTTPToolCall(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	b.Cleanup(srv.Close)
	byName := mustHTTPTools(b, httpToolsPolicy, map[string]string{"BASE": srv.URL, "API_KEY": "sk-very-secret"}, srv.Client())
	ctx := context.Background()
	for b.Loop() {
		if _, err := byName["post"].Run(ctx, agent.Invocation{RequestID: "req_1", Args: json.RawMessage(`{"id":"7"}`)}); err != nil {
			b.Fatal(err)
		}
	}
}
