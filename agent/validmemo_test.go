package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/countersign/countersign/approval"
)

// memoTool is a Tool with only a schema.
type memoTool struct {
	name   string
	schema string
}

func (t memoTool) Name() string                                    { return t.name }
func (t memoTool) Description() string                             { return "" }
func (t memoTool) Schema() json.RawMessage                         { return json.RawMessage(t.schema) }
func (t memoTool) Risk() approval.Risk                             { return approval.RiskMedium }
func (t memoTool) Capabilities() []string                          { return nil }
func (t memoTool) Run(context.Context, Invocation) (string, error) { return "", nil }
func (t memoTool) Preview(context.Context, json.RawMessage) (approval.Preview, error) {
	return approval.Preview{}, nil
}

// TestValidMemo: arguments a tool accepted are accepted again without a
// second validation, by their exact bytes and for that tool only; a
// refusal is never remembered, and the memory stays bounded.
func TestValidMemo(t *testing.T) {
	ts, err := newToolset([]Tool{
		memoTool{"refund", `{"type":"object","properties":{"amount":{"type":"number","maximum":500}},"required":["amount"]}`},
		memoTool{"small_refund", `{"type":"object","properties":{"amount":{"type":"number","maximum":50}},"required":["amount"]}`},
	})
	if err != nil {
		t.Fatal(err)
	}
	refund, small := ts.byName["refund"], ts.byName["small_refund"]
	ok := json.RawMessage(`{"amount":120}`)
	for range 3 {
		if err := refund.validate(ok); err != nil {
			t.Fatalf("validate(%s): %v", ok, err)
		}
	}
	if refund.valid.misses != 1 {
		t.Errorf("three validations of the same arguments ran %d times, want 1", refund.valid.misses)
	}
	// Another tool's schema judges the same bytes itself.
	if err := small.validate(ok); err == nil {
		t.Errorf("small_refund accepted %s (maximum 50): refund's acceptance leaked into it", ok)
	}
	// Refusals are judged every time, with their message.
	bad := json.RawMessage(`{"amount":900}`)
	for i := range 2 {
		if err := refund.validate(bad); err == nil {
			t.Fatalf("validate(%s) #%d accepted an amount over the maximum", bad, i+1)
		}
	}
	if refund.valid.misses != 3 {
		t.Errorf("misses = %d after two refusals, want 3 (refusals are not remembered)", refund.valid.misses)
	}
	// Other bytes for the same value are validated, not assumed.
	if err := refund.validate(json.RawMessage(`{"amount": 120}`)); err != nil {
		t.Fatal(err)
	}
	if refund.valid.misses != 4 {
		t.Errorf("misses = %d, want 4: the memo is keyed by the exact bytes", refund.valid.misses)
	}
	// Bounded: full, it starts over.
	for i := range 3 * maxValid {
		if err := refund.validate(json.RawMessage(fmt.Sprintf(`{"amount":%d}`, i%500))); err != nil {
			t.Fatal(err)
		}
		if n := len(refund.valid.m); n > maxValid {
			t.Fatalf("the memo holds %d arguments, more than maxValid (%d)", n, maxValid)
		}
	}
}
