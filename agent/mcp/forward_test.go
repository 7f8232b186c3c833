package mcp

import (
	"context"
	"encoding/json"
	"fmt"
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

// routeClient is an MCP client of g that declares sampling: the sampling
// requests and log messages it receives are recorded, and each sampling
// request is answered with its name.
type routeClient struct {
	name string
	cs   *mcp.ClientSession
	mu   sync.Mutex
	asks []string      // the text of each sampling request received
	logs []string      // the data of each log message received
	got  chan struct{} // one per log message
}

func connectRoute(t *testing.T, g *Gateway, name string) *routeClient {
	t.Helper()
	rc := &routeClient{name: name, got: make(chan struct{}, 16)}
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			rc.mu.Lock()
			for _, m := range req.Params.Messages {
				rc.asks = append(rc.asks, m.Content.(*mcp.TextContent).Text)
			}
			rc.mu.Unlock()
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "answer of " + name}}, nil
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			rc.mu.Lock()
			rc.logs = append(rc.logs, fmt.Sprint(req.Params.Data))
			rc.mu.Unlock()
			rc.got <- struct{}{}
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
	if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	rc.cs = cs
	return rc
}

// seen is what rc has received so far: sampling texts and log data.
func (rc *routeClient) seen() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return strings.Join(rc.asks, "|") + " // " + strings.Join(rc.logs, "|")
}

func (rc *routeClient) call(t *testing.T, tool, arg string) string {
	t.Helper()
	res, err := rc.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": arg}})
	if err != nil {
		t.Fatalf("%s: %s = %v", rc.name, tool, err)
	}
	return text(res)
}

// routeUpstream is an upstream whose messages to its client carry a
// client's data: ask samples "summarise: <text>" while its call runs and
// answers with the sample; later answers at once and, when the test sends
// on fire, logs "log: <text>" and then samples "summarise: <text>" (after
// its answer: nothing on the wire ties them to the call), reporting the
// sample's answer (or why it failed) on after; hold runs until release is
// closed.
type routeUpstream struct {
	server          *mcp.Server
	fire            chan struct{}
	after           chan string
	started         chan struct{}
	release         chan struct{}
	releaseOnceDone sync.Once
}

func newRouteUpstream(t *testing.T) *routeUpstream {
	t.Helper()
	u := &routeUpstream{fire: make(chan struct{}), after: make(chan string, 4), started: make(chan struct{}, 4), release: make(chan struct{})}
	u.server = mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
	arg := func(req *mcp.CallToolRequest) string {
		var a struct{ Text string }
		_ = json.Unmarshal(req.Params.Arguments, &a)
		return a.Text
	}
	sample := func(ctx context.Context, ss *mcp.ServerSession, text string) string {
		res, err := ss.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "summarise: " + text}}}})
		if err != nil {
			return "sampling refused: " + err.Error()
		}
		return "sampled: " + res.Content.(*mcp.TextContent).Text
	}
	schema := map[string]any{"type": "object"}
	u.server.AddTool(&mcp.Tool{Name: "ask", InputSchema: schema}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: sample(ctx, req.Session, arg(req))}}}, nil
	})
	u.server.AddTool(&mcp.Tool{Name: "later", InputSchema: schema}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text, ss := arg(req), req.Session
		go func() { // exits once it has reported on after, or when the test ends (release closed)
			select {
			case <-u.fire:
			case <-u.release:
				return
			}
			ctx := context.Background()
			_ = ss.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "log: " + text})
			u.after <- sample(ctx, ss, text)
		}()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "noted"}}}, nil
	})
	u.server.AddTool(&mcp.Tool{Name: "hold", InputSchema: schema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.started <- struct{}{}
		<-u.release
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held"}}}, nil
	})
	t.Cleanup(u.releaseHold)
	return u
}

func (u *routeUpstream) releaseHold() { u.releaseOnceDone.Do(func() { close(u.release) }) }

// later fires one pending later call's messages and returns what its
// sampling request came to.
func (u *routeUpstream) later(t *testing.T) string {
	t.Helper()
	select {
	case u.fire <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no later call waits to fire")
	}
	return await(t, u.after, "the upstream's late sampling request")
}

// await receives from ch, failing t if nothing comes within 10 s (a bound
// for the failure, not a timing).
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing came", what)
	}
	var zero T
	return zero
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

