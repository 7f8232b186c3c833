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

// fakeAPI answers Request pending and Wait approved; Claim is the test's.
type fakeAPI struct {
	claim func() (*client.Claimed, error)
}

func (fakeAPI) Request(context.Context, client.Call) (*client.Request, error) {
	return &client.Request{ID: "req_1", Status: client.Pending}, nil
}

func (fakeAPI) Wait(context.Context, string) (*client.Request, error) {
	return &client.Request{ID: "req_1", Status: client.Approved, ApproverName: "Bob Baker"}, nil
}

func (f fakeAPI) Claim(context.Context, string) (*client.Claimed, error) { return f.claim() }

func (fakeAPI) Result(context.Context, string, string, client.Status, string) (*client.Request, error) {
	return nil, nil
}

func (fakeAPI) GiveUp(context.Context, string) (*client.Request, error) {
	return nil, errors.New("not given up in this test")
}

// TestHookDecideAllowsOnlyTheClaimWinner: two hook runs that both saw the
// approval race to claim it; the one that lost (409 already_claimed, or
// abandoned) denies, so Claude Code runs the call once.
func TestHookDecideAllowsOnlyTheClaimWinner(t *testing.T) {
	in := hook.Input{HookEventName: "PreToolUse", ToolName: "Bash", ToolUseID: "toolu_1", ToolInput: json.RawMessage(`{"command":"make deploy"}`)}
	for _, tc := range []struct {
		name   string
		claim  func() (*client.Claimed, error)
		want   string
		reason string
	}{
		{"won", func() (*client.Claimed, error) {
			return &client.Claimed{Token: "cst_1", Request: client.Request{ID: "req_1", Status: client.Executing, ApproverName: "Bob Baker"}}, nil
		}, hook.Allow, "Approved by Bob Baker"},
		{"lost", func() (*client.Claimed, error) {
			return nil, &client.Error{HTTPStatus: 409, Code: "already_claimed", Request: &client.Request{ID: "req_1", Status: client.Executing}}
		}, hook.Deny, "already claimed"},
		{"abandoned", func() (*client.Claimed, error) {
			return nil, &client.Error{HTTPStatus: 409, Code: "abandoned"}
		}, hook.Deny, "abandoned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := hook.Decide(context.Background(), in, hook.Options{API: fakeAPI{claim: tc.claim}, Timeout: time.Minute})
			if a.PermissionDecision != tc.want || !strings.Contains(a.PermissionDecisionReason, tc.reason) {
				t.Errorf("Decide = %+v, want %s saying %q", a, tc.want, tc.reason)
			}
		})
	}
}
