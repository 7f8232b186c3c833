package hook_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/hook"
)

// waitingAPI answers Request pending; its Wait is the test's; GiveUp
// records how it was called and answers the test's.
type waitingAPI struct {
	wait    func(ctx context.Context) (*client.Request, error)
	giveUp  func() (*client.Request, error)
	waiting chan struct{} // closed when Wait is called
	gaveUp  chan giveUpCall
}

type giveUpCall struct {
	id       string
	ctxErr   error
	deadline time.Duration // how long GiveUp's ctx had left
}

func newWaitingAPI(wait func(context.Context) (*client.Request, error), giveUp func() (*client.Request, error)) *waitingAPI {
	return &waitingAPI{wait: wait, giveUp: giveUp, waiting: make(chan struct{}), gaveUp: make(chan giveUpCall, 1)}
}

func (f *waitingAPI) Request(context.Context, client.Call) (*client.Request, error) {
	return &client.Request{ID: "req_1", Status: client.Pending}, nil
}

func (f *waitingAPI) Wait(ctx context.Context, _ string) (*client.Request, error) {
	close(f.waiting)
	return f.wait(ctx)
}

func (f *waitingAPI) Claim(context.Context, string) (*client.Claimed, error) {
	return &client.Claimed{Token: "cst_1", Request: client.Request{ID: "req_1", Status: client.Executing, ApproverName: "Bob Baker"}}, nil
}

func (f *waitingAPI) Result(context.Context, string, string, client.Status, string) (*client.Request, error) {
	return nil, errors.New("not reported in this test")
}

func (f *waitingAPI) GiveUp(ctx context.Context, id string) (*client.Request, error) {
	dl, _ := ctx.Deadline()
	f.gaveUp <- giveUpCall{id: id, ctxErr: ctx.Err(), deadline: time.Until(dl)}
	return f.giveUp()
}

