//go:build !linux

package main_test

import (
	"fmt"
	"os"
	"testing"
)

// The host-noise meter (hostnoise_linux_test.go) needs Linux's scheduler
// calls.
type hostNoise struct{}

func startHostNoise(b testing.TB) *hostNoise {
	b.Helper()
	if os.Getenv(envHostNoise) != "" {
		b.Fatalf("%s: the host-noise meter runs on Linux only", envHostNoise)
	}
	return nil
}

func reportHostNoise(*testing.B, *hostNoise, []stageSample) {}

func hostNoiseChild(string) int {
	fmt.Fprintln(os.Stderr, "the host-noise meter runs on Linux only")
	return 2
}
