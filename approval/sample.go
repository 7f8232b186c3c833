package approval

import (
	"crypto/sha256"
	"encoding/binary"
)

// Sampled reports whether the call of request id is among the fraction
// rate of calls posted for review after they ran (sample: in the policy).
// The choice is a pure function of the id, so every replica, and a replay
// after a restart, picks the same calls: the first 8 bytes of the id's
// SHA-256, read as a fraction of 2^64, fall below rate.
func Sampled(id string, rate float64) bool {
	if rate <= 0 {
		return false
	}
	if rate >= 1 {
		return true
	}
	sum := sha256.Sum256([]byte(id))
	x := float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53) // [0,1), exact in a float64
	return x < rate
}
