package policyfile_test

import (
	"errors"
	"strings"
	"testing"
	"text/template"

	"github.com/countersign/countersign/approval/policyfile"
)

// TestURLHostRule: check passes a URL template only when the model's
// arguments cannot reach its scheme or host: a literal host, or an env
// base URL that a "/", "?" or "#" ends.
func TestURLHostRule(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		want      string // "" passes; else a substring of the error
	}{
		{"fixed host", "https://docs.internal.example.com/pages/{{.Args.x}}", ""},
		{"fixed host and port", "https://docs.internal.example.com:8443/pages/{{.Args.x}}", ""},
		{"fixed host then query", "https://docs.internal.example.com?q={{.Args.x}}", ""},
		{"fixed host only", "https://docs.internal.example.com", ""},
		{"env base then slash", `{{env "BASE"}}/pages/{{.Args.x}}`, ""},
		{"env base then query", `{{env "BASE"}}?q={{.Args.x}}`, ""},
		{"env base alone", `{{env "BASE"}}`, ""},
		{"env base spaced", `{{ env "BASE" }}/x`, ""},
		{"env host in a literal scheme", `https://{{env "HOST"}}/x/{{.Args.x}}`, ""},
		{"env then argument", `{{env "BASE"}}{{.Args.x}}`, "an env value that begins the URL must be followed by /, ? or #"},
		{"env then text", `{{env "BASE"}}.attacker.net/x`, "an env value that begins the URL must be followed by /, ? or #"},
		{"argument in the host", "https://{{.Args.x}}/pages", "the scheme and host must be written literally"},
		{"argument ends the host", "https://docs.internal.example.com{{.Args.x}}/pages", "the scheme and host must be written literally"},
		{"argument in the port", "https://docs.internal.example.com:{{.Args.port}}/x", "the scheme and host must be written literally"},
		{"argument as userinfo", "https://{{.Args.user}}@docs.internal.example.com/x", "the scheme and host must be written literally"},
		{"argument in the scheme", "{{.Args.scheme}}://docs.internal.example.com/x", "the scheme and host must be written literally"},
		{"a branch before the host", `{{if .Args.x}}https://a.example{{else}}https://b.example{{end}}/x`, "the scheme and host must be written literally"},
		{"env named by the model", `{{env .Args.name}}/x`, `env takes one literal name`},
		{"env piped", `https://a.example/{{.Args.name | env}}`, `env takes one literal name`},
		{"not http", "file:///etc/passwd", "must start with http:// or https://"},
		{"empty host", "https:///x/{{.Args.x}}", "the host is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "version: 1\nslack: {approvals_channel: G0APPROV1}\ntools:\n  - name: fetch\n    http: {method: GET, url: '" + tc.url + "'}\n" +
				"    preview: {url: '" + tc.url + "'}\n"
			_, err := policyfile.Parse([]byte(src))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Parse(url %s) = %v, want it valid", tc.url, err)
			case tc.want != "" && err == nil:
				t.Errorf("Parse(url %s) = nil error, want %q", tc.url, tc.want)
			case tc.want != "":
				if !errors.Is(err, policyfile.ErrInvalid) {
					t.Errorf("Parse(url %s) error does not wrap ErrInvalid", tc.url)
				}
				for _, key := range []string{"tools[0].http.url: " + tc.want, "tools[0].preview.url: " + tc.want} {
					if !strings.Contains(err.Error(), key) {
						t.Errorf("Parse(url %s) = %v, want %q", tc.url, err, key)
					}
				}
			}
		})
	}
}

// TestURLPrefix: the fixed beginning of a URL template, env values read.
func TestURLPrefix(t *testing.T) {
	env := func(name string) string { return map[string]string{"BASE": "https://docs.example.com/api"}[name] }
	for _, tc := range []struct {
		url, want string
		whole     bool
	}{
		{" https://a.example/x/{{.Args.id}}/y", "https://a.example/x/", false},
		{`{{env "BASE"}}/pages?{{.Args.q}}`, "https://docs.example.com/api/pages?", false},
		{`{{env "BASE"}}/pages`, "https://docs.example.com/api/pages", true},
		{`{{env .Args.n}}/x`, "", false},
	} {
		tpl := template.Must(template.New("u").Funcs(policyfile.Funcs(nil)).Parse(tc.url))
		got, whole := policyfile.URLPrefix(tpl, env)
		if got != tc.want || whole != tc.whole {
			t.Errorf("URLPrefix(%s) = %q, %v, want %q, %v", tc.url, got, whole, tc.want, tc.whole)
		}
	}
}