// untilDone waits for ctx to end, as a long poll does when no decision
// comes.
func untilDone(ctx context.Context) (*client.Request, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

var bashInput = hook.Input{HookEventName: "PreToolUse", ToolName: "Bash", ToolUseID: "toolu_1", SessionID: "sess-1",
	ToolInput: json.RawMessage(`{"command":"make deploy"}`)}

// TestHookGivesUp: a hook that stops waiting — its own --timeout ran out,
// or it was stopped (Claude Code's SIGTERM cancels its context) — denies
// and withdraws its request through the API (GiveUp, on a context of its
// own that the stop did not cancel, bounded to about a second), saying
// what became of it. A wait the API refused withdraws nothing.
func TestHookGivesUp(t *testing.T) {
	withdrawn := func() (*client.Request, error) { return &client.Request{ID: "req_1", Status: client.Cancelled}, nil }
	for _, tt := range []struct {
		name    string
		timeout time.Duration
		stop    bool // cancel the hook's context once it waits
		wait    func(context.Context) (*client.Request, error)
		giveUp  func() (*client.Request, error)
		gives   bool
		want    []string
	}{
		{name: "its --timeout ran out", timeout: time.Millisecond, wait: untilDone, giveUp: withdrawn, gives: true,
			want: []string{"no decision within the hook's --timeout (1ms)", "The call was not run", "The request was withdrawn (request req_1): its card says the caller gave up."}},
		{name: "stopped by Claude Code", timeout: time.Hour, stop: true, wait: untilDone, giveUp: withdrawn, gives: true,
			want: []string{"the hook was stopped before a decision came", "settings.json", "The request was withdrawn (request req_1)"}},
		{name: "approved as it gave up", timeout: time.Millisecond, wait: untilDone, gives: true,
			giveUp: func() (*client.Request, error) {
				return nil, &client.Error{HTTPStatus: 409, Code: "not_pending", Request: &client.Request{ID: "req_1", Status: client.Approved}}
			},
			want: []string{"The request was approved meanwhile (request req_1); this run had stopped waiting, so it does not run it."}},
		{name: "the withdrawal failed", timeout: time.Millisecond, wait: untilDone, gives: true,
			giveUp: func() (*client.Request, error) { return nil, errors.New("connection refused") },
			want:   []string{"Withdrawing the request failed (connection refused): its card stays open until its deadline (request req_1)."}},
		{name: "the API refused the wait", timeout: time.Hour,
			wait: func(context.Context) (*client.Request, error) {
				return nil, &client.Error{HTTPStatus: 404, Code: "not_found", Message: "no request"}
			},
			want: []string{"Countersign answered 404 not_found"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newWaitingAPI(tt.wait, tt.giveUp)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.stop {
				go func() { <-f.waiting; cancel() }() // ends once the hook waits
			}
			a := hook.Decide(ctx, bashInput, hook.Options{API: f, Timeout: tt.timeout})
			if a.PermissionDecision != hook.Deny {
				t.Fatalf("Decide = %+v, want deny", a)
			}
			for _, w := range tt.want {
				if !strings.Contains(a.PermissionDecisionReason, w) {
					t.Errorf("reason %q does not say %q", a.PermissionDecisionReason, w)
				}
			}
			select {
			case g := <-f.gaveUp:
				if !tt.gives {
					t.Errorf("GiveUp(%s) called; want no withdrawal", g.id)
				}
				if g.id != "req_1" || g.ctxErr != nil || g.deadline <= 0 || g.deadline > time.Second {
					t.Errorf("GiveUp(%s) with ctx err %v, %v left; want req_1 on a live context of at most a second", g.id, g.ctxErr, g.deadline)
				}
			default:
				if tt.gives {
					t.Error("GiveUp not called; want the request withdrawn")
				}
			}
		})
	}
}

// TestHookDefers: with Defer the hook answers "defer" while no one has
// decided (at once, or after DeferAfter), naming the request and how to
// resume; it withdraws nothing (the request waits for the resumed
// session). A decision within DeferAfter is answered as usual.
func TestHookDefers(t *testing.T) {
	approved := func(context.Context) (*client.Request, error) {
		return &client.Request{ID: "req_1", Status: client.Approved, ApproverName: "Bob Baker"}, nil
	}
	for _, tt := range []struct {
		name       string
		deferAfter time.Duration
		wait       func(context.Context) (*client.Request, error)
		waits      bool
		want       string
		reason     string
	}{
		{"at once", 0, approved, false, hook.Defer, "Waiting for a person in Countersign (request req_1): Bash was not run. Resume the session (claude -p --resume sess-1)"},
		{"after a wait without a decision", time.Millisecond, untilDone, true, hook.Defer, "claude -p --resume sess-1"},
		{"decided within the wait", time.Hour, approved, true, hook.Allow, "Approved by Bob Baker"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newWaitingAPI(tt.wait, nil)
			a := hook.Decide(context.Background(), bashInput, hook.Options{API: f, Timeout: time.Hour, Defer: true, DeferAfter: tt.deferAfter})
			if a.PermissionDecision != tt.want || !strings.Contains(a.PermissionDecisionReason, tt.reason) {
				t.Errorf("Decide = %+v, want %s saying %q", a, tt.want, tt.reason)
			}
			select {
			case <-f.waiting:
				if !tt.waits {
					t.Error("Wait called; want a defer at once")
				}
			default:
				if tt.waits {
					t.Error("Wait not called")
				}
			}
			select {
			case g := <-f.gaveUp:
				t.Errorf("GiveUp(%s) called; a deferred request waits for the resumed session", g.id)
			default:
			}
		})
	}
}

// TestHookMemClaims: the http hook's claims are taken once, forgotten
// after their time, and the oldest makes room when full.
func TestHookMemClaims(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	c := hook.NewMemClaims(2, time.Hour, func() time.Time { return now })
	for _, id := range []string{"a", "b"} {
		if err := c.Put(id, "req_"+id, "cst_"+id); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	if _, tok, ok, _ := c.Take("a"); !ok || tok != "cst_a" {
		t.Errorf("Take(a) = %q, %v; want cst_a", tok, ok)
	}
	if _, _, ok, _ := c.Take("a"); ok {
		t.Error("Take(a) twice found it again")
	}
	_ = c.Put("c", "req_c", "cst_c")
	_ = c.Put("d", "req_d", "cst_d") // full (b, c): b, the oldest, makes room
	if _, _, ok, _ := c.Take("b"); ok {
		t.Error("b kept past the limit; want the oldest dropped")
	}
	now = now.Add(2 * time.Hour)
	if _, _, ok, _ := c.Take("c"); ok {
		t.Error("c taken after its time")
	}
}
