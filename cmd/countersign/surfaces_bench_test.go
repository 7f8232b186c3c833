package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// BenchmarkClickToSurfaces measures, in one run and through the production
// wiring of serve (the demo with signed HTTP delivery of clicks, real Redis
// when REDIS_URL is set), the time from an approver's click to the approved
// call reaching what runs it, for three surfaces, one sub-benchmark each:
//
//   - tool: Countersign's own agent calls the refund tool at the system of
//     record (BenchmarkClickToTool with nothing else pending: the row to
//     compare with); tool/slack-post=50ms is the same with Slack answering
//     each chat.postMessage after 50 ms (slowSlack), as Slack does, not at
//     once as the local workspace does;
//   - mcp: an MCP client (the go-sdk's, over streamable HTTP on serve's
//     /mcp, the gateway `countersign mcp` runs over stdio) called a gated
//     tool of an upstream MCP server (the go-sdk's, in process): from the
//     click to the upstream's tools/call handler. The gateway waits through
//     /v1 in process (serve's wiring; `countersign mcp` does the same over
//     TCP);
//   - mcp/stdio: the same call through the REAL binary `countersign mcp`
//     (buildBinary: the test binary run as the command, or
//     $COUNTERSIGN_TEST_BINARY), the go-sdk client over CommandTransport
//     (stdio), the gateway forwarding to the upstream over streamable HTTP
//     and waiting on serve's /v1 over TCP: the row "click → MCP upstream
//     tools/call through `countersign mcp`". The process starts once,
//     before timing;
//   - hook: `countersign hook claude-code` (main.Run, in process: no
//     process start-up) asked about a Bash command: from the click to the
//     hook's first byte on stdout, an allow (after its claim).
//
// Each sample is a new call (its card waited for, untimed, then its waiter
// parked on the request's hint channel, parkedOn) and one click.
// Metrics: click-p50-ms, click-p99-ms, click-max-ms; with CLICK_HOSTNOISE=1
// also host-stall-%, quiet-samples and quiet-p99-ms (startHostNoise).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign/ -run '^$' -bench ClickToSurfaces -benchtime 200x -timeout 20m
func BenchmarkClickToSurfaces(b *testing.B) {
	b.Run("tool", func(b *testing.B) { benchClickToTool(b, 0) })
	b.Run("tool/slack-post=50ms", func(b *testing.B) { benchClickToToolSlack(b, 0, 50*time.Millisecond) })
	b.Run("mcp", benchClickToMCP)
	b.Run("mcp/stdio", benchClickToMCPStdio)
	b.Run("hook", benchClickToHook)
}

// surfaceBench is what the mcp and hook samples share: the demo, the last
// card clicked and the timings.
type surfaceBench struct {
	b     *testing.B
	d     *main.Demo
	ctx   context.Context
	after string // the last card clicked
	// why, when set, says what the caller got when no card came.
	why func() string
	lat []time.Duration
	// windows are the samples' click and arrival, for the host-noise
	// meter when CLICK_HOSTNOISE is set (noise, else nil).
	windows []stageSample
	noise   *hostNoise
	rr      *rereads // the wake hub's re-reads (parkedOn)
	// stderr, when set, is what the gateway process wrote to its stderr.
	stderr func() string
}

// stderrTail is the end of the gateway's stderr, for a failure's message.
func (s *surfaceBench) stderrTail() string {
	if s.stderr == nil {
		return ""
	}
	e := s.stderr()
	if len(e) > 4000 {
		e = e[len(e)-4000:]
	}
	return "; the gateway's stderr:\n" + e
}

