package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/countersign/countersign/store"
)

// checkpointAlarm is the /readyz detail of the checkpointer's alarm: the
// replica is degraded, not out of service (taking every replica out
// because someone wrote to Redis would hand them the outage).
func (m *Main) checkpointAlarm() []string {
	if m.checkpoints == nil {
		return nil
	}
	if a := m.checkpoints.Health().Alarm; a != "" {
		return []string{"degraded: audit checkpoints: " + a}
	}
	return nil
}

// finalCheckpoint covers the entries of the last moments at shutdown.
func finalCheckpoint(ctx context.Context, cp *store.Checkpointer) error {
	if cp == nil {
		return nil
	}
	if _, _, err := cp.Checkpoint(ctx); err != nil && !errors.Is(err, store.ErrCheckpointBusy) {
		return fmt.Errorf("final audit checkpoint: %w", err)
	}
	return nil
}
