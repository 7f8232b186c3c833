package approval_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// TestBoundData: every string of audit data longer than MaxDataField —
// values and keys, at any depth — is cut with Clip's marker; short data
// passes unchanged; data that is not JSON becomes one bounded string.
func TestBoundData(t *testing.T) {
	long := strings.Repeat("é", approval.MaxDataField) // 2 bytes a rune: the cut falls inside one
	tests := []struct {
		name string
		data string
	}{
		{"value", `{"path":"` + long + `"}`},
		{"nested in a list", `{"args":{"files":["a","` + long + `"]}}`},
		{"key", `{"` + long + `":1}`},
		{"not JSON", `/v1/` + long},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := approval.BoundData(json.RawMessage(tt.data))
			if len(got) > approval.MaxDataField+200 {
				t.Errorf("BoundData(%d bytes) = %d bytes, want at most %d", len(tt.data), len(got), approval.MaxDataField+200)
			}
			if !json.Valid(got) || !strings.Contains(string(got), clip.Marker+`"`) || strings.Contains(string(got), "\ufffd") {
				t.Errorf("BoundData(%.40s…) = %.80s…, want valid JSON with the cut marker and whole runes", tt.data, got)
			}
		})
	}
	short := json.RawMessage(`{"amount":12.50,"note":"café"}`)
	if got := approval.BoundData(short); string(got) != string(short) {
		t.Errorf("BoundData(%s) = %s, want it unchanged", short, got)
	}
}
