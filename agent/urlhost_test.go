package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval/policyfile"
)

// sent records every request a client would send, to any host, and
// answers 200 without a network.
type sent struct {
	mu   sync.Mutex // guards urls, auth
	urls []string
	auth []string
}

func (s *sent) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.urls = append(s.urls, r.URL.String())
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(`{"name":"x"}`)), Header: http.Header{}, Request: r}, nil
}

func (s *sent) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.urls
	s.urls, s.auth = nil, nil
	return out
}

// TestHTTPToolHostPinned: at run time a call goes only to the scheme and
// host its URL template fixes. A template check would refuse (built here
// by changing a parsed file's URL) fails closed, call and preview alike,
// whatever the argument does to the host: nothing is sent, the env-built
// Authorization header goes nowhere.
func TestHTTPToolHostPinned(t *testing.T) {
	const policy = `version: 1
slack: {approvals_channel: C1}
tools:
  - name: page
    risk: low
    review: never
    capabilities: [read]
    http:
      method: GET
      url: '{{env "BASE"}}/pages/{{.Args.x}}'
      headers: {Authorization: 'Bearer {{env "TOKEN"}}'}
    preview:
      url: '{{env "BASE"}}/pages/{{.Args.x}}'
      headers: {Authorization: 'Bearer {{env "TOKEN"}}'}
      fields: [{label: Name, path: name}]
`
	env := map[string]string{"BASE": "https://docs.internal.example.com", "TOKEN": "sk-secret"}
	for _, tc := range []struct {
		name, url, x string
		want         string // the URL sent; "" = refused, nothing sent
	}{
		{"env base and slash", `{{env "BASE"}}/pages/{{.Args.x}}`, ".attacker.net", "https://docs.internal.example.com/pages/.attacker.net"},
		{"fixed host", `https://docs.internal.example.com/pages/{{.Args.x}}`, "@attacker.net", "https://docs.internal.example.com/pages/%40attacker.net"},
		{"env then argument", `{{env "BASE"}}{{.Args.x}}`, ".attacker.net", ""},
		{"argument ends the host", `https://docs.internal.example.com{{.Args.x}}/p`, ".attacker.net", ""},
		{"userinfo", `https://docs.internal.example.com{{.Args.x}}/p`, "@attacker.net", ""},
		{"encoded dot", `https://docs.internal.example.com{{.Args.x}}/p`, "%2eattacker.net", ""},
		{"backslash", `https://docs.internal.example.com{{.Args.x}}/p`, `\attacker.net`, ""},
		{"uppercase host", `https://docs.internal.example.com{{.Args.x}}/p`, ".ATTACKER.NET", ""},
		{"IDN host", `https://docs.internal.example.com{{.Args.x}}/p`, ".exаmple.com", ""},
		{"port change", `https://docs.internal.example.com{{.Args.x}}/p`, ":8443", ""},
		{"argument is the host", `https://{{.Args.x}}/p`, "attacker.net", ""},
		{"model names the env", `https://docs.internal.example.com{{.Args.x | env}}/p`, "EVIL", ""},
		{"argument in the scheme", `http{{.Args.x}}://docs.internal.example.com/p`, "s", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := policyfile.Parse([]byte(policy))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			f.Tools[0].HTTP.URL, f.Tools[0].Preview.URL = tc.url, tc.url // as if check had not run
			rec := &sent{}
			env := map[string]string{"BASE": env["BASE"], "TOKEN": env["TOKEN"], "EVIL": "@attacker.net"}
			tools, err := agent.HTTPTools(f, func(k string) string { return env[k] }, &http.Client{Transport: rec})
			if err != nil {
				t.Fatalf("HTTPTools: %v", err)
			}
			args := json.RawMessage(`{"x":` + mustJSON(t, tc.x) + `}`)
			_, runErr := tools[0].Run(context.Background(), agent.Invocation{RequestID: "req_1", Args: args})
			got := rec.take()
			p, err := tools[0].Preview(context.Background(), args)
			if err != nil {
				t.Fatalf("Preview = %v", err)
			}
			previewed := rec.take()
			if tc.want != "" {
				if runErr != nil || len(got) != 1 || got[0] != tc.want {
					t.Errorf("Run(x=%q) = %v, sent %q; want %s", tc.x, runErr, got, tc.want)
				}
				if p.Error != "" || len(previewed) != 1 || previewed[0] != tc.want {
					t.Errorf("Preview(x=%q) = %+v, sent %q; want %s", tc.x, p, previewed, tc.want)
				}
				return
			}
			if runErr == nil || len(got) != 0 {
				t.Errorf("Run(x=%q) = %v, sent %q; want refused, nothing sent", tc.x, runErr, got)
			}
			if p.Error == "" || len(previewed) != 0 {
				t.Errorf("Preview(x=%q) = %+v, sent %q; want unavailable, nothing sent", tc.x, p, previewed)
			}
			if runErr != nil && !errors.Is(runErr, agent.ErrHostChanged) && !strings.Contains(runErr.Error(), "is not an http(s) URL") {
				t.Errorf("Run(x=%q) = %v, want ErrHostChanged or not a URL", tc.x, runErr)
			}
		})
	}
}

func mustJSON(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
