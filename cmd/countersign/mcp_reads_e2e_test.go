package main_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// mcpPolicyWith is mcpPolicy with more tools declared and more policy
// text after it.
func mcpPolicyWith(t *testing.T, url, tools, more string) string {
	t.Helper()
	path := mcpPolicy(t, url)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(b), "\ntools:\n", "\ntools:\n"+tools, 1) + more
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startMCPDemoWith is startMCPDemo over the policy file at path (made by
// mcpPolicyWith for rig.up).
func startMCPDemoWith(t *testing.T, up *ordersUpstream, path string) *mcpRig {
	t.Helper()
	rig := &mcpRig{up: up, ticks: make(chan time.Time)}
	rig.d = MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: path},
		MCPTicker: func(time.Duration) (<-chan time.Time, func()) { return rig.ticks, func() {} }})
	return rig
}

// connectWithKey is a go-sdk MCP client on the demo's /mcp with key.
func (rig *mcpRig) connectWithKey(t *testing.T, key string) *mcp.ClientSession {
	t.Helper()
	bt := newBearerTransport(key)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: "http://" + rig.d.Main.Addr() + "/mcp", HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	t.Cleanup(func() { bt.drop(); _ = cs.Close() })
	return cs
}

// TestMCPReadsAudited: a resources/read and a prompts/get through the
// gateway each go through the API as a call of their upstream's
// pseudo-tool (orders__resources_read, orders__prompts_get): read-only,
// so the external rule (review never here) lets them through without a
// person, and each leaves its audit entries.
func TestMCPReadsAudited(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	cs, _ := rig.connect(t)
	ctx := context.Background()
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "orders://policy"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "refunds within 30 days" {
		t.Fatalf("ReadResource = %+v, %v; want the upstream's text", rr, err)
	}
	pr, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "orders__apology"})
	if err != nil || len(pr.Messages) != 1 {
		t.Fatalf("GetPrompt = %+v, %v; want the upstream's prompt", pr, err)
	}
	for _, tool := range []string{"orders__resources_read", "orders__prompts_get"} {
		waitAuditN(t, rig.d, 1, func(e approval.Entry) bool { return e.Tool == tool && e.Event == approval.EventAutoApproved })
	}
	if cards := cardsFor(rig.d, "resources_read"); len(cards) != 0 {
		t.Errorf("a read-only read posted %d cards", len(cards))
	}
}

// TestMCPReadGatedByPolicy: a policy that declares
// orders__resources_read with review always holds every resources/read
// for a person: no content until the click, then the upstream's.
func TestMCPReadGatedByPolicy(t *testing.T) {
	t.Parallel()
	up := newOrdersUpstream(t)
	rig := startMCPDemoWith(t, up, mcpPolicyWith(t, up.url, `  - name: orders__resources_read
    description: Read a resource of the orders MCP server.
    risk: medium
    review: always
    decisions: [approve, reject]
    schema:
      type: object
      properties:
        uri: {type: string}
      required: [uri]
`, ""))
	cs, _ := rig.connect(t)
	type answer struct {
		res *mcp.ReadResourceResult
		err error
	}
	done := make(chan answer, 1)
	go func() { // returns when the read is answered or the session closes
		res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "orders://policy"})
		done <- answer{res, err}
	}()
	var id string
	waitAuditN(t, rig.d, 1, func(e approval.Entry) bool {
		if e.Event == approval.EventRequested && e.Tool == "orders__resources_read" {
			id = e.RequestID
			return true
		}
		return false
	})
	card := apiCard(t, rig.d, id)
	select {
	case a := <-done:
		t.Fatalf("ReadResource answered before any decision: %+v, %v", a.res, a.err)
	default:
	}
	if err := rig.d.Workspace.Click(rig.d.Cast.Approver.ID, rig.d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	select {
	case a := <-done:
		if a.err != nil || len(a.res.Contents) != 1 || a.res.Contents[0].Text != "refunds within 30 days" {
			t.Fatalf("approved ReadResource = %+v, %v; want the upstream's text", a.res, a.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ReadResource did not return after the approval")
	}
	waitAudit(t, rig.d, id, approval.EventExecuted)
}

// TestMCPToolsListFilteredByKey: a key allowed only orders__refund lists
// only orders__refund through the gateway; the demo's key ("*") lists
// every tool.
func TestMCPToolsListFilteredByKey(t *testing.T) {
	t.Parallel()
	up := newOrdersUpstream(t)
	const key = "csk_refunds_only_0123456789"
	rig := startMCPDemoWith(t, up, mcpPolicyWith(t, up.url, "",
		"\napi:\n  keys:\n    - name: refunds-only\n      sha256: "+api.HashKey(key)+"\n      tools: [orders__refund]\n"))
	names := func(cs *mcp.ClientSession) []string {
		var out []string
		for tl, err := range cs.Tools(context.Background(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tl.Name)
		}
		return out
	}
	if got := names(rig.connectWithKey(t, key)); len(got) != 1 || got[0] != "orders__refund" {
		t.Errorf("tools for a key allowed orders__refund = %v, want [orders__refund]", got)
	}
	if got := names(rig.connectWithKey(t, rig.d.APIKey)); len(got) != 3 {
		t.Errorf("tools for the demo's key (*) = %v, want the 3 upstream tools", got)
	}
}
