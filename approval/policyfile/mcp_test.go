package policyfile_test

import (
	"slices"
	"testing"
)

// TestWrapperCommand: an upstream's command is a command line, not a set:
// a wrapper that names a program twice passes, in order, repeats and all.
func TestWrapperCommand(t *testing.T) {
	f := MustParse(t, `
version: 1
slack: {approvals_channel: G0APPROV1}
tools: [{name: lookup}]
mcp:
  upstreams:
    - name: tapped
      command: [node, tap.mjs, log, --, node, server.js, /dir, ""]
`)
	got := f.MCP.Upstreams[0].Command
	want := []string{"node", "tap.mjs", "log", "--", "node", "server.js", "/dir", ""}
	if !slices.Equal(got, want) {
		t.Errorf("Command = %q, want %q", got, want)
	}
}
