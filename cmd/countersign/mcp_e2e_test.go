package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// ordersUpstream is an in-process upstream MCP server (go-sdk, streamable
// HTTP): lookup is read-only, refund is declared by the test policy
// (review always), wipe carries only destructiveHint and is not in the
// policy, whose external rule is review never. It records each call.
type ordersUpstream struct {
	url   string
	mu    sync.Mutex
	calls map[string][]json.RawMessage
}

func newOrdersUpstream(t *testing.T) *ordersUpstream {
	t.Helper()
	u := &ordersUpstream{calls: map[string][]json.RawMessage{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	no, yes := false, true
	tools := map[string]*mcp.ToolAnnotations{
		"lookup": {ReadOnlyHint: true},
		"refund": {DestructiveHint: &no, OpenWorldHint: &no},
		"wipe":   {DestructiveHint: &yes},
	}
	for name, ann := range tools {
		s.AddTool(&mcp.Tool{Name: name, Description: "orders " + name, Annotations: ann,
			InputSchema: map[string]any{"type": "object"}},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				u.mu.Lock()
				u.calls[name] = append(u.calls[name], append(json.RawMessage(nil), req.Params.Arguments...))
				u.mu.Unlock()
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " done: " + string(req.Params.Arguments)}}}, nil
			})
	}
	s.AddResource(&mcp.Resource{URI: "orders://policy", Name: "refund-policy", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "refunds within 30 days"}}}, nil
		})
	s.AddPrompt(&mcp.Prompt{Name: "apology"}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "write an apology"}}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

func (u *ordersUpstream) called(tool string) []json.RawMessage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]json.RawMessage(nil), u.calls[tool]...)
}

// mcpPolicy is the demo's policy with the external rule at review never
// (so annotations alone decide for undeclared tools), orders__refund
// declared (review always, editable) and the upstream at url.
func mcpPolicy(t testing.TB, url string) string {
	t.Helper()
	src := string(demo.Policy)
	src = strings.Replace(src, "external:\n  risk: medium\n  review: always\n", "external:\n  risk: low\n  review: never\n", 1)
	if !strings.Contains(src, "review: never\n  decisions: [approve, edit, reject]\n  timeout: 4h") {
		t.Fatal("the demo policy's external rule changed; update mcpPolicy")
	}
	src = strings.Replace(src, "\ntools:\n", `
tools:
  - name: orders__refund
    description: Refund an order (through the orders MCP server).
    risk: medium
    review: always
    decisions: [approve, edit, reject]
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number}
      required: [order_id, amount]
`, 1)
	src += "\nmcp:\n  upstreams:\n    - name: orders\n      url: " + url + "\n"
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mcpRig is the demo serving /mcp in front of the orders upstream, with
// progress ticks driven by the test.
type mcpRig struct {
	d     *main.Demo
	up    *ordersUpstream
	ticks chan time.Time
}

func startMCPDemo(t *testing.T) *mcpRig {
	t.Helper()
	rig := &mcpRig{up: newOrdersUpstream(t), ticks: make(chan time.Time)}
	rig.d = MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: mcpPolicy(t, rig.up.url)},
		MCPTicker: func(time.Duration) (<-chan time.Time, func()) { return rig.ticks, func() {} }})
	return rig
}

// bearerTransport sends the API key as the MCP client's bearer token,
// over connections it keeps so a test can cut them (a client gone).
type bearerTransport struct {
	key   string
	base  *http.Transport
	mu    sync.Mutex
	conns []net.Conn
}

func newBearerTransport(key string) *bearerTransport {
	b := &bearerTransport{key: key}
	b.base = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
		return c, err
	}}
	return b
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.base.RoundTrip(r)
}

// drop cuts every connection, as a client that crashed or lost its
// network.
func (b *bearerTransport) drop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
}

// connect is a go-sdk MCP client on the demo's /mcp; progress
// notifications arrive on the returned channel.
func (rig *mcpRig) connect(t *testing.T) (*mcp.ClientSession, <-chan *mcp.ProgressNotificationParams) {
	t.Helper()
	cs, progress, _ := rig.connectDroppable(t)
	return cs, progress
}

