package main_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// The official MCP TypeScript SDK's client (testdata/mcpnode, pinned in its
// package-lock.json; .ci/run installs it with npm ci) against /mcp, with
// Node 22. Without Node 22 or the packages these tests skip, saying so;
// under CI=true they fail.

const mcpNodeDir = "testdata/mcpnode"

// nodeAnswer is the last line client.mjs prints.
type nodeAnswer struct {
	OK     bool     `json:"ok"`
	Error  string   `json:"error"`
	OAuth  []string `json:"oauth"`
	Result struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"result"`
}

// startNodeClient runs client.mjs with args; the returned function waits
// for it and returns its answer.
func startNodeClient(t *testing.T, args ...string) func() nodeAnswer {
	t.Helper()
	node := exampleNode(t)
	exampleReady(t, mcpNodeDir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, node, append([]string{"client.mjs"}, args...)...)
	cmd.Dir = mcpNodeDir
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // exits when node does (ctx kills it)
	return func() nodeAnswer {
		t.Helper()
		if err := <-exited; err != nil {
			t.Fatalf("node client.mjs: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		var a nodeAnswer
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &a); err != nil {
			t.Fatalf("client.mjs's last line is not its answer: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
		}
		return a
	}
}

// TestMCPHeldCallNodeClient: a Node MCP client (the TypeScript SDK on
// Node's fetch) whose fetch waits at most 2 s for response headers, as
// undici waits 300 s, calls a gated tool without a progress token; a person
// approves after 10 s; the client gets the tool's answer. The gateway
// starts the held call's response at once (status, headers, an SSE
// comment). Before, it sent nothing until the decision and the client gave
// up with a headers timeout.
func TestMCPHeldCallNodeClient(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	d, up := rig.d, rig.up
	wait := startNodeClient(t, "call", "http://"+d.Main.Addr()+"/mcp", d.APIKey, "orders__refund", `{"order_id":"node-1","amount":40}`)
	var id string
	waitAuditN(t, d, 1, func(e approval.Entry) bool {
		if e.Event == approval.EventRequested && e.Tool == "orders__refund" {
			id = e.RequestID
			return true
		}
		return false
	})
	card := apiCard(t, d, id)
	// The scenario, not a synchronisation: the person takes 10 s of wall
	// time, five times the client's 2 s limit on response headers.
	<-time.After(10 * time.Second)
	if n := len(up.called("refund")); n != 0 {
		t.Fatalf("refund ran %d times before the decision", n)
	}
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	a := wait()
	if !a.OK || a.Result.IsError || len(a.Result.Content) == 0 || !strings.Contains(a.Result.Content[0].Text, "refund done") {
		t.Fatalf("the Node client's call = %+v, want the upstream's answer after the approval", a)
	}
	if n := len(up.called("refund")); n != 1 {
		t.Errorf("refund ran %d times, want 1", n)
	}
	waitAudit(t, d, id, approval.EventExecuted)
}

// TestMCPBadKeyNodeClient: the TypeScript SDK's client, given an OAuth
// provider as MCP Inspector and Claude Code give one, connects with a
// wrong key and with none: it fails saying the key is bad (or missing),
// and starts no OAuth flow. Before, /mcp answered 401 with
// WWW-Authenticate: Bearer and the SDK went looking for an OAuth server.
func TestMCPBadKeyNodeClient(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	url := "http://" + rig.d.Main.Addr() + "/mcp"
	for _, tc := range []struct{ name, key, want string }{
		{"wrong key", "csk_not_a_key", "bad API key"},
		{"no key", "", "no API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := startNodeClient(t, "connect", url, tc.key)()
			if a.OK || !strings.Contains(a.Error, tc.want) || len(a.OAuth) != 0 {
				t.Fatalf("connect with %s = %+v, want a failure saying %q and no OAuth flow", tc.name, a, tc.want)
			}
		})
	}
}
