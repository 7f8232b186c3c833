package extauthz

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestCallIDIsStable: a call's id is the prefix and the first half of the
// SHA-256 of its parts, each after its length, as it always was (a
// gateway's retry after an upgrade finds the request it made before).
func TestCallIDIsStable(t *testing.T) {
	want := func(prefix string, parts ...[]byte) string {
		h := sha256.New()
		for _, part := range parts {
			fmt.Fprintf(h, "%d:", len(part))
			h.Write(part)
		}
		return prefix + hex.EncodeToString(h.Sum(nil)[:16])
	}
	cases := [][][]byte{
		nil,
		{nil},
		{[]byte("route"), []byte(`{"jsonrpc":"2.0","id":1}`)},
		{[]byte(strings.Repeat("x", 12345)), []byte("é\x00"), {}},
	}
	for i, parts := range cases {
		if got, w := CallID("extauthz-", parts...), want("extauthz-", parts...); got != w {
			t.Errorf("case %d: CallID = %s, want %s", i, got, w)
		}
	}
}