// connectDroppable is connect, also returning the client's transport.
func (rig *mcpRig) connectDroppable(t *testing.T) (*mcp.ClientSession, <-chan *mcp.ProgressNotificationParams, *bearerTransport) {
	t.Helper()
	progress := make(chan *mcp.ProgressNotificationParams, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params
		},
	})
	bt := newBearerTransport(rig.d.APIKey)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: "http://" + rig.d.Main.Addr() + "/mcp", HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	t.Cleanup(func() { bt.drop(); _ = cs.Close() })
	return cs, progress, bt
}

type callAnswer struct {
	res *mcp.CallToolResult
	err error
}

// callAsync calls tool in the background with a progress token.
func callAsync(cs *mcp.ClientSession, tool, args string) <-chan callAnswer {
	out := make(chan callAnswer, 1)
	go func() { // exits when the call returns (answered, or the session closed)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		params := &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)}
		params.SetProgressToken("tok-" + tool)
		res, err := cs.CallTool(ctx, params)
		out <- callAnswer{res, err}
	}()
	return out
}

func callResult(t *testing.T, ch <-chan callAnswer) *mcp.CallToolResult {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("CallTool: %v", a.err)
		}
		return a.res
	case <-time.After(60 * time.Second):
		t.Fatal("CallTool did not return")
	}
	return nil
}

