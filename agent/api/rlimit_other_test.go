//go:build !unix

package api_test

import "testing"

// raiseFileLimit and raiseOpenFiles do nothing here: the open-file limit
// they raise is a Unix one (see rlimit_unix_test.go).
func raiseFileLimit(testing.TB) {}

func raiseOpenFiles() error { return nil }
