//go:build !linux

package mcp

import "os/exec"

// isolate does nothing here: Pdeathsig and process groups as used on Linux
// (procs_linux.go) are not available; an upstream is stopped by closing
// its stdin and then signalled (go-sdk's CommandTransport), which a
// gateway killed with SIGKILL cannot do.
func isolate(*exec.Cmd) {}

// reap does nothing here (see isolate).
func reap(*exec.Cmd) {}
