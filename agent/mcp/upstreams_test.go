package mcp_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/mcp"
)

// upstreamVar, set in an upstream's policy env, makes this test binary an
// MCP stdio server (see TestMain): its tools environ and args read back
// its environment and its command line. upstreamNeedsVar names a file
// that must exist for it to start; without it the process exits at once
// (an upstream that fails to start).
const (
	upstreamVar      = "COUNTERSIGN_TEST_UPSTREAM"
	upstreamNeedsVar = "COUNTERSIGN_TEST_UPSTREAM_NEEDS"
)

func TestMain(m *testing.M) {
	if os.Getenv(upstreamVar) != "" {
		os.Exit(serveUpstream())
	}
	os.Exit(m.Run())
}

// serveUpstream is the upstream process: an MCP server over stdio.
func serveUpstream() int {
	if need := os.Getenv(upstreamNeedsVar); need != "" {
		if _, err := os.Stat(need); err != nil {
			return 3
		}
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "readback", Version: "1"}, nil)
	text := func(s string) *sdk.CallToolResult {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
	}
	s.AddTool(&sdk.Tool{Name: "environ", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return text(strings.Join(os.Environ(), "\n")), nil
		})
	s.AddTool(&sdk.Tool{Name: "args", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			b, _ := json.Marshal(os.Args[1:])
			return text(string(b)), nil
		})
	if err := s.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		return 1
	}
	return 0
}

// letThrough is an API that lets every call through (the policy asks no
// one: no request to claim) and records the tools asked for.
type letThrough struct {
	mu    sync.Mutex
	tools []string
}

func (a *letThrough) Request(_ context.Context, c client.Call) (*client.Request, error) {
	a.mu.Lock()
	a.tools = append(a.tools, c.Tool)
	a.mu.Unlock()
	return &client.Request{Status: client.Approved, Arguments: c.Arguments}, nil
}

func (a *letThrough) asked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.tools)
}

func (a *letThrough) Get(context.Context, string, time.Duration) (*client.Request, error) {
	return nil, context.Canceled
}

func (a *letThrough) Claim(context.Context, string) (*client.Claimed, error) {
	return nil, context.Canceled
}

func (a *letThrough) Result(context.Context, string, string, client.Status, string) (*client.Request, error) {
	return nil, nil
}

// MustGateway starts a gateway over o and connects an MCP client to it;
// changed receives each tools/list_changed the client gets.
func MustGateway(tb testing.TB, o mcp.Options) (g *mcp.Gateway, cs *sdk.ClientSession, changed <-chan struct{}) {
	tb.Helper()
	ctx := context.Background()
	g, err := mcp.New(ctx, o)
	if err != nil {
		tb.Fatalf("mcp.New = %v", err)
	}
	tb.Cleanup(func() { _ = g.Close() })
	ch := make(chan struct{}, 16)
	gs, gc := sdk.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		tb.Fatal(err)
	}
	cs, err = sdk.NewClient(&sdk.Implementation{Name: "agent", Version: "1"}, &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { ch <- struct{}{} },
	}).Connect(ctx, gc, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cs.Close() })
	return g, cs, ch
}

// MustCall calls tool and returns its text and whether it is an error.
func MustCall(tb testing.TB, cs *sdk.ClientSession, tool string) (string, bool) {
	tb.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: map[string]any{}})
	if err != nil {
		tb.Fatalf("CallTool(%s) = %v", tool, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String(), res.IsError
}

// toolNames lists the gateway's tools as its client sees them.
func toolNames(tb testing.TB, cs *sdk.ClientSession) []string {
	tb.Helper()
	var out []string
	for t, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, t.Name)
	}
	return out
}

