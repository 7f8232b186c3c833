//go:build !linux

package main_test

import "time"

// processCPUOf is another process's CPU time; only Linux is read here
// (cpu_child_linux_test.go), elsewhere it is 0 and cpu-ms/op reads 0.
func processCPUOf(int) time.Duration { return 0 }

// monotonicNow is CLOCK_MONOTONIC on Linux (cpu_child_linux_test.go); 0
// here.
func monotonicNow() time.Duration { return 0 }