func resultString(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

var requestIDPattern = regexp.MustCompile(`req_[A-Za-z0-9_-]+`)

// waiting ticks the waiting call's progress ticker and returns the
// request id the progress notification names.
func (rig *mcpRig) waiting(t *testing.T, progress <-chan *mcp.ProgressNotificationParams) string {
	t.Helper()
	select {
	case rig.ticks <- time.Now():
	case <-time.After(30 * time.Second):
		t.Fatal("no call is waiting for the progress ticker")
	}
	select {
	case p := <-progress:
		id := requestIDPattern.FindString(p.Message)
		if !strings.Contains(p.Message, "waiting for a human approval") || id == "" || p.Progress != 1 {
			t.Fatalf("progress = %+v, want a readable wait message naming the request", p)
		}
		return id
	case <-time.After(30 * time.Second):
		t.Fatal("no progress notification")
	}
	return ""
}

// TestMCPGatewayHTTP: the go-sdk client on /mcp lists the upstream's tools
// prefixed; a read-only tool the policy does not declare runs at once,
// once; a declared review-always tool waits (with progress) for a click
// and then runs once with its arguments; a rejection comes back as an
// error result with the reason and nothing runs; an edit runs with the
// edited arguments; a tool with only destructiveHint (external rule never)
// is gated; resources and prompts pass through.
func TestMCPGatewayHTTP(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	d, up := rig.d, rig.up
	cs, progress := rig.connect(t)
	ctx := context.Background()
	bob, carol := d.Cast.Approver.ID, d.Cast.SecondApprover.ID

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"orders__lookup", "orders__refund", "orders__wipe"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("tools = %v, want %s", names, want)
		}
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "orders://policy"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "refunds within 30 days" {
		t.Errorf("ReadResource = %+v, %v; want the upstream's text", rr, err)
	}
	pr, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "orders__apology"})
	if err != nil || len(pr.Messages) != 1 {
		t.Errorf("GetPrompt = %+v, %v; want the upstream's prompt", pr, err)
	}

	t.Run("read-only passes at once", func(t *testing.T) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__lookup", Arguments: map[string]any{"order_id": "1234"}})
		if err != nil || res.IsError || !strings.Contains(resultString(res), "lookup done") {
			t.Fatalf("lookup = %+v, %v; want the upstream's answer", res, err)
		}
		if n := len(up.called("lookup")); n != 1 {
			t.Errorf("lookup ran %d times, want 1", n)
		}
		if cards := cardsFor(d, "orders__lookup"); len(cards) != 0 {
			t.Errorf("a read-only call posted %d cards", len(cards))
		}
	})

	t.Run("gated call waits for a click and runs once", func(t *testing.T) {
		ch := callAsync(cs, "orders__refund", `{"order_id":"1234","amount":40}`)
		id := rig.waiting(t, progress)
		card := apiCard(t, d, id)
		if n := len(up.called("refund")); n != 0 {
			t.Fatalf("refund ran %d times before the decision", n)
		}
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		res := callResult(t, ch)
		if res.IsError || !strings.Contains(resultString(res), "refund done") {
			t.Fatalf("refund = %+v, want the upstream's answer", res)
		}
		calls := up.called("refund")
		if len(calls) != 1 || !bytes.Contains(calls[0], []byte(`"amount":40`)) {
			t.Errorf("refund calls = %s, want one with amount 40", calls)
		}
		waitAudit(t, d, id, approval.EventExecuted)
	})

	t.Run("rejection is an error result with the reason", func(t *testing.T) {
		before := len(up.called("refund"))
		ch := callAsync(cs, "orders__refund", `{"order_id":"77","amount":900}`)
		id := rig.waiting(t, progress)
		card := apiCard(t, d, id)
		if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, carol)
		const reason = "order 77 was already refunded"
		if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		res := callResult(t, ch)
		if !res.IsError || !strings.Contains(resultString(res), reason) || !strings.Contains(resultString(res), "rejected") {
			t.Fatalf("rejected call = %+v (%q), want isError with the reason", res, resultString(res))
		}
		if n := len(up.called("refund")); n != before {
			t.Errorf("a rejected refund ran")
		}
	})

	t.Run("edit forwards the edited arguments", func(t *testing.T) {
		before := len(up.called("refund"))
		ch := callAsync(cs, "orders__refund", `{"order_id":"1234","amount":80}`)
		id := rig.waiting(t, progress)
		card := apiCard(t, d, id)
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, bob)
		if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "64"}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		res := callResult(t, ch)
		calls := up.called("refund")
		if res.IsError || len(calls) != before+1 || !bytes.Contains(calls[len(calls)-1], []byte(`"amount":64`)) {
			t.Fatalf("edited refund = %+v, calls %s; want one call with amount 64", res, calls)
		}
	})

	t.Run("destructive hint alone is gated", func(t *testing.T) {
		ch := callAsync(cs, "orders__wipe", `{"order_id":"1234"}`)
		id := rig.waiting(t, progress)
		card := apiCard(t, d, id)
		if n := len(up.called("wipe")); n != 0 {
			t.Fatalf("wipe ran %d times before the decision", n)
		}
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		if res := callResult(t, ch); res.IsError {
			t.Fatalf("approved wipe = %+v", res)
		}
		if n := len(up.called("wipe")); n != 1 {
			t.Errorf("wipe ran %d times, want 1", n)
		}
	})
}

// TestMCPDisconnectWhileWaiting: the MCP client goes away while a call
// waits; the gateway stops waiting; the approval clicked afterwards is
// recorded and audited; the upstream tool is never called.
func TestMCPDisconnectWhileWaiting(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	d, up := rig.d, rig.up
	cs, progress, bt := rig.connectDroppable(t)
	ch := callAsync(cs, "orders__refund", `{"order_id":"1234","amount":30}`)
	id := rig.waiting(t, progress)
	card := apiCard(t, d, id)
	bt.drop() // the client is gone
	if a := <-ch; a.err == nil {
		t.Fatalf("CallTool after the connection dropped = %+v, want an error", a.res)
	}
	// The gateway's long poll ends with the session.
	waitUntil(t, "the gateway to stop waiting", func() bool { return d.Main.API.Waiting() == 0 })
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	waitAudit(t, d, id, approval.EventDecided)
	r, err := d.Main.Store.Request(context.Background(), id)
	if err != nil || r.Status != approval.StatusApproved {
		t.Fatalf("request = %+v, %v; want approved and not executing", r, err)
	}
	if n := len(up.called("refund")); n != 0 {
		t.Errorf("the upstream ran %d times with nobody waiting", n)
	}
}

