package mcp

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
)

// passAPI lets every call through (no request: the policy let it pass).
type passAPI struct{ *fakeAPI }

func (passAPI) Request(_ context.Context, c client.Call) (*client.Request, error) {
	return &client.Request{Status: client.Approved, Arguments: c.Arguments}, nil
}

// samplingClient is an MCP client of g whose sampling requests are
// counted and answered with its name.
type samplingClient struct {
	cs *mcp.ClientSession
	mu sync.Mutex
	n  int // sampling requests received
}

func connectSampling(t *testing.T, g *Gateway, name string) *samplingClient {
	t.Helper()
	sc := &samplingClient{}
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			sc.mu.Lock()
			sc.n++
			sc.mu.Unlock()
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "answer of " + name}}, nil
		},
	})
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(context.Background(), gs, nil); err != nil {
		t.Fatal(err)
	}
	// 2025-11-25: on 2026-07-28 a server sends no sampling request while
	// serving a call (it returns input requests instead).
	cs, err := c.Connect(context.Background(), gc, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	sc.cs = cs
	return sc
}

func (sc *samplingClient) requests() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.n
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestSamplingGoesOnlyToItsCaller: an upstream's sampling request made
// while one client's call runs reaches that client and its answer comes
// back; made while calls of two clients run on the upstream, it is refused
// (the upstream gets an error) and reaches neither client.
func TestSamplingGoesOnlyToItsCaller(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
	started, release := make(chan struct{}), make(chan struct{})
	up.AddTool(&mcp.Tool{Name: "ask", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}})
			if err != nil {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampling refused: " + err.Error()}}}, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled: " + res.Content.(*mcp.TextContent).Text}}}, nil
		})
	up.AddTool(&mcp.Tool{Name: "hold", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			close(started)
			<-release
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held"}}}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, b := connectSampling(t, g, "a"), connectSampling(t, g, "b")

	res, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: json.RawMessage(`{}`)})
	if err != nil || text(res) != "sampled: answer of a" {
		t.Fatalf("a's ask = %q, %v; want a's own sampling answer", text(res), err)
	}
	if a.requests() != 1 || b.requests() != 0 {
		t.Fatalf("sampling requests: a %d, b %d; want 1, 0", a.requests(), b.requests())
	}

	held := make(chan error, 1)
	go func() { // exits when hold is released
		_, err := b.cs.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: json.RawMessage(`{}`)})
		held <- err
	}()
	<-started // b's call runs upstream
	res, err = a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: json.RawMessage(`{}`)})
	close(release)
	if err != nil || !strings.Contains(text(res), "sampling refused") || !strings.Contains(text(res), "cannot tell which MCP client") {
		t.Errorf("a's ask while b's call runs = %q, %v; want the upstream's sampling refused", text(res), err)
	}
	if a.requests() != 1 || b.requests() != 0 {
		t.Errorf("sampling requests: a %d, b %d; want 1, 0 (none relayed while two clients run calls)", a.requests(), b.requests())
	}
	if err := <-held; err != nil {
		t.Errorf("b's hold: %v", err)
	}
}

