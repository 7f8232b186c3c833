package agent_test

import (
	"strings"
	"testing"

	"github.com/countersign/countersign/agent"
)

// TestCheckOpenAI: a key is required unless a base URL is set, and a base
// URL must be http(s); each error names its variable.
func TestCheckOpenAI(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, baseURL, key, want string
	}{
		{"openai with a key", "", "k", ""},
		{"local endpoint without a key", "http://localhost:11434/v1", "", ""},
		{"nothing", "", "", "OPENAI_API_KEY: required"},
		{"no scheme", "localhost:11434", "k", `OPENAI_BASE_URL: not an http(s) URL: "localhost:11434"`},
	} {
		errs := agent.CheckOpenAI(tt.baseURL, tt.key)
		switch {
		case tt.want == "" && len(errs) > 0:
			t.Errorf("%s: CheckOpenAI = %q, want none", tt.name, errs)
		case tt.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want)):
			t.Errorf("%s: CheckOpenAI = %q, want one error containing %q", tt.name, errs, tt.want)
		}
	}
}
