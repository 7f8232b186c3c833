package approval_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// TestOpenWorldHintGatesWithoutConfidence: an undeclared tool whose hints
// say it is not destructive but acts on the open world is looked at by a
// person for that reason (open_world), not for a confidence its caller
// was never asked for; a closed-world one runs.
func TestOpenWorldHintGatesWithoutConfidence(t *testing.T) {
	no := false
	g := MustGate(t, approval.Policy{External: &approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewNever}})
	open, err := g.AssessExternal(approval.ToolCall{Tool: "web.post", Args: json.RawMessage(`{}`), Annotations: &approval.ToolAnnotations{Destructive: &no}}, "api:bot")
	if err != nil {
		t.Fatal(err)
	}
	if got := codes(open.Signals); !open.NeedsHuman || !slices.Equal(got, []string{approval.SignalOpenWorld}) {
		t.Errorf("open world: needs human %v, signals %v; want true, [open_world]", open.NeedsHuman, got)
	}
	closed, err := g.AssessExternal(approval.ToolCall{Tool: "calc.add", Args: json.RawMessage(`{}`), Annotations: &approval.ToolAnnotations{Destructive: &no, OpenWorld: &no}}, "api:bot")
	if err != nil || closed.NeedsHuman {
		t.Errorf("closed world: needs human %v, signals %v, err %v; want no human", closed.NeedsHuman, codes(closed.Signals), err)
	}
}

// TestOutsideCallerConfidence: only our model is asked for a confidence.
// A call from an outside caller (the API, MCP, HumanLayer: Judge with
// external, Gate.AssessExternal) that gives none fires no low_confidence,
// for a declared tool and under the external rule alike; a confidence it
// does give is judged as the model's is; our model's missing confidence
// still fires it.
func TestOutsideCallerConfidence(t *testing.T) {
	ext := approval.ToolPolicy{Risk: approval.RiskMedium, Review: approval.ReviewAuto}
	gate := MustGate(t, approval.Policy{MinConfidence: 0.6, External: &ext,
		Tools: map[string]approval.ToolPolicy{"update_ticket": {Risk: approval.RiskMedium, Review: approval.ReviewAuto}}})
	clock := clocktest.New(clocktest.Opts{})
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: approvaltest.NewLedger(approvaltest.NewRecords(clock.Now),
		approvaltest.NewAuditor(clock.Now)), Gate: gate, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		tool       string
		confidence *float64
		external   bool
		wantLow    bool
	}{
		{"outside caller, declared tool, no confidence", "update_ticket", nil, true, false},
		{"outside caller, undeclared tool, no confidence", "crm.update", nil, true, false},
		{"outside caller gives a low confidence", "update_ticket", conf(0.2), true, true},
		{"outside caller gives a confidence out of range", "crm.update", conf(7), true, true},
		{"outside caller gives a high confidence", "update_ticket", conf(0.9), true, false},
		{"our model gives no confidence", "update_ticket", nil, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call := approval.ToolCall{Tool: c.tool, Args: json.RawMessage(`{"id":"T-1"}`), Confidence: c.confidence}
			a, err := life.Judge(call, nil, "api:support-bot", c.external)
			if err != nil {
				t.Fatalf("Judge(%s) error = %v", c.tool, err)
			}
			gotLow := slices.Contains(codes(a.Signals), approval.SignalLowConfidence)
			if gotLow != c.wantLow || a.NeedsHuman != c.wantLow {
				t.Errorf("Judge(%s) = signals %v, needs human %v; want low_confidence %v", c.tool, codes(a.Signals), a.NeedsHuman, c.wantLow)
			}
		})
	}
}
