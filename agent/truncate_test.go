package agent_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/countersign/countersign/agent"
)

// TestTruncateKeepsCharactersWhole: a cut that falls inside a multi-byte
// character backs off to the character's start, so the result is valid UTF-8.
func TestTruncateKeepsCharactersWhole(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		n        int
		want     string
	}{
		{name: "short", in: "héllo", n: 10, want: "héllo"},
		{name: "ascii", in: "abcdef", n: 3, want: "abc… [truncated, 6 bytes in all]"},
		{name: "inside é", in: "aé€b", n: 2, want: "a… [truncated, 7 bytes in all]"},
		{name: "inside €", in: "aé€b", n: 5, want: "aé… [truncated, 7 bytes in all]"},
		{name: "after €", in: "aé€b", n: 6, want: "aé€… [truncated, 7 bytes in all]"},
		{name: "first character", in: "€€", n: 1, want: "… [truncated, 6 bytes in all]"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := agent.Truncate(tt.in, tt.n)
			if got != tt.want {
				t.Errorf("truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
			if !utf8.ValidString(got) || !strings.HasPrefix(tt.in, strings.SplitN(got, "…", 2)[0]) {
				t.Errorf("truncate(%q, %d) = %q: not a whole-character prefix", tt.in, tt.n, got)
			}
		})
	}
}
