package approval_test

import (
	"encoding/base32"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
)

// TestNewIDForm: an id is its prefix, "_" and 16 random bytes in lower-case
// standard base32 without padding, and ValidID takes it.
func TestNewIDForm(t *testing.T) {
	seen := map[string]bool{}
	for _, prefix := range []string{"req", "op", "grant", "http", ""} {
		for range 100 {
			id := approval.NewID(prefix)
			payload, ok := strings.CutPrefix(id, prefix+"_")
			if !ok || len(payload) != 26 || payload != strings.ToLower(payload) {
				t.Fatalf("NewID(%q) = %q, want %q, \"_\" and 26 lower-case characters", prefix, id, prefix)
			}
			b, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(strings.ToUpper(payload))
			if err != nil || len(b) != 16 {
				t.Fatalf("NewID(%q) = %q: payload decodes to %d bytes, %v; want 16", prefix, id, len(b), err)
			}
			if !approval.ValidID(prefix, id) {
				t.Errorf("ValidID(%q, %q) = false", prefix, id)
			}
			if seen[id] {
				t.Fatalf("NewID(%q) = %q twice", prefix, id)
			}
			seen[id] = true
		}
	}
}

func BenchmarkNewID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = approval.NewID("op")
	}
}
