package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/countersign/countersign/approval"
)

// CheckpointHealth is what the checkpoint gauges read at each scrape;
// *store.Checkpointer provides it.
type CheckpointHealth interface {
	Health() approval.CheckpointHealth
}

// RegisterCheckpoints registers, on reg, countersign_audit_checkpoint_lag_seconds
// (how long the oldest audit entry the checkpointer read has waited for a
// checkpoint) and countersign_audit_checkpoint_alarm (1 while the
// checkpointer raises an alarm: it refuses to sign, someone wrote its
// lock, or an entry waited past the bound), read from c at each scrape.
// Registered only when checkpoints are on.
func RegisterCheckpoints(reg prometheus.Registerer, c CheckpointHealth) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "countersign_audit_checkpoint_lag_seconds",
			Help: "How long the oldest audit entry this replica has read has waited for a signed checkpoint (0 when every entry read is covered)."},
			func() float64 { return c.Health().Lag.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "countersign_audit_checkpoint_alarm",
			Help: "1 while the audit checkpointer raises an alarm (it refuses to sign a history that differs from what it read, refused the checkpoint kept in Redis, took over a lock no replica wrote, or an entry waited past the interval + 30 s); /readyz and the log say why."},
			func() float64 {
				if c.Health().Alarm != "" {
					return 1
				}
				return 0
			}),
	)
}
