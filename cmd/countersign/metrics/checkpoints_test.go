package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countersign/countersign/approval"
)

// fixedHealth is a checkpointer that always reports h.
type fixedHealth struct{ h approval.CheckpointHealth }

func (f fixedHealth) Health() approval.CheckpointHealth { return f.h }

// TestMetricsCheckpoints: the gauges read the checkpointer's health at
// each scrape: its lag, and 1 while it raises an alarm.
func TestMetricsCheckpoints(t *testing.T) {
	tests := []struct {
		name           string
		health         approval.CheckpointHealth
		lag, wantAlarm float64
	}{
		{"everything covered", approval.CheckpointHealth{}, 0, 0},
		{"entries waiting within the bound", approval.CheckpointHealth{Lag: 12 * time.Second, Uncovered: 3}, 12, 0},
		{"checkpoints stopped", approval.CheckpointHealth{Lag: 95 * time.Second, Uncovered: 3, Alarm: "no checkpoint covers the 3 entries"}, 95, 1},
		{"refusing to sign", approval.CheckpointHealth{Alarm: "refusing to sign: entry changed since it was read"}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			RegisterCheckpoints(reg, fixedHealth{tt.health})
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range fams {
				got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
			}
			for name, want := range map[string]float64{"countersign_audit_checkpoint_lag_seconds": tt.lag, "countersign_audit_checkpoint_alarm": tt.wantAlarm} {
				if g, ok := got[name]; !ok || g != want {
					t.Errorf("%s = %v (exported %v), want %v", name, g, ok, want)
				}
			}
		})
	}
}
