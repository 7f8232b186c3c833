//go:build !linux

package main_test

// processSyscalls is unknown here: the figures are not reported.
func processSyscalls() (reads, writes int64, ok bool) { return 0, 0, false }
