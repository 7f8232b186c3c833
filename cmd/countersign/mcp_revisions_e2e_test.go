package main_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// connectRevision is a go-sdk MCP client on the demo's /mcp asking for
// protocol revision rev; progress notifications arrive on the returned
// channel.
func (rig *mcpRig) connectRevision(t *testing.T, rev string) (*mcp.ClientSession, <-chan *mcp.ProgressNotificationParams) {
	t.Helper()
	progress := make(chan *mcp.ProgressNotificationParams, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params
		},
	})
	bt := newBearerTransport(rig.d.APIKey)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: "http://" + rig.d.Main.Addr() + "/mcp", HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: rev})
	if err != nil {
		t.Fatalf("MCP connect at %s: %v", rev, err)
	}
	t.Cleanup(func() { bt.drop(); _ = cs.Close() })
	return cs, progress
}

// TestMCPRevisionsOverHTTP: a go-sdk client on /mcp at each revision the
// gateway serves (2026-07-28, sessionless; 2025-11-25 and 2025-06-18, with
// a session) negotiates that revision, and gets a gated call approved
// (it runs once), rejected (an error result with the reason; nothing runs)
// and edited (it runs with the edited arguments), with progress while it
// waits. Before the gateway routed 2026-07-28 requests to a stateless
// handler, that revision's calls were refused (-32022).
func TestMCPRevisionsOverHTTP(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	d, up := rig.d, rig.up
	bob, carol := d.Cast.Approver.ID, d.Cast.SecondApprover.ID
	for _, rev := range []string{"2026-07-28", "2025-11-25", "2025-06-18"} {
		t.Run(rev, func(t *testing.T) {
			cs, progress := rig.connectRevision(t, rev)
			if got := cs.InitializeResult().ProtocolVersion; got != rev {
				t.Fatalf("negotiated revision = %q, want %q", got, rev)
			}
			ctx := context.Background()
			tools, err := cs.ListTools(ctx, nil)
			if err != nil || len(tools.Tools) == 0 {
				t.Fatalf("ListTools = %+v, %v; want the upstream's tools", tools, err)
			}
			order := "rev-" + rev

			before := len(up.called("refund"))
			ch := callAsync(cs, "orders__refund", `{"order_id":"`+order+`","amount":40}`)
			id := rig.waiting(t, progress)
			if n := len(up.called("refund")); n != before {
				t.Fatalf("refund ran before the decision")
			}
			if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, apiCard(t, d, id).TS, "cs_approve"); err != nil {
				t.Fatalf("Click approve: %v", err)
			}
			if res := callResult(t, ch); res.IsError || !strings.Contains(resultString(res), "refund done") {
				t.Fatalf("approved refund = %+v (%q), want the upstream's answer", res, resultString(res))
			}
			if calls := up.called("refund"); len(calls) != before+1 || !bytes.Contains(calls[len(calls)-1], []byte(`"amount":40`)) {
				t.Errorf("refund calls = %s, want one more with amount 40", calls)
			}
			waitAudit(t, d, id, approval.EventExecuted)

			before = len(up.called("refund"))
			ch = callAsync(cs, "orders__refund", `{"order_id":"`+order+`","amount":900}`)
			id = rig.waiting(t, progress)
			if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, apiCard(t, d, id).TS, "cs_reject"); err != nil {
				t.Fatalf("Click reject: %v", err)
			}
			reason := "not at " + rev
			if res, err := d.Workspace.SubmitView(carol, openModal(t, d, carol).ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
				t.Fatalf("SubmitView = %+v, %v", res, err)
			}
			if res := callResult(t, ch); !res.IsError || !strings.Contains(resultString(res), reason) {
				t.Fatalf("rejected refund = %+v (%q), want isError with the reason", res, resultString(res))
			}
			if n := len(up.called("refund")); n != before {
				t.Errorf("a rejected refund ran")
			}

			ch = callAsync(cs, "orders__refund", `{"order_id":"`+order+`","amount":80}`)
			id = rig.waiting(t, progress)
			if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, apiCard(t, d, id).TS, "cs_edit"); err != nil {
				t.Fatalf("Click edit: %v", err)
			}
			if res, err := d.Workspace.SubmitView(bob, openModal(t, d, bob).ID, map[string]map[string]any{"f1": {"v": "64"}}); err != nil || !res.Closed {
				t.Fatalf("SubmitView = %+v, %v", res, err)
			}
			res := callResult(t, ch)
			calls := up.called("refund")
			if res.IsError || len(calls) != before+1 || !bytes.Contains(calls[len(calls)-1], []byte(`"amount":64`)) {
				t.Fatalf("edited refund = %+v, calls %s; want one more call with amount 64", res, calls)
			}
		})
	}
}

// TestMCPRevisionsOverStdio: `countersign mcp` (the real binary) serves
// every revision over stdio too: a go-sdk client at 2026-07-28, 2025-11-25
// and 2025-06-18 negotiates it and gets a gated call approved and run.
func TestMCPRevisionsOverStdio(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	up := newOrdersUpstream(t)
	policy := mcpPolicy(t, up.url)
	d := MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: policy}})
	for i, rev := range []string{"2026-07-28", "2025-11-25", "2025-06-18"} {
		t.Run(rev, func(t *testing.T) {
			cmd := bin.Command([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "COUNTERSIGN_API_KEY=" + d.APIKey, "COUNTERSIGN_CONFIG=" + policy},
				"mcp", "--url", "http://"+d.Main.Addr())
			var stderr lockedBuffer
			cmd.Stderr = &stderr
			c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
			cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: rev})
			if err != nil {
				t.Fatalf("connect to countersign mcp at %s: %v\n%s", rev, err, stderr.String())
			}
			defer cs.Close()
			if got := cs.InitializeResult().ProtocolVersion; got != rev {
				t.Fatalf("negotiated revision = %q, want %q", got, rev)
			}
			order := "stdio-" + rev
			ch := callAsync(cs, "orders__refund", `{"order_id":"`+order+`","amount":30}`)
			var id string
			// The subtests run one after the other: this call's request is
			// the (i+1)th.
			waitAuditN(t, d, i+1, func(e approval.Entry) bool {
				if e.Event == approval.EventRequested && e.Tool == "orders__refund" {
					id = e.RequestID
					return true
				}
				return false
			})
			if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, apiCard(t, d, id).TS, "cs_approve"); err != nil {
				t.Fatalf("Click: %v", err)
			}
			if res := callResult(t, ch); res.IsError || !strings.Contains(resultString(res), order) {
				t.Fatalf("approved refund = %+v (%q)\n%s", res, resultString(res), stderr.String())
			}
		})
	}
}
