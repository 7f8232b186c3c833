package policyfile_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// TestFormatsAsserted: "format" is enforced, not just a label, whatever
// draft the schema uses — a malformed email address never validates.
func TestFormatsAsserted(t *testing.T) {
	f, err := policyfile.Parse([]byte(`version: 1
slack: {approvals_channel: C0APPROVALS}
tools:
  - name: send_email
    risk: medium
    capabilities: [send_email]
    schema:
      type: object
      properties:
        to: {type: string, format: email}
        at: {type: string, format: date-time}
`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args string
		ok   bool
	}{
		{"valid", `{"to":"dana@example.com","at":"2026-11-29T10:00:00Z"}`, true},
		{"bad email", `{"to":"dana at example"}`, false},
		{"bad date-time", `{"at":"tomorrow"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := f.ValidateArgs("send_email", json.RawMessage(tt.args))
			if tt.ok && err != nil {
				t.Errorf("ValidateArgs(%s) = %v, want nil", tt.args, err)
			}
			if !tt.ok && !errors.Is(err, approval.ErrInvalidArgs) {
				t.Errorf("ValidateArgs(%s) = %v, want ErrInvalidArgs", tt.args, err)
			}
		})
	}
}
