//go:build unix

package api_test

import (
	"fmt"
	"syscall"
	"testing"
)

// raiseFileLimit raises the soft limit on open files to the hard limit: a
// process holding 10,000 connections needs more than the usual 1,024.
func raiseFileLimit(tb testing.TB) {
	if err := raiseOpenFiles(); err != nil {
		tb.Fatal(err)
	}
}

// raiseOpenFiles is raiseFileLimit for a process without a testing.TB (the
// long-poll client child).
func raiseOpenFiles() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("setrlimit: %w", err)
	}
	return nil
}