// TestUpstreamMessagesReachOnlyTheirClient: the attack. Client B's
// slow call runs on the upstream; client A's call is answered at once, and
// then the upstream logs A's argument and asks for a sample of it. Each
// client has its own upstream session, so both reach A (the only client
// that can have caused them) and B sees none of A's data; each client's
// in-flight sampling reaches that client.
func TestUpstreamMessagesReachOnlyTheirClient(t *testing.T) {
	ctx := context.Background()
	up := newRouteUpstream(t)
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Server: up.server}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	defer up.releaseHold() // before Close, which waits for the calls
	a, b := connectRoute(t, g, "a"), connectRoute(t, g, "b")

	held := make(chan string, 1)
	go func() { // exits when hold is released
		res, err := b.cs.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
		if err != nil {
			held <- err.Error()
			return
		}
		held <- text(res)
	}()
	await(t, up.started, "b's hold upstream")
	if got := a.call(t, "later", "A-secret"); got != "noted" {
		t.Fatalf("a's later = %q", got)
	}
	if got := up.later(t); got != "sampled: answer of a" {
		t.Errorf("A's late sampling request came to %q, want A's own answer", got)
	}
	await(t, a.got, "A's late log message")
	if got := a.call(t, "ask", "A-inflight"); got != "sampled: answer of a" {
		t.Errorf("a's ask = %q, want a's own sampling answer", got)
	}
	if got := b.call(t, "ask", "B-inflight"); got != "sampled: answer of b" {
		t.Errorf("b's ask while its hold runs = %q, want b's own sampling answer", got)
	}
	up.releaseHold()
	if got := await(t, held, "b's hold answer"); got != "held" {
		t.Errorf("b's hold = %q", got)
	}
	if got, want := a.seen(), "summarise: A-secret|summarise: A-inflight // log: A-secret"; got != want {
		t.Errorf("a received %q, want %q", got, want)
	}
	if got, want := b.seen(), "summarise: B-inflight // "; got != want {
		t.Errorf("b received %q, want %q: nothing of A's", got, want)
	}
}

// TestSharedUpstreamSessionWithholdsMessages: an upstream given as one
// Transport has one session, shared by the gateway's clients, so nothing
// it sends can be tied to one of them: sampling is not declared to it (its
// requests fail) and its log messages reach no client.
func TestSharedUpstreamSessionWithholdsMessages(t *testing.T) {
	ctx := context.Background()
	up := newRouteUpstream(t)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.server.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	defer up.releaseHold() // before Close, which waits for the calls
	a, b := connectRoute(t, g, "a"), connectRoute(t, g, "b")
	if got := a.call(t, "ask", "A-inflight"); !strings.HasPrefix(got, "sampling refused") {
		t.Errorf("a's ask on a shared upstream session = %q, want the sampling refused", got)
	}
	if got := a.call(t, "later", "A-secret"); got != "noted" {
		t.Fatalf("a's later = %q", got)
	}
	if got := up.later(t); !strings.HasPrefix(got, "sampling refused") {
		t.Errorf("A's late sampling request on a shared session came to %q, want refused", got)
	}
	// The log came before the sampling request on the one upstream session;
	// a ping after it is answered after the gateway handled it.
	if err := a.cs.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*routeClient{a, b} {
		if got := c.seen(); got != " // " {
			t.Errorf("%s received %q on a shared upstream session, want nothing", c.name, got)
		}
	}
}

// TestOneClientOwnsTheSharedSessions: over stdio (OneClient) the gateway's
// sessions with its upstreams are its one client's: an upstream's
// sampling, in flight or after the answer, and its log messages reach it;
// a second client session is refused.
func TestOneClientOwnsTheSharedSessions(t *testing.T) {
	ctx := context.Background()
	up := newRouteUpstream(t)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.server.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Transport: ct}}, OneClient: true, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	defer up.releaseHold()
	a := connectRoute(t, g, "a")
	if got := a.call(t, "ask", "A-inflight"); got != "sampled: answer of a" {
		t.Errorf("a's ask = %q, want a's own sampling answer", got)
	}
	if got := a.call(t, "later", "A-secret"); got != "noted" {
		t.Fatalf("a's later = %q", got)
	}
	if got := up.later(t); got != "sampled: answer of a" {
		t.Errorf("the late sampling request came to %q, want the one client's answer", got)
	}
	await(t, a.got, "A's late log message")
	if got, want := a.seen(), "summarise: A-inflight|summarise: A-secret // log: A-secret"; got != want {
		t.Errorf("a received %q, want %q", got, want)
	}

	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		t.Fatal(err)
	}
	_, err = mcp.NewClient(&mcp.Implementation{Name: "second", Version: "1"}, nil).Connect(ctx, gc, nil)
	if err == nil || !strings.Contains(err.Error(), "serves one MCP client") {
		t.Errorf("a second client's connect = %v, want it refused", err)
	}
}