func newSurfaceBench(b *testing.B, d *main.Demo) *surfaceBench {
	asServed(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return &surfaceBench{b: b, d: d, ctx: ctx, rr: watchRereads(d), noise: startHostNoise(b)}
}

// card waits for the next approvals card of a request on tool whose
// blocks contain marker, then for a waiter to be parked on its request.
func (s *surfaceBench) card(tool, marker string) slacksim.Message {
	s.b.Helper()
	ws, st := s.d.Workspace, s.d.Main.Store
	var card slacksim.Message
	var id string
	wctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	err := ws.WaitFor(wctx, func() bool {
		for _, m := range ws.MessagesAfter(s.d.Cast.Approvals.ID, s.after) {
			if !strings.Contains(string(m.Blocks), "cs_approve") || !strings.Contains(string(m.Blocks), marker) {
				continue
			}
			v := buttonValue.FindStringSubmatch(string(m.Blocks))
			if v == nil {
				continue
			}
			card, id = m, v[1]
			return true
		}
		return false
	})
	if err != nil {
		for _, m := range ws.MessagesAfter(s.d.Cast.Approvals.ID, s.after) {
			s.b.Logf("card %s: %s", m.TS, m.Blocks)
		}
		if s.why != nil {
			s.b.Log(s.why())
		}
		s.b.Fatalf("waiting for the card of %s: %v", marker, err)
	}
	s.after = card.TS
	// The card is bound to its request after Slack answered its post; for
	// an API request nothing changes in the workspace after that, so ask
	// the store again and again (outside the timed part).
	for deadline := time.Now().Add(30 * time.Second); ; {
		r, err := st.Request(s.ctx, id)
		if err == nil && r.Card.TS == card.TS && r.Tool == tool {
			break
		}
		if time.Now().After(deadline) {
			s.b.Fatalf("request %s = %+v, %v; want a %s request bound to card %s", id, r, err, tool, card.TS)
		}
	}
	if !parkedOn(s.ctx, s.d, s.rr, id) {
		s.b.Fatalf("nobody parked on %s", id)
	}
	return card
}

// click approves card and waits for reached to say when the approved call
// arrived; the sample is that time less the click's start.
func (s *surfaceBench) click(card slacksim.Message, reached <-chan time.Time) {
	s.b.Helper()
	s.b.StartTimer()
	t0 := time.Now()
	if err := s.d.Workspace.Click(s.d.Cast.Approver.ID, s.d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		s.b.Fatalf("Click(approve): %v", err)
	}
	select {
	case at := <-reached:
		s.lat = append(s.lat, at.Sub(t0))
		s.windows = append(s.windows, stageSample{click: t0, hit: at})
	case <-time.After(30 * time.Second):
		s.b.Fatal("the approved call never arrived")
	}
	s.b.StopTimer()
}

func (s *surfaceBench) report() {
	slices.Sort(s.lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	n := len(s.lat)
	s.b.ReportMetric(ms(s.lat[n/2]), "click-p50-ms")
	s.b.ReportMetric(ms(s.lat[n*99/100]), "click-p99-ms")
	s.b.ReportMetric(ms(s.lat[n-1]), "click-max-ms")
	reportHostNoise(s.b, s.noise, s.windows)
	s.b.ReportMetric(0, "ns/op")
}

// benchKey adds to the policy file at path an API key without the demo
// key's limit of 600 calls a minute (a sample makes three to five), and
// returns it.
func benchKey(b *testing.B, path string) string {
	src, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	if strings.Contains(string(src), "\napi:") {
		b.Fatal("the policy has an api section already; add the key to it")
	}
	key := "csk_bench_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	src = append(src, fmt.Sprintf("\napi:\n  keys:\n    - name: bench\n      sha256: %s\n      tools: [\"*\"]\n      rate_per_minute: 1000000\n", api.HashKey(key))...)
	if err := os.WriteFile(path, src, 0o600); err != nil {
		b.Fatal(err)
	}
	return key
}

// benchUpstream is an upstream MCP server named orders (go-sdk, streamable
// HTTP) with one tool, refund, whose handler sends when it was called.
func benchUpstream(b *testing.B) (string, <-chan time.Time) {
	hits := make(chan time.Time, 16)
	s := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	no := false
	s.AddTool(&mcp.Tool{Name: "refund", Description: "orders refund", Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no},
		InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			hits <- time.Now()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "refunded"}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	b.Cleanup(srv.Close)
	return srv.URL, hits
}

// benchClickToMCP: the go-sdk client on serve's /mcp (streamable HTTP).
func benchClickToMCP(b *testing.B) {
	benchClickToMCPVia(b, func(s *surfaceBench, key, _ string) *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: "bench-agent", Version: "1"}, nil)
		bt := newBearerTransport(key)
		cs, err := c.Connect(s.ctx, &mcp.StreamableClientTransport{
			Endpoint: "http://" + s.d.Main.Addr() + "/mcp", HTTPClient: &http.Client{Transport: bt}, MaxRetries: -1}, nil)
		if err != nil {
			b.Fatalf("MCP connect: %v", err)
		}
		b.Cleanup(func() { bt.drop(); _ = cs.Close() })
		return cs
	})
}

