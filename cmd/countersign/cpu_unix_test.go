//go:build unix

package main_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) this process has used so
// far, every thread counted: around a timed click it is the work the
// click cost the process (the product, and the fake Slack and system of
// record that share it), whatever the machine's load.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
