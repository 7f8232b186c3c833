//go:build !unix

package replay_test

import (
	"testing"
	"time"
)

// cpuTime is unknown here: cpu-s/replay reads 0.
func cpuTime(testing.TB) time.Duration { return 0 }