// TestUpstreamProgressKeepsEachClientsToken: two clients call with the
// same progress token; the upstream sees a token of the gateway's own,
// different for each call, and each client gets the upstream's progress
// under its own token.
func TestUpstreamProgressKeepsEachClientsToken(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	var mu sync.Mutex
	var seen []any // the tokens the upstream got
	up.AddTool(&mcp.Tool{Name: "work", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			tok := req.Params.GetProgressToken()
			mu.Lock()
			seen = append(seen, tok)
			mu.Unlock()
			for _, p := range []float64{0, 50, 100} {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: p, Total: 100}); err != nil {
					return nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, name := range []string{"a", "b"} {
		progress := make(chan *mcp.ProgressNotificationParams, 8)
		c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { progress <- req.Params },
		})
		gs, gc := mcp.NewInMemoryTransports()
		if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
			t.Fatal(err)
		}
		cs, err := c.Connect(ctx, gc, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		p := &mcp.CallToolParams{Name: "work", Arguments: json.RawMessage(`{}`)}
		p.SetProgressToken("tok")
		if res, err := cs.CallTool(ctx, p); err != nil || text(res) != "done" {
			t.Fatalf("%s: work = %q, %v", name, text(res), err)
		}
		for _, want := range []float64{0, 50, 100} {
			got := <-progress
			if got.ProgressToken != "tok" || got.Progress != want || got.Total != 100 {
				t.Errorf("%s: progress = %+v, want token tok, %v/100", name, got, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] == "tok" || seen[0] == nil || seen[0] == seen[1] {
		t.Errorf("upstream tokens = %v, want two different tokens of the gateway's", seen)
	}
}

// scopedAPI lets every call through for a key allowed only tools.
type scopedAPI struct {
	passAPI
	tools []string
}

func (s scopedAPI) Self(context.Context) (*client.Key, error) {
	return &client.Key{Name: "scoped", Tools: s.tools}, nil
}

// TestSubscriptionsForwarded: resources/subscribe reaches the resource's
// upstream only for a key allowed its resources_read, the upstream's
// update reaches the subscribed client, and unsubscribe is passed on;
// completion of a resource template is refused to the same key.
func TestSubscriptionsForwarded(t *testing.T) {
	ctx := context.Background()
	subs := make(chan string, 4)
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		// Every revision, 2026-07-28 included, as a go-sdk v1.8.0 server
		// offers by default: the gateway asks for UpstreamRevision, where
		// resource updates are notifications it relays.
		SubscribeHandler: func(_ context.Context, req *mcp.SubscribeRequest) error { subs <- "sub " + req.Params.URI; return nil },
		UnsubscribeHandler: func(_ context.Context, req *mcp.UnsubscribeRequest) error {
			subs <- "unsub " + req.Params.URI
			return nil
		},
		CompletionHandler: func(context.Context, *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{"42"}}}, nil
		},
	})
	up.AddResource(&mcp.Resource{URI: "test://watched", Name: "watched"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: "test://watched", Text: "x"}}}, nil
	})
	up.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://t/{id}", Name: "t"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return nil, nil
	})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{"reader": {"up__resources_read"}, "other": {"up__prompts_get"}}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, Key: "reader",
		API: func(key string) API { return scopedAPI{passAPI{&fakeAPI{}}, keys[key]} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for ss := range up.Sessions() {
		if p := ss.InitializeParams(); p == nil || p.ProtocolVersion != UpstreamRevision {
			t.Fatalf("the gateway's upstream session: initialize %+v, want revision %s", p, UpstreamRevision)
		}
	}
	updated := make(chan string, 4)
	c := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { updated <- req.Params.URI },
	})
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := c.Connect(ctx, gc, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	caps := cs.InitializeResult().Capabilities
	if caps.Resources == nil || !caps.Resources.Subscribe || caps.Completions == nil {
		t.Errorf("capabilities = %+v; want subscribe and completions (the upstream's)", caps)
	}
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if got := <-subs; got != "sub test://watched" {
		t.Errorf("upstream got %q, want the subscription", got)
	}
	if err := up.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://watched"}); err != nil {
		t.Fatal(err)
	}
	if got := <-updated; got != "test://watched" {
		t.Errorf("client got update of %q", got)
	}
	res, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "test://t/{id}"},
		Argument: mcp.CompleteParamsArgument{Name: "id", Value: "4"}})
	if err != nil || len(res.Completion.Values) != 1 || res.Completion.Values[0] != "42" {
		t.Errorf("Complete = %+v, %v; want the upstream's 42", res, err)
	}
	if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	if got := <-subs; got != "unsub test://watched" {
		t.Errorf("upstream got %q, want the unsubscription", got)
	}

	g.opts.Key = "other" // stdio's key: now one not allowed up__resources_read
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched"}); err == nil || !strings.Contains(err.Error(), "may not use up__resources_read") {
		t.Errorf("Subscribe with a key not allowed the read = %v, want refused", err)
	}
	if _, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "test://t/{id}"},
		Argument: mcp.CompleteParamsArgument{Name: "id", Value: "4"}}); err == nil {
		t.Error("Complete with a key not allowed the read succeeded, want refused")
	}
	select {
	case got := <-subs:
		t.Errorf("upstream got %q from a key not allowed the read", got)
	default:
	}
}

// TestEndedSessionsSubscriptionsEnd: a client whose session ends without
// unsubscribing leaves nothing behind: the next subscription change of
// any client forgets it and ends the upstream's subscription that no
// live client holds any more.
func TestEndedSessionsSubscriptionsEnd(t *testing.T) {
	ctx := context.Background()
	subs := make(chan string, 8)
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler: func(_ context.Context, req *mcp.SubscribeRequest) error { subs <- "sub " + req.Params.URI; return nil },
		UnsubscribeHandler: func(_ context.Context, req *mcp.UnsubscribeRequest) error {
			subs <- "unsub " + req.Params.URI
			return nil
		},
	})
	for _, uri := range []string{"test://a", "test://b"} {
		up.AddResource(&mcp.Resource{URI: uri, Name: uri[len("test://"):]}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: "x"}}}, nil
		})
	}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, Key: "reader",
		API: func(string) API { return scopedAPI{passAPI{&fakeAPI{}}, []string{"up__resources_read"}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	connect := func(name string) (*mcp.ClientSession, *mcp.ServerSession) {
		gs, gc := mcp.NewInMemoryTransports()
		ss, err := g.Server().Connect(ctx, gs, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, nil).Connect(ctx, gc, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		return cs, ss
	}
	gone, goneServer := connect("gone")
	stays, _ := connect("stays")
	defer stays.Close()
	if err := gone.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://a"}); err != nil {
		t.Fatal(err)
	}
	if got := <-subs; got != "sub test://a" {
		t.Fatalf("upstream got %q", got)
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	_ = goneServer.Wait() // the gateway's side of the session has ended
	if err := stays.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://b"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	deadline := time.After(10 * time.Second) // a bound for the failure, not a timing
	for len(got) < 2 {
		select {
		case m := <-subs:
			got = append(got, m)
		case <-deadline:
			t.Fatalf("upstream got only %q, want the subscription and the ended session's unsubscription", got)
		}
	}
	slices.Sort(got)
	if want := []string{"sub test://b", "unsub test://a"}; !slices.Equal(got, want) {
		t.Errorf("upstream got %q, want %q: the ended session's subscription ended", got, want)
	}
	g.fwd.mu.Lock()
	left := len(g.fwd.subs)
	g.fwd.mu.Unlock()
	if left != 1 {
		t.Errorf("subscriptions kept for %d uris, want 1 (test://b)", left)
	}
}