// benchClickToMCPStdio: the go-sdk client over stdio to the real binary
// `countersign mcp`, which reaches serve's /v1 over TCP.
func benchClickToMCPStdio(b *testing.B) {
	bin := buildBinary(b)
	benchClickToMCPVia(b, func(s *surfaceBench, key, policy string) *mcp.ClientSession {
		cmd := bin.Command([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.TempDir(), "COUNTERSIGN_API_KEY=" + key, "COUNTERSIGN_CONFIG=" + policy},
			"mcp", "--url", "http://"+s.d.Main.Addr())
		stderr := &lockedBuffer{}
		cmd.Stderr = stderr
		c := mcp.NewClient(&mcp.Implementation{Name: "bench-agent", Version: "1"}, nil)
		cs, err := c.Connect(s.ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
		if err != nil {
			b.Fatalf("connect to countersign mcp: %v\n%s", err, stderr.String())
		}
		b.Cleanup(func() { _ = cs.Close() })
		s.stderr = stderr.String
		return cs
	})
}

// benchClickToMCPVia runs the mcp samples with the client session connect
// returns (given the bench key and the policy file).
func benchClickToMCPVia(b *testing.B, connect func(s *surfaceBench, key, policy string) *mcp.ClientSession) {
	url, hits := benchUpstream(b)
	file := mcpPolicy(b, url)
	key := benchKey(b, file)
	d := MustStartDemo(b, &main.Demo{World: demo.World{HTTPDelivery: true, PolicyFile: file}})
	s := newSurfaceBench(b, d)
	cs := connect(s, key, file)
	b.StopTimer()
	b.ResetTimer()
	for i := range b.N {
		amount := benchAmount(i)
		answer := callAsync(cs, "orders__refund", `{"order_id":"1234","amount":`+amount+`}`)
		s.why = func() string {
			select {
			case a := <-answer:
				if a.err != nil {
					return fmt.Sprintf("CallTool: %v", a.err)
				}
				return "CallTool = " + resultString(a.res)
			default:
				return "CallTool still waiting" + s.stderrTail()
			}
		}
		s.click(s.card("orders__refund", "amount "+amount+", order_id"), hits)
		select {
		case a := <-answer:
			if a.err != nil || a.res.IsError {
				b.Fatalf("CallTool = %+v, %v; want the upstream's result%s", a.res, a.err, s.stderrTail())
			}
		case <-time.After(30 * time.Second):
			b.Fatal("CallTool did not return")
		}
	}
	s.report()
}

// firstWrite is a hook's stdout that sends when its first byte came.
type firstWrite struct {
	mu   sync.Mutex // guards buf and sent
	buf  strings.Builder
	sent bool
	at   chan time.Time
}

func (w *firstWrite) Write(p []byte) (int, error) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.sent {
		w.sent = true
		w.at <- now
	}
	return w.buf.Write(p)
}

func benchClickToHook(b *testing.B) {
	file := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(hookPolicy), 0o600); err != nil {
		b.Fatal(err)
	}
	key := benchKey(b, file)
	d := MustStartDemo(b, &main.Demo{World: demo.World{HTTPDelivery: true, PolicyFile: file}})
	b.Setenv("COUNTERSIGN_API_KEY", key)
	b.Setenv("COUNTERSIGN_URL", "")
	b.Setenv("XDG_STATE_HOME", b.TempDir())
	s := newSurfaceBench(b, d)
	b.StopTimer()
	b.ResetTimer()
	for i := range b.N {
		cmd := fmt.Sprintf("rm -rf build-%d", i)
		input, _ := json.Marshal(map[string]string{"command": cmd, "description": "Remove a build directory"})
		out := &firstWrite{at: make(chan time.Time, 1)}
		done := make(chan int, 1)
		go func() { // exits when the hook answers (bounded by its --timeout)
			var stderr strings.Builder
			argv := []string{"hook", "claude-code", "--url", "http://" + d.Main.Addr(), "--timeout", "60s"}
			done <- main.Run(context.Background(), argv, main.Stdio{Stdin: strings.NewReader(preToolUse("Bash", fmt.Sprintf("toolu_bench_%d", i), string(input))),
				Stdout: out, Stderr: &stderr})
		}()
		s.click(s.card("Bash", cmd), out.at)
		if code := <-done; code != 0 {
			b.Fatalf("hook exited %d", code)
		}
		out.mu.Lock()
		answer := out.buf.String()
		out.mu.Unlock()
		if !strings.Contains(answer, `"permissionDecision":"allow"`) {
			b.Fatalf("hook answered %s, want allow", answer)
		}
	}
	s.report()
}
