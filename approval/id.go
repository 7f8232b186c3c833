package approval

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewID returns prefix + "_" + 26 lowercase base32 characters of 16 random
// bytes, e.g. NewID("req") = "req_k5x...". Ids are unguessable.
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + "_" + strings.ToLower(idEncoding.EncodeToString(b[:]))
}