// TestResourceUpdatesReachOnlyTheirSubscriber: two clients subscribe to
// the same uri, each through its own upstream session; an update the
// upstream sends on A's session only reaches A, although go-sdk would send
// it to every session subscribed to the uri.
func TestResourceUpdatesReachOnlyTheirSubscriber(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
	})
	for _, uri := range []string{"test://shared", "test://b-only"} {
		up.AddResource(&mcp.Resource{URI: uri, Name: uri[len("test://"):]}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: "x"}}}, nil
		})
	}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Server: up}}, API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	updates := map[string]chan string{}
	sessions := map[string]*mcp.ServerSession{}
	clients := map[string]*mcp.ClientSession{}
	for _, name := range []string{"a", "b"} {
		ch := make(chan string, 8)
		updates[name] = ch
		gs, gc := mcp.NewInMemoryTransports()
		ss, err := g.Server().Connect(ctx, gs, nil)
		if err != nil {
			t.Fatal(err)
		}
		sessions[name] = ss
		cs, err := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) { ch <- req.Params.URI },
		}).Connect(ctx, gc, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		clients[name] = cs
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://shared"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := clients["b"].Subscribe(ctx, &mcp.SubscribeParams{URI: "test://b-only"}); err != nil {
		t.Fatal(err)
	}
	// B's upstream session stops watching test://shared (B stays
	// subscribed at the gateway): an update of it now comes on A's
	// upstream session alone.
	g.fwd.mu.Lock()
	bLink := g.fwd.links[linkKey{g.upstreams[0], sessions["b"]}]
	g.fwd.mu.Unlock()
	if err := bLink.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://shared"}); err != nil {
		t.Fatal(err)
	}
	if err := up.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://shared"}); err != nil {
		t.Fatal(err)
	}
	if got := await(t, updates["a"], "a's update"); got != "test://shared" {
		t.Errorf("a got an update of %q", got)
	}
	// Updates are relayed one at a time and each client's in order, so
	// once B has the next one any update of test://shared sent to B would
	// have come first.
	if err := up.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: "test://b-only"}); err != nil {
		t.Fatal(err)
	}
	if got := await(t, updates["b"], "b's update"); got != "test://b-only" {
		t.Errorf("b got an update of %q, want only test://b-only (test://shared came on A's upstream session)", got)
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

// TestClientLinksBounded: each client's own upstream session ends with
// the client's session; at most MaxClientLinks are open per upstream, the
// least recently used idle one closed to make room, and a client that
// needs one more while all are busy is refused (nothing runs).
func TestClientLinksBounded(t *testing.T) {
	ctx := context.Background()
	up := newRouteUpstream(t)
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "up", Server: up.server}}, MaxClientLinks: 2,
		API: func(string) API { return passAPI{&fakeAPI{}} }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	defer up.releaseHold()
	// upstreamSessions are the upstream's sessions other than the
	// gateway's shared one.
	shared := slices.Collect(up.server.Sessions())
	upstreamSessions := func() []*mcp.ServerSession {
		return slices.DeleteFunc(slices.Collect(up.server.Sessions()), func(s *mcp.ServerSession) bool { return slices.Contains(shared, s) })
	}
	ended := func(s *mcp.ServerSession, what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- s.Wait() }() // exits when s ends
		await(t, done, what)
	}

	a, b := connectRoute(t, g, "a"), connectRoute(t, g, "b")
	a.call(t, "later", "a")
	first := upstreamSessions()
	b.call(t, "later", "b")
	if n := len(upstreamSessions()); n != 2 {
		t.Fatalf("after calls of two clients the upstream has %d sessions of theirs, want 2", n)
	}
	c := connectRoute(t, g, "c")
	c.call(t, "later", "c") // a's session is the least recently used: closed for c's
	ended(first[0], "a's upstream session, closed to make room")
	if got := a.call(t, "later", "a again"); got != "noted" { // b's closes for a's new one
		t.Errorf("a's call after its upstream session closed = %q", got)
	}

	held := make(chan string, 2)
	for _, rc := range []*routeClient{a, c} {
		go func() { // exits when hold is released
			res, err := rc.cs.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
			if err != nil {
				held <- err.Error()
				return
			}
			held <- text(res)
		}()
		await(t, up.started, rc.name+"'s hold upstream")
	}
	if got := b.call(t, "later", "b again"); !strings.Contains(got, "too many MCP client sessions use this upstream") {
		t.Errorf("b's call while both upstream sessions run calls = %q, want it refused", got)
	}
	up.releaseHold()
	for range 2 {
		if got := await(t, held, "a hold's answer"); got != "held" {
			t.Errorf("hold = %q", got)
		}
	}

	open := upstreamSessions()
	if err := a.cs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.cs.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range open {
		ended(s, "an ended client's upstream session")
	}
	g.fwd.mu.Lock()
	left := len(g.fwd.links)
	g.fwd.mu.Unlock()
	if left != 0 {
		t.Errorf("%d client links left after their sessions ended, want 0", left)
	}
}
