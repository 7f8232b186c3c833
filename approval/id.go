package approval

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// idEncoding is base32.StdEncoding in lower case, without padding.
var idEncoding = base32.NewEncoding(strings.ToLower("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")).WithPadding(base32.NoPadding)

// NewID returns prefix + "_" + 26 lowercase base32 characters of 16 random
// bytes, e.g. NewID("req") = "req_k5x...". Ids are unguessable.
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	var enc [26]byte       // idEncoding.EncodedLen(16)
	idEncoding.Encode(enc[:], b[:])
	var s strings.Builder // one allocation: the id
	s.Grow(len(prefix) + 1 + len(enc))
	s.WriteString(prefix)
	s.WriteByte('_')
	s.Write(enc[:])
	return s.String()
}

// ValidID reports whether s has the shape of an id NewID(prefix) returns:
// a payload's id of any other shape is refused before it is looked up,
// logged or audited.
func ValidID(prefix, s string) bool {
	if len(s) != len(prefix)+1+26 || !strings.HasPrefix(s, prefix+"_") {
		return false
	}
	for _, c := range s[len(prefix)+1:] {
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
