package mcp

import (
	"os/exec"
	"syscall"
)

// isolate makes a command upstream die with its gateway: the kernel sends
// it SIGKILL when the gateway dies, however it dies (SIGKILL included:
// Pdeathsig), and it leads a process group of its own, which reap kills
// whole when the gateway closes or the upstream stops, so a wrapper's own
// children (node tap.mjs -- node server.js) go too. Pdeathsig reaches the
// direct child only: a grandchild outlives a gateway killed with SIGKILL
// unless it exits when its stdin (the gateway's pipe) closes, as a stdio
// MCP server does.
func isolate(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// reap kills the process group that cmd leads (isolate), if it started:
// what is left of an upstream once its session is closed or has ended.
func reap(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
