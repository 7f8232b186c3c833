package approval_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// TestAssessReviewAfter: under review: after a call that fires nothing runs
// after its cancel window; one that fires a signal is reviewed before.
func TestAssessReviewAfter(t *testing.T) {
	g := MustGate(t, approval.Policy{Tools: map[string]approval.ToolPolicy{
		"restart": {Risk: approval.RiskLow, Review: approval.ReviewAfter, CancelWindow: 5 * time.Minute, When: "args.env == 'prod'"},
	}})
	tests := []struct {
		name       string
		args       string
		wantWindow time.Duration
		wantCodes  string
	}{
		{"plain call: cancel window", `{"env":"staging"}`, 5 * time.Minute, approval.SignalReviewAfter},
		{"when rule fires: approve before", `{"env":"prod"}`, 0, approval.SignalWhenRule},
		{"rule cannot be evaluated: approve before", `{}`, 0, approval.SignalWhenError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := g.Assess(approval.ToolCall{Tool: "restart", Args: []byte(tc.args)}, "U1")
			if err != nil {
				t.Fatalf("Assess(%s) = %v", tc.args, err)
			}
			if !a.NeedsHuman || a.Window != tc.wantWindow || strings.Join(codes(a.Signals), ",") != tc.wantCodes {
				t.Errorf("Assess(%s) = needs human %v, window %v, signals %v; want true, %v, %s",
					tc.args, a.NeedsHuman, a.Window, codes(a.Signals), tc.wantWindow, tc.wantCodes)
			}
		})
	}
}

// TestNewGateRefusesReviewAfter: review: after is refused where review:
// never would be, and with a quorum above one.
func TestNewGateRefusesReviewAfter(t *testing.T) {
	tests := []struct {
		name string
		tp   approval.ToolPolicy
		want string
	}{
		{"high risk", approval.ToolPolicy{Risk: approval.RiskHigh, Review: approval.ReviewAfter, CancelWindow: time.Minute}, "high-risk"},
		{"sensitive capability", approval.ToolPolicy{Risk: approval.RiskLow, Capabilities: []string{"spend_money"}, Review: approval.ReviewAfter, CancelWindow: time.Minute}, "sensitive capability spend_money"},
		{"quorum 2", approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewAfter, CancelWindow: time.Minute, Quorum: 2}, "quorum 2"},
		{"no window", approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewAfter}, "cancel_window: required"},
		{"sample under always", approval.ToolPolicy{Review: approval.ReviewAlways, Sample: 0.1}, "sample: has no effect"},
		{"sample above 1", approval.ToolPolicy{Sample: 1.1}, "sample 1.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := approval.NewGate(approval.Policy{Tools: map[string]approval.ToolPolicy{"t": tc.tp}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewGate(%+v) = %v, want an error containing %q", tc.tp, err, tc.want)
			}
		})
	}
}

// TestSampledRate: the sampled fraction of 10,000 request ids is within
// half a percentage point of the rate, and the choice depends on the id
// alone (every replica and every replay agrees). The ids are a fixed set
// (random ones would make the bound a matter of luck: at 5% one standard
// deviation over 10,000 ids is 0.22 points).
func TestSampledRate(t *testing.T) {
	const n = 10_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("req_%026d", i)
	}
	for _, rate := range []float64{0, 0.01, 0.05, 0.1, 0.2, 1} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			picked := 0
			for _, id := range ids {
				got := approval.Sampled(id, rate)
				if got != approval.Sampled(id, rate) {
					t.Fatalf("Sampled(%s, %v) changed between calls", id, rate)
				}
				if got {
					picked++
				}
			}
			if frac := float64(picked) / n; math.Abs(frac-rate) > 0.005 {
				t.Errorf("Sampled picked %.4f of %d ids, want %.4f ± 0.005", frac, n, rate)
			}
		})
	}
	// Known ids pin the function: a replica built from other code must
	// choose the same calls.
	for id, want := range map[string]bool{"req_a": false, "req_c": true} /* 0.771, 0.300 */ {
		if got := approval.Sampled(id, 0.5); got != want {
			t.Errorf("Sampled(%q, 0.5) = %v, want %v", id, got, want)
		}
	}
}
