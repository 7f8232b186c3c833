package main_test

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// processCPUOf is the CPU time (user + system) process pid has used so
// far, every thread counted, read from its CPU-time clock as
// clock_getcpuclockid(3) names it (MAKE_PROCESS_CPUCLOCK(pid,
// CPUCLOCK_SCHED): nanoseconds, not clock ticks); 0 when it cannot be
// read. Around a timed click it is the work of that process alone.
func processCPUOf(pid int) time.Duration {
	if pid <= 0 || pid >= 1<<29 { // the clock id holds 29 bits of pid
		return 0
	}
	clock := int32(^uint32(pid)<<3 | 2)
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, uintptr(clock), uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// monotonicNow is CLOCK_MONOTONIC, the clock `perf record -k
// CLOCK_MONOTONIC` stamps its samples with (CLICK_WINDOWS); 0 when it
// cannot be read.
func monotonicNow() time.Duration {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// TestProcessCPUOfReadsAProcessClock: the benchmark's reading of another
// process's CPU clock moves when that process works, and is 0 for a
// process that does not exist.
func TestProcessCPUOfReadsAProcessClock(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	before := processCPUOf(self)
	if before <= 0 {
		t.Fatalf("processCPUOf(self) = %v, want > 0", before)
	}
	sum := sha256.Sum256(nil)
	for range 20000 { // some CPU: about 10 ms
		sum = sha256.Sum256(sum[:])
	}
	if after := processCPUOf(self); after <= before {
		t.Errorf("processCPUOf(self) %v after work, %v before", after, before)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if got := processCPUOf(gone.Process.Pid); got != 0 { // exited and reaped
		t.Errorf("processCPUOf(a process that exited) = %v, want 0", got)
	}
}
