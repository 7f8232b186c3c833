package policyfile_test

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// TestUpstreamResolve: ${VAR} in env values and headers_env names are read
// from the lookup given; an upstream with neither gets nil maps.
func TestUpstreamResolve(t *testing.T) {
	env := map[string]string{"HOME_DIR": "/srv", "DOCS_TOKEN": "Bearer t0k"}
	lookup := func(k string) string { return env[k] }
	u := policyfile.Upstream{Name: "docs", Command: []string{"docs-mcp"},
		Env:        map[string]string{"ROOT": "${HOME_DIR}/docs", "PLAIN": "x", "MISSING": "$NOPE"},
		HeadersEnv: map[string]string{"Authorization": "DOCS_TOKEN"}}
	vars, headers := u.Resolve(lookup)
	if want := map[string]string{"ROOT": "/srv/docs", "PLAIN": "x", "MISSING": ""}; !maps.Equal(vars, want) {
		t.Errorf("Resolve vars = %v, want %v", vars, want)
	}
	if want := map[string]string{"Authorization": "Bearer t0k"}; !maps.Equal(headers, want) {
		t.Errorf("Resolve headers = %v, want %v", headers, want)
	}
	if vars, headers := (policyfile.Upstream{Name: "bare", URL: "https://mcp.example/"}).Resolve(lookup); vars != nil || headers != nil {
		t.Errorf("Resolve of an upstream without env = %v, %v, want nil maps", vars, headers)
	}
}

// TestValidateDeclaredArgs: a declared tool's arguments are checked
// against its schema; a tool the file does not declare passes.
func TestValidateDeclaredArgs(t *testing.T) {
	f := MustParse(t, `version: 1
slack: {approvals_channel: C0APPROVALS}
tools:
  - name: get_a
    schema:
      type: object
      properties: {id: {type: string}}
      required: [id]
`)
	for _, tt := range []struct {
		name, tool, args string
		wantErr          bool
	}{
		{"declared, valid", "get_a", `{"id":"1"}`, false},
		{"declared, invalid", "get_a", `{}`, true},
		{"not declared", "deploy_service", `{"anything":1}`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := f.ValidateDeclaredArgs(tt.tool, json.RawMessage(tt.args))
			if got := errors.Is(err, approval.ErrInvalidArgs); got != tt.wantErr || (!tt.wantErr && err != nil) {
				t.Errorf("ValidateDeclaredArgs(%q, %s) = %v, want invalid %v", tt.tool, tt.args, err, tt.wantErr)
			}
		})
	}
}

// TestHasPreview: only a declared tool with a preview source has one.
func TestHasPreview(t *testing.T) {
	f := &policyfile.File{Tools: []policyfile.Tool{
		{Name: "get_order", Preview: &policyfile.PreviewSpec{URL: "http://sor.example/orders/{{.args.id}}"}},
		{Name: "send_email"},
	}}
	for name, want := range map[string]bool{"get_order": true, "send_email": false, "undeclared": false} {
		if got := f.HasPreview(name); got != want {
			t.Errorf("HasPreview(%q) = %v, want %v", name, got, want)
		}
	}
}
