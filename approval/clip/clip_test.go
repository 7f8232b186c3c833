package clip_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/countersign/countersign/approval/clip"
)

func TestBytes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, in string
		n        int
		want     string
	}{
		{name: "fits", in: "abc", n: 3, want: "abc"},
		{name: "ascii", in: "abcdef", n: 5, want: "ab…"},
		{name: "inside é", in: "aé€b", n: 5, want: "a…"},
		{name: "before €", in: "aé€b", n: 6, want: "aé…"},
		{name: "after €", in: "aé€bcde", n: 9, want: "aé€…"},
		{name: "only the marker fits", in: "€€", n: 3, want: "…"},
		{name: "smaller than the marker", in: "abcdef", n: 2, want: "ab"},
		{name: "smaller than the marker, inside é", in: "éé", n: 1, want: ""},
		{name: "zero", in: "abc", n: 0, want: ""},
		{name: "negative", in: "abc", n: -1, want: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := clip.Bytes(tt.in, tt.n); got != tt.want {
				t.Errorf("Bytes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
		})
	}
}

func TestRunes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, in string
		n        int
		want     string
	}{
		{name: "fits", in: "aé€", n: 3, want: "aé€"},
		{name: "cut", in: "aé€b", n: 3, want: "aé…"},
		{name: "one", in: "aé€b", n: 1, want: "…"},
		{name: "zero", in: "abc", n: 0, want: ""},
		{name: "long bytes, few runes", in: "€€", n: 2, want: "€€"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := clip.Runes(tt.in, tt.n); got != tt.want {
				t.Errorf("Runes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
		})
	}
}

// FuzzClip: whatever the text and the limit, the result respects the
// limit (bytes for Bytes, characters for Runes), is the text itself when
// it fits, else a prefix of it followed by the one marker, and never
// splits a character (valid text stays valid).
func FuzzClip(f *testing.F) {
	for _, s := range []string{"", "abc", "aé€b", "€€€€", "\xff\x80\x80\x80\x80a", "日本語のテキスト", "e\u0301\u0301"} {
		for _, n := range []int{-1, 0, 1, 2, 3, 4, 5, 8} {
			f.Add(s, n)
		}
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		check := func(name, got string, size func(string) int) {
			if size(got) > max(n, 0) {
				t.Fatalf("%s(%q, %d) = %q: %d over the limit", name, s, n, got, size(got))
			}
			if size(s) <= n {
				if got != s {
					t.Fatalf("%s(%q, %d) = %q, want the text unchanged", name, s, n, got)
				}
				return
			}
			prefix, _ := strings.CutSuffix(got, clip.Marker)
			if !strings.HasPrefix(s, prefix) {
				t.Fatalf("%s(%q, %d) = %q, not a prefix of the text and the marker", name, s, n, got)
			}
			if utf8.ValidString(s) && !utf8.ValidString(got) {
				t.Fatalf("%s(%q, %d) = %q splits a character", name, s, n, got)
			}
			if len(prefix) < len(s) && utf8.ValidString(s) && !utf8.RuneStart(s[len(prefix)]) {
				t.Fatalf("%s(%q, %d) = %q cuts inside a character", name, s, n, got)
			}
		}
		check("Bytes", clip.Bytes(s, n), func(s string) int { return len(s) })
		check("Runes", clip.Runes(s, n), utf8.RuneCountInString)
	})
}
