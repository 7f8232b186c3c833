package main_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const checkBase = `version: 1
slack: {approvals_channel: C0APPROVALS}
tools:
  - name: lookup_order
    risk: low
    review: never
    schema: {type: object, properties: {order_id: {type: string}}}
    http: {method: GET, url: "https://sor.example/orders/{{urlquery .Args.order_id}}"}
`

// TestCheck runs `countersign check` on good and bad tools files: every
// error names the key path; exit 0 valid, 1 invalid.
func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		file     string
		wantCode int
		wantOut  []string
	}{
		{name: "valid", file: checkBase, wantCode: 0, wantOut: []string{"ok (version 1, 1 tools"}},
		{name: "demo policy", file: string(demo.Policy), wantCode: 0, wantOut: []string{"ok (version 1, 5 tools",
			"TOOL ", "issue_refund        auto when double(args.amount) > 50.0", "set_order_priority  after a 2m cancel window", "1, 2 when double(args.amount) > 500.0",
			"remember 1h; preauthorize 1h; deny when double(args.amount) > 2000.0", "groups S0LEADS01", "sensitive delete"}},
		{
			name: "review modes",
			file: checkBase + "  - name: restart\n    risk: low\n    review: after\n    cancel_window: 5m\n" +
				"  - name: tag\n    risk: low\n    review: never\n    sample: 0.05\n",
			wantCode: 0, wantOut: []string{"restart       after a 5m cancel window", "cancel,run_now", "sample 5% of unreviewed calls afterwards"},
		},
		{
			name:     "review after without a window",
			file:     checkBase + "  - name: restart\n    risk: low\n    review: after\n",
			wantCode: 1, wantOut: []string{"tools[1].cancel_window: required"},
		},
		{
			name:     "bad URL template",
			file:     strings.Replace(checkBase, "{{urlquery .Args.order_id}}", "{{urlquery .Args.order_id}", 1),
			wantCode: 1, wantOut: []string{"tools[0].http.url"},
		},
		{
			name:     "bad schema",
			file:     strings.Replace(checkBase, "{type: object, properties: {order_id: {type: string}}}", "{type: object, properties: {order_id: {type: strang}}}", 1),
			wantCode: 1, wantOut: []string{"tools[0].schema"},
		},
		{
			name:     "bad CEL",
			file:     checkBase + "  - name: refund\n    risk: medium\n    review: {mode: auto, when: \"arg.amount > 5\"}\n",
			wantCode: 1, wantOut: []string{"tools[1].review.when", "arg"},
		},
		{
			name:     "never on high risk",
			file:     strings.Replace(checkBase, "risk: low", "risk: high", 1),
			wantCode: 1, wantOut: []string{"tools[0].review"},
		},
		{
			name:     "invalid YAML",
			file:     "version: 1\ntools: [\n",
			wantCode: 1, wantOut: []string{"policy.yaml:2: invalid YAML"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "policy.yaml", tt.file)
			var out, errOut bytes.Buffer
			code := main.Run(t.Context(), []string{"check", path}, main.Stdio{Stdout: &out, Stderr: &errOut})
			all := out.String() + errOut.String()
			if code != tt.wantCode {
				t.Fatalf("check exit = %d, want %d; output:\n%s", code, tt.wantCode, all)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(all, w) {
					t.Errorf("check output does not contain %q:\n%s", w, all)
				}
			}
		})
	}
}
