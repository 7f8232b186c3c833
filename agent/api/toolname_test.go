package api_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// lookalikePolicy is the demo's shape: issue_refund is declared (refused
// above $2,000) and every other tool falls under a loose external rule.
func lookalikePolicy() *approval.Policy {
	pol := testPolicy()
	pol.Tools["issue_refund"] = approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewAlways, Quorum: 1,
		Deny: []approval.DenyRule{{When: "double(args.amount) > 2000.0", Reason: "refunds above $2,000 go through finance"}}}
	pol.External = &approval.ToolPolicy{Risk: approval.RiskMedium, Review: approval.ReviewAlways, Quorum: 1}
	return &pol
}

// lookalikes are tool names that pass, to a reader, for issue_refund.
var lookalikes = []string{
	"іssue_refund", // Cyrillic і
	"issue-refund",
	"Issue_Refund",
	"issue_refund✅ PRE-APPROVED by finance",
	"is5ue_refund",
}

// TestLookalikeToolNamesRefused: with a key allowed every tool and an
// external rule, a name that reads like a declared tool's (or carries
// free text) is refused with 400 invalid_field on the tool's field, on
// /v1 and on the HumanLayer endpoints, and nothing is created or shown:
// no request, no card. The real tool still gets its own rule.
func TestLookalikeToolNamesRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{policy: lookalikePolicy()})
	for i, name := range lookalikes {
		tool, _ := json.Marshal(name)
		body := fmt.Sprintf(`{"tool":%s,"call_id":"look-%d","arguments":{"order_id":"1234","amount":9000}}`, tool, i)
		status, e := post(t, h, fullKey, "/v1/requests", body)
		if status != 400 || e["code"] != "invalid_field" || e["field"] != "tool" {
			t.Errorf("/v1 tool %q: %d %v, want 400 invalid_field on tool", name, status, e)
		}
		body = fmt.Sprintf(`{"run_id":"r1","call_id":"hl-look-%d","spec":{"fn":%s,"kwargs":{"order_id":"1234","amount":9000}}}`, i, tool)
		status, e = post(t, h, fullKey, "/humanlayer/v1/function_calls", body)
		if status != 400 || e["code"] != "invalid_field" || e["field"] != "spec.fn" {
			t.Errorf("/humanlayer/v1 fn %q: %d %v, want 400 invalid_field on spec.fn", name, status, e)
		}
	}
	if n := len(h.events(approval.EventRequested)); n != 0 {
		t.Errorf("%d requests created for look-alike names, want none", n)
	}
	h.cards.mu.Lock()
	posted := len(h.cards.posts)
	h.cards.mu.Unlock()
	if posted != 0 {
		t.Errorf("%d cards posted for look-alike names, want none", posted)
	}

	// The real tool: refused by its deny rule above $2,000, asked below.
	status, e := post(t, h, fullKey, "/v1/requests", `{"tool":"issue_refund","call_id":"real-1","arguments":{"order_id":"1234","amount":9000}}`)
	if status != 200 || e != nil {
		t.Errorf("issue_refund $9,000: %d %v, want 200 (refused by policy)", status, e)
	}
	if n := len(h.events(approval.EventCallRefused)); n != 1 {
		t.Errorf("call_refused entries = %d, want 1 (the real tool's deny rule)", n)
	}
	status, e = post(t, h, fullKey, "/v1/requests", `{"tool":"issue_refund","call_id":"real-2","arguments":{"order_id":"1234","amount":60}}`)
	if status != 201 || e != nil {
		t.Errorf("issue_refund $60: %d %v, want 201", status, e)
	}
}

// TestInputSchemaChecked: an undeclared tool's input_schema is used: bad
// arguments are refused on arguments, an unusable schema on input_schema.
func TestInputSchemaChecked(t *testing.T) {
	h := newHarness(t, harnessOptions{policy: lookalikePolicy()})
	schema := `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`
	cases := []struct {
		name, body, field string
		status            int
	}{
		{"valid", `{"tool":"write_file","call_id":"s1","arguments":{"path":"/tmp/x"},"input_schema":` + schema + `}`, "", 201},
		{"bad arguments", `{"tool":"write_file","call_id":"s2","arguments":{"path":7},"input_schema":` + schema + `}`, "arguments", 400},
		{"bad schema", `{"tool":"write_file","call_id":"s3","arguments":{},"input_schema":{"type":"no-such-type"}}`, "input_schema", 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, e := post(t, h, fullKey, "/v1/requests", tc.body)
			if status != tc.status || e["field"] != tc.field {
				t.Errorf("POST: %d %v, want %d on %q", status, e, tc.status, tc.field)
			}
		})
	}
}

// TestUndeclaredToolSource: a call of an undeclared tool through the MCP
// gateway's client carries its upstream to the request, marked
// undeclared, so its card can say so; a declared tool's is not marked.
func TestUndeclaredToolSource(t *testing.T) {
	h := newHarness(t, harnessOptions{policy: lookalikePolicy()})
	c := h.client(fullKey)
	got, err := c.Request(h.ctx, client.Call{Tool: "write_file", CallID: "u1", Arguments: json.RawMessage(`{"path":"/tmp/x"}`), Upstream: "files"})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	r, err := h.store.Request(h.ctx, got.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Undeclared || r.Caller.Upstream != "files" || r.Caller.Name != "full" {
		t.Errorf("request undeclared=%v caller=%+v, want undeclared, upstream files, key full", r.Undeclared, r.Caller)
	}
	got, err = c.Request(h.ctx, client.Call{Tool: "issue_refund", CallID: "u2", Arguments: json.RawMessage(`{"amount":5}`)})
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if r, err := h.store.Request(h.ctx, got.ID); err != nil || r.Undeclared {
		t.Errorf("declared tool's request undeclared=%v (%v), want false", r != nil && r.Undeclared, err)
	}
}
