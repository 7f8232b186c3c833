package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
)

// fakeAPI answers every request rejected at once and records call ids.
type fakeAPI struct {
	mu      sync.Mutex
	callIDs []string
}

func (f *fakeAPI) Request(_ context.Context, c client.Call) (*client.Request, error) {
	f.mu.Lock()
	f.callIDs = append(f.callIDs, c.CallID)
	f.mu.Unlock()
	return &client.Request{ID: "req_1", Status: client.Rejected, Approver: "U0BOB0001", Reason: "not today"}, nil
}

func (f *fakeAPI) Get(context.Context, string, time.Duration) (*client.Request, error) {
	return nil, context.Canceled
}

func (f *fakeAPI) Claim(context.Context, string) (*client.Claimed, error) {
	return nil, context.Canceled
}

func (f *fakeAPI) Result(context.Context, string, string, client.Status, string) (*client.Request, error) {
	return nil, nil
}

// TestAnsweredCallGetsANewCallID: an identical call after an answer is a
// new request (a new call id), never the old decision; a call that was
// not answered keeps its id, so its retry finds the same request.
func TestAnsweredCallGetsANewCallID(t *testing.T) {
	ctx := context.Background()
	up := mcp.NewServer(&mcp.Implementation{Name: "up", Version: "1"}, nil)
	ran := 0
	up.AddTool(&mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			ran++
			return &mcp.CallToolResult{}, nil
		})
	st, ct := mcp.NewInMemoryTransports()
	if _, err := up.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	api := &fakeAPI{}
	g, err := New(ctx, Options{Upstreams: []Upstream{{Name: "orders", Transport: ct}}, Prefix: true,
		API: func(string) API { return api }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gs, gc := mcp.NewInMemoryTransports()
	if _, err := g.Server().Connect(ctx, gs, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, gc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "orders__refund", Arguments: json.RawMessage(`{"amount":5}`)})
		if err != nil || !res.IsError {
			t.Fatalf("CallTool = %+v, %v; want an error result", res, err)
		}
		if txt := res.Content[0].(*mcp.TextContent).Text; txt != "The call to orders__refund was rejected by U0BOB0001: not today (request req_1). It did not run." {
			t.Errorf("rejection text = %q", txt)
		}
	}
	if len(api.callIDs) != 2 || api.callIDs[0] == api.callIDs[1] {
		t.Errorf("call ids = %v, want two different ones", api.callIDs)
	}
	// A call that is never answered keeps its id for its retry.
	key, id := g.callID("run", "orders__refund", json.RawMessage(`{}`))
	if _, again := g.callID("run", "orders__refund", json.RawMessage(`{}`)); again != id {
		t.Errorf("unanswered retry id = %s, want %s", again, id)
	}
	g.done(key)
	if _, next := g.callID("run", "orders__refund", json.RawMessage(`{}`)); next == id {
		t.Errorf("id after an answer = %s, want a new one", next)
	}
	if ran != 0 {
		t.Errorf("a rejected call ran %d times", ran)
	}
}

// TestCheckStdio: each missing or wrong setting of `countersign mcp` is
// one error naming its variable and flag.
func TestCheckStdio(t *testing.T) {
	if errs := CheckStdio("https://countersign.example", "k", "policy.yaml"); len(errs) != 0 {
		t.Errorf("CheckStdio(good settings) = %v", errs)
	}
	errs := CheckStdio("countersign:8080", "", "")
	want := []string{`COUNTERSIGN_URL (--url): must be the server's http(s) URL, got "countersign:8080"`,
		"COUNTERSIGN_API_KEY: required", "COUNTERSIGN_CONFIG (--config): required"}
	if len(errs) != len(want) {
		t.Fatalf("CheckStdio = %v, want %d errors", errs, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(errs[i].Error(), w) {
			t.Errorf("error %d = %q, want it to start with %q", i, errs[i], w)
		}
	}
}

func (f *fakeAPI) Self(context.Context) (*client.Key, error) {
	return &client.Key{Name: "any", Tools: []string{"*"}}, nil
}
