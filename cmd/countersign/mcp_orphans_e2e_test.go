package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/cmd/countersign/demo"
)

// envTestUpstream, set in a child process's environment, makes this test
// binary a stdio MCP upstream that writes its pid to the file the variable
// names and, like the servers that were seen outliving their gateway, does
// not exit when its stdin closes. With envTestUpstreamWrap=1 it is a
// wrapper instead: it runs itself as that upstream (its child, sharing its
// stdin and stdout) and waits for it.
const (
	envTestUpstream     = "COUNTERSIGN_TEST_MCP_UPSTREAM"
	envTestUpstreamWrap = "COUNTERSIGN_TEST_MCP_UPSTREAM_WRAP"
)

// serveTestUpstream is the child process's main (see envTestUpstream).
func serveTestUpstream(pidFile string) int {
	if os.Getenv(envTestUpstreamWrap) == "1" {
		self, err := os.Executable()
		if err != nil {
			return 1
		}
		child := exec.Command(self)
		child.Env = append(os.Environ(), envTestUpstreamWrap+"=0")
		child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := child.Run(); err != nil {
			return 1
		}
		return 0
	}
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return 1
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "pids", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
	select {} // stdin closed: stay, as a careless server does
}

// startGatewayWithPidUpstream runs `countersign mcp` (the real binary) with
// the test upstream (wrapped or not) as a command upstream, connects a
// go-sdk client to it over stdio, and returns the gateway's process and
// the pid of the upstream server process.
func startGatewayWithPidUpstream(t *testing.T, wrap bool) (*exec.Cmd, int) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("an upstream dies with its gateway through Linux's Pdeathsig and process groups; not checked on " + runtime.GOOS)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "upstream.pid")
	w := "0"
	if wrap {
		w = "1"
	}
	policy := filepath.Join(dir, "policy.yaml")
	src := string(demo.Policy) + fmt.Sprintf("\nmcp:\n  upstreams:\n    - name: pids\n      command: [%q]\n      env: {%s: %q, %s: %q}\n",
		self, envTestUpstream, pidFile, envTestUpstreamWrap, w)
	if err := os.WriteFile(policy, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := buildBinary(t).Command([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "COUNTERSIGN_API_KEY=csk_unused", "COUNTERSIGN_CONFIG=" + policy},
		"mcp", "--url", "http://127.0.0.1:1")
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to countersign mcp: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { _ = cs.Close() })
	// The gateway started its upstreams before it answered initialize.
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the upstream wrote no pid: %v\n%s", err, stderr.String())
	}
	pid, err := strconv.Atoi(string(raw))
	if err != nil || !alive(pid) {
		t.Fatalf("upstream pid %q: %v; alive %v", raw, err, alive(pid))
	}
	t.Cleanup(func() { // when the test fails
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	})
	return cmd, pid
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state …: comm may hold spaces and parentheses.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	return !strings.HasPrefix(strings.TrimSpace(string(rest)), "Z")
}

// waitGone polls /proc until process pid is gone (a process-level
// observation: nothing to wait on but the kernel), failing after 30 s.
func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still runs 30 s after its gateway ended", what, pid)
		}
		<-tick.C
	}
}

// TestMCPUpstreamDiesWithKilledGateway: `countersign mcp` killed with
// SIGKILL (it can clean nothing up) takes its command upstream with it,
// even one that ignores its stdin closing: the kernel kills it
// (Pdeathsig). Before, it ran on.
func TestMCPUpstreamDiesWithKilledGateway(t *testing.T) {
	t.Parallel()
	gw, pid := startGatewayWithPidUpstream(t, false)
	if err := gw.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the upstream", pid)
}

// TestMCPWrappedUpstreamDiesWithGateway: a wrapper upstream's own child
// (the server a wrapper such as `node tap.mjs -- node server.js` runs)
// goes when `countersign mcp` ends on SIGTERM: the gateway kills the
// upstream's process group. Before, only the wrapper was signalled and the
// server ran on. (On SIGKILL of the gateway only the wrapper is killed by
// the kernel; its child then goes only if it exits when stdin closes.)
func TestMCPWrappedUpstreamDiesWithGateway(t *testing.T) {
	t.Parallel()
	gw, pid := startGatewayWithPidUpstream(t, true)
	if err := gw.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "the wrapped upstream server", pid)
}