// TestUpstreamEnvironmentHoldsNoSecret: a stdio upstream reads back its
// environment: PATH and the locale are there, and the upstream's policy
// env, and none of the secrets of the process that started it.
func TestUpstreamEnvironmentHoldsNoSecret(t *testing.T) {
	secrets := []string{"SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN", "REDIS_URL",
		"OPENAI_API_KEY", "COUNTERSIGN_API_KEY", "AWS_SECRET_ACCESS_KEY"}
	for _, k := range secrets {
		t.Setenv(k, "secret-"+k)
	}
	t.Setenv("PATH", "/usr/bin:/bin")
	t.Setenv("LANG", "en_GB.UTF-8")
	t.Setenv("LC_TIME", "de_DE.UTF-8")
	t.Setenv("BASH_FUNC_x%%", "() { echo hi; }")
	_, cs, _ := MustGateway(t, mcp.Options{Prefix: true, API: func(string) mcp.API { return &letThrough{} },
		Upstreams: []mcp.Upstream{{Name: "up", Command: []string{os.Args[0]},
			Env: map[string]string{upstreamVar: "1", "GITHUB_TOKEN": "from-the-policy", "LANG": "C.UTF-8"}}}})
	text, isErr := MustCall(t, cs, "up__environ")
	if isErr {
		t.Fatalf("up__environ = error %q", text)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(text, "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, k := range secrets {
		if v, ok := env[k]; ok {
			t.Errorf("the upstream's environment holds %s=%s", k, v)
		}
	}
	for k, want := range map[string]string{"PATH": "/usr/bin:/bin", "LC_TIME": "de_DE.UTF-8",
		"LANG": "C.UTF-8", "GITHUB_TOKEN": "from-the-policy", upstreamVar: "1"} {
		if got := env[k]; got != want {
			t.Errorf("the upstream's %s = %q, want %q", k, got, want)
		}
	}
	if v, ok := env["BASH_FUNC_x%%"]; ok {
		t.Errorf("the upstream got an exported shell function: %q", v)
	}
}

// TestWrapperCommandRunsInOrder: a wrapper's command line reaches the
// process as written, a program named twice and all.
func TestWrapperCommandRunsInOrder(t *testing.T) {
	args := []string{"tap.mjs", "log", "--", "node", "tap.mjs", "server.js", "/dir"}
	_, cs, _ := MustGateway(t, mcp.Options{Prefix: true, API: func(string) mcp.API { return &letThrough{} },
		Upstreams: []mcp.Upstream{{Name: "up", Command: append([]string{os.Args[0]}, args...),
			Env: map[string]string{upstreamVar: "1"}}}})
	text, isErr := MustCall(t, cs, "up__args")
	var got []string
	if err := json.Unmarshal([]byte(text), &got); isErr || err != nil {
		t.Fatalf("up__args = %q (error %v, %v)", text, isErr, err)
	}
	if !slices.Equal(got, args) {
		t.Errorf("the upstream's arguments = %q, want %q", got, args)
	}
}

// timers is Options.After by hand: each wait asked for is sent on asked,
// with the channel the test fires.
type timers struct{ asked chan timer }

type timer struct {
	d    time.Duration
	fire chan time.Time
}

func (ts timers) after(d time.Duration) (<-chan time.Time, func()) {
	c := make(chan time.Time, 1)
	ts.asked <- timer{d: d, fire: c}
	return c, func() {}
}

// next is the next wait the gateway asks for.
func (ts timers) next(tb testing.TB) timer {
	tb.Helper()
	select {
	case tm := <-ts.asked:
		return tm
	case <-time.After(10 * time.Second):
		tb.Fatal("the gateway asked for no retry")
		return timer{}
	}
}

// TestDeadUpstreamRetried: an upstream that fails to start does not stop
// the gateway: the other upstream serves, the dead one's tools answer
// "unavailable" without asking the API (nothing runs), it is tried again
// with a doubling backoff, and once it starts its tools appear
// (tools/list_changed) and run.
func TestDeadUpstreamRetried(t *testing.T) {
	ready := t.TempDir() + "/ready"
	ts := timers{asked: make(chan timer, 4)}
	api := &letThrough{}
	g, cs, changed := MustGateway(t, mcp.Options{Prefix: true, API: func(string) mcp.API { return api },
		After: ts.after, RetryMin: time.Second, RetryMax: 4 * time.Second,
		Upstreams: []mcp.Upstream{
			{Name: "live", Command: []string{os.Args[0]}, Env: map[string]string{upstreamVar: "1"}},
			{Name: "late", Command: []string{os.Args[0]}, Env: map[string]string{upstreamVar: "1", upstreamNeedsVar: ready}},
		}})
	if down := g.Unavailable(); len(down) != 1 || down["late"] == nil {
		t.Fatalf("Unavailable() = %v, want late", down)
	}
	if got := toolNames(t, cs); !slices.Equal(got, []string{"live__args", "live__environ"}) {
		t.Errorf("tools while late is down = %v", got)
	}
	if _, isErr := MustCall(t, cs, "live__args"); isErr {
		t.Errorf("live__args failed while late is down")
	}
	text, isErr := MustCall(t, cs, "late__environ")
	if !isErr || !strings.Contains(text, "the MCP upstream late is unavailable") {
		t.Errorf("late__environ while down = %q (error %v), want unavailable", text, isErr)
	}
	if asked := api.asked(); !slices.Equal(asked, []string{"live__args"}) {
		t.Errorf("the API was asked for %v, want only live__args", asked)
	}

	// Still down: the wait doubles.
	tm := ts.next(t)
	if tm.d != time.Second {
		t.Errorf("first retry after %s, want 1s", tm.d)
	}
	tm.fire <- time.Now()
	tm = ts.next(t)
	if tm.d != 2*time.Second {
		t.Errorf("second retry after %s, want 2s", tm.d)
	}
	if len(g.Unavailable()) != 1 {
		t.Errorf("Unavailable() = %v after a failed retry", g.Unavailable())
	}

	// It can start now.
	if err := os.WriteFile(ready, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tm.fire <- time.Now()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed after the upstream started")
	}
	if got := toolNames(t, cs); !slices.Equal(got, []string{"late__args", "late__environ", "live__args", "live__environ"}) {
		t.Errorf("tools once late is up = %v", got)
	}
	if down := g.Unavailable(); len(down) != 0 {
		t.Errorf("Unavailable() = %v once late is up", down)
	}
	if text, isErr := MustCall(t, cs, "late__args"); isErr {
		t.Errorf("late__args once up = error %q", text)
	}
}

func (a *letThrough) Self(context.Context) (*client.Key, error) {
	return &client.Key{Name: "any", Tools: []string{"*"}}, nil
}
