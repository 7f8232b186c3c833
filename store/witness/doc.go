// Package witness keeps the audit stream's signed checkpoints
// (approval.Checkpoint) outside Redis, where someone who can write to
// Redis cannot reach them: an append-only file (File), a signed webhook
// (Webhook) and a message in a Slack channel (Slack, through the small
// Poster port the bot implements). Each satisfies store.Witness;
// cmd/countersign wires the ones configured. `countersign audit verify
// --checkpoints` reads what File writes (ReadFile), and the checkpointer
// starts from its last checkpoint (File.Last, a store.WitnessLog).
// SlackAlarms tells the same channel when checkpoints are in trouble
// (store.Alarms).
package witness
