package approval

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"time"
)

// DefaultClaimWindow is how long an approved request of an outside caller
// waits to be claimed before it ends abandoned (LifecycleOptions.
// ClaimWindow; the policy file's api.claim_window).
const DefaultClaimWindow = 5 * time.Minute

// claimTokenPrefix starts every claim token, so one found in a log or a
// paste is recognised for what it is.
const claimTokenPrefix = "cst_"

// newClaimToken returns a fresh claim token: 32 random bytes.
func newClaimToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("claim token: %w", err)
	}
	return claimTokenPrefix + hex.EncodeToString(b), nil
}

// HashClaimToken returns the hex SHA-256 of a claim token, as the record
// keeps it (Request.ClaimHash).
func HashClaimToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ClaimTokenMatches reports, in constant time, whether token is the one
// whose hash is hash; never for an empty hash or token.
func ClaimTokenMatches(hash, token string) bool {
	if hash == "" || token == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(hash), []byte(HashClaimToken(token))) == 1
}