// TestMCPStdioBinary: the real binary `countersign mcp` as a go-sdk
// CommandTransport, against the demo's API and the orders upstream: a
// read-only call passes, a gated call waits for a click and runs once.
func TestMCPStdioBinary(t *testing.T) {
	t.Parallel() // waits on other processes and timers: overlaps with the rest of the package
	bin := buildBinary(t)
	up := newOrdersUpstream(t)
	policy := mcpPolicy(t, up.url)
	d := MustStartDemo(t, &main.Demo{World: demo.World{PolicyFile: policy}})
	cmd := bin.Command([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "COUNTERSIGN_API_KEY=" + d.APIKey, "COUNTERSIGN_CONFIG=" + policy},
		"mcp", "--url", "http://"+d.Main.Addr())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to countersign mcp: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__lookup", Arguments: map[string]any{"order_id": "1234"}})
	if err != nil || res.IsError {
		t.Fatalf("lookup = %+v (%s), %v\n%s", res, resultString(res), err, stderr.String())
	}

	ch := callAsync(cs, "orders__wipe", `{"order_id":"9"}`)
	// Gated by its destructive hint alone: its request is audited under
	// the prefixed tool's name; click once its card is bound.
	var id string
	waitAuditN(t, d, 1, func(e approval.Entry) bool {
		if e.Event == approval.EventRequested && e.Tool == "orders__wipe" {
			id = e.RequestID
			return true
		}
		return false
	})
	card := apiCard(t, d, id)
	if n := len(up.called("wipe")); n != 0 {
		t.Fatalf("wipe ran before the decision")
	}
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	if res := callResult(t, ch); res.IsError || !strings.Contains(resultString(res), "wipe done") {
		t.Fatalf("approved wipe = %+v\n%s", res, stderr.String())
	}
	if n := len(up.called("wipe")); n != 1 {
		t.Errorf("wipe ran %d times, want 1", n)
	}
}

// TestMCPRefusesUnknownKeys: /mcp answers 403 with a JSON-RPC error before
// any MCP session starts when the bearer key is missing or is not an API
// key, so a stranger cannot even list the upstreams' tools, and gets an
// answer smaller than the request it sent. No WWW-Authenticate and no 401:
// MCP clients take those for "start OAuth" (TestMCPBadKeyNodeClient). The
// go-sdk client with a wrong key fails to connect, saying the key is bad.
func TestMCPRefusesUnknownKeys(t *testing.T) {
	t.Parallel()
	rig := startMCPDemo(t)
	url := "http://" + rig.d.Main.Addr() + "/mcp"
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for name, auth := range map[string]string{"no key": "", "wrong key": "Bearer csk_not_a_key", "not bearer": "Basic Ym9iOmJvYg=="} {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		sent, err := httputil.DumpRequestOut(req, true)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := httputil.DumpResponse(resp, true)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), `"unauthenticated"`) || !strings.Contains(string(b), "API key") {
			t.Errorf("%s: POST /mcp = %d %s, want 403 with a JSON-RPC error naming the API key", name, resp.StatusCode, b)
		}
		if h := resp.Header.Values("WWW-Authenticate"); len(h) != 0 {
			t.Errorf("%s: WWW-Authenticate = %q, want none (clients would start OAuth)", name, h)
		}
		if strings.Contains(string(b), "orders__") {
			t.Errorf("%s: the refusal names a tool: %s", name, b)
		}
		if len(got) > len(sent) {
			t.Errorf("%s: answered %d bytes to a %d-byte request, want no more than was sent:\n%s", name, len(got), len(sent), got)
		}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "stranger", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: url, HTTPClient: &http.Client{Transport: newBearerTransport("csk_not_a_key")}, MaxRetries: -1}, nil)
	if err == nil {
		_ = cs.Close()
		t.Fatal("MCP connect with a wrong key succeeded, want it refused")
	}
	if !strings.Contains(err.Error(), "bad API key") {
		t.Errorf("MCP connect with a wrong key: %v, want it to say the key is bad", err)
	}
}
