package store_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// memWitness keeps the checkpoints it is given.
type memWitness struct {
	mu  sync.Mutex // guards cps, err
	cps []approval.Checkpoint
	err error
}

func (w *memWitness) Name() string { return "memory" }
func (w *memWitness) Publish(_ context.Context, c approval.Checkpoint) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	w.cps = append(w.cps, c)
	return nil
}
func (w *memWitness) all() []approval.Checkpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]approval.Checkpoint(nil), w.cps...)
}

// checkpointFixture is an audit stream of 8 entries (the third an
// approval by U0MALLORY1), its checkpointer and witness.
type checkpointFixture struct {
	rdb     redis.UniversalClient
	stream  string
	audit   *store.Audit
	cpr     *store.Checkpointer
	witness *memWitness
	key     ed25519.PrivateKey
	every   int64
	entries []approval.Entry
}

func mustCheckpointFixture(t *testing.T, every int64) checkpointFixture {
	t.Helper()
	rdb, stream := auditRedis(t)
	if storetest.Real() {
		t.Cleanup(func() {
			_ = rdb.Del(context.Background(), stream+":head:checkpoint", stream+":head:checkpoint:lock").Err()
		})
	}
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := checkpointFixture{rdb: rdb, stream: stream, audit: newAudit(t, rdb, stream), witness: &memWitness{}, key: key, every: every}
	f.cpr = store.NewCheckpointer(f.audit, store.CheckpointOptions{Key: key, Witnesses: []store.Witness{f.witness}, Every: every})
	f.entries = append(f.entries, mustAppend(t, f.audit, 2)...)
	e, err := f.audit.Append(t.Context(), approval.Record{Event: approval.EventDecided, RequestID: "req_refund", Actor: "U0MALLORY1", Tool: "refund",
		Data: map[string]any{"verdict": "approve"}})
	if err != nil {
		t.Fatal(err)
	}
	f.entries = append(f.entries, e)
	f.entries = append(f.entries, mustAppend(t, f.audit, 5)...)
	return f
}

func (f checkpointFixture) mustCheckpoint(t *testing.T) *approval.Checkpoint {
	t.Helper()
	cp, _, err := f.cpr.Checkpoint(t.Context())
	if err != nil {
		t.Fatalf("Checkpoint = %v", err)
	}
	return cp
}

// verify runs `audit verify --pubkey --checkpoints` over the stream, just
// after its last entry was written (the audit's clock), with the default
// bound.
func (f checkpointFixture) verify(t *testing.T, cps []approval.Checkpoint) (bool, string) {
	t.Helper()
	newest, err := f.audit.RevRange(t.Context(), "", 1)
	if err != nil || len(newest) != 1 {
		t.Fatalf("RevRange = %v, %v", newest, err)
	}
	return f.verifyAt(t, cps, newest[0].Time.Add(time.Second))
}

// verifyAt runs `audit verify --pubkey --checkpoints` at now.
func (f checkpointFixture) verifyAt(t *testing.T, cps []approval.Checkpoint, now time.Time) (bool, string) {
	t.Helper()
	var out strings.Builder
	ok, err := auditreport.VerifyCheckpointed(t.Context(), f.audit, &out, auditreport.Proof{Stream: f.stream, PubKey: f.key.Public().(ed25519.PublicKey),
		Checkpoints: cps, Bound: approval.CheckpointBound(store.DefaultCheckpointInterval), Now: now}, false)
	if err != nil {
		t.Fatalf("VerifyCheckpointed = %v", err)
	}
	return ok, out.String()
}

// TestCheckpointCatchesTampering: what the red team did with Redis access
// passes the keyless chain (store's Verify) and is named by the signed
// checkpoints.
func TestCheckpointCatchesTampering(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, f checkpointFixture)
		// hashless verifies with checkpoints as the Slack witness keeps
		// them (no short hashes): the entry is named by its range.
		hashless bool
		want     []string
	}{
		{"intact", func(*testing.T, checkpointFixture) {}, false,
			[]string{"audit proven: 8 entries up to seq 8 by 1 checkpoint ", "0 after it not yet covered"}},
		{"rewritten actor, rehashed after", func(t *testing.T, f checkpointFixture) {
			storetest.Attacker{RDB: f.rdb, Stream: f.stream}.Rewrite(t, 3, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
		}, false, []string{"audit BROKEN at seq 3 (id ", "rewritten after it was signed", "at entry:", "U0EVE00001"}},
		{"rewritten actor, checkpoint without hashes", func(t *testing.T, f checkpointFixture) {
			storetest.Attacker{RDB: f.rdb, Stream: f.stream}.Rewrite(t, 3, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
		}, true, []string{"audit BROKEN at seq 8", "an entry from seq 1 to 8 was rewritten"}},
		{"tail cut", func(t *testing.T, f checkpointFixture) {
			storetest.Attacker{RDB: f.rdb, Stream: f.stream}.CutTail(t, 3)
		}, false, []string{"audit BROKEN at seq 5", "entries 6 to 8 were cut off the end"}},
		{"head trimmed, trimmed=1", func(t *testing.T, f checkpointFixture) {
			storetest.Attacker{RDB: f.rdb, Stream: f.stream}.TrimHead(t, 3)
		}, false, []string{"audit BROKEN at seq 4", "entries 1 to 3 it covers are gone (trimmed past a checkpoint)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustCheckpointFixture(t, 0)
			f.mustCheckpoint(t)
			tt.tamper(t, f)
			// The keyless chain cannot tell (the attack of issue 29).
			if n, err := f.audit.Verify(t.Context()); err != nil {
				t.Fatalf("Verify (keyless) = %d, %v; the attack should pass it", n, err)
			}
			cps := f.witness.all()
			if tt.hashless {
				for i := range cps {
					cps[i].Hashes = nil
				}
			}
			ok, out := f.verify(t, cps)
			if ok != (tt.name == "intact") {
				t.Errorf("VerifyCheckpointed ok = %v, want %v:\n%s", ok, !ok, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("VerifyCheckpointed wrote %q, want it to contain %q", out, w)
				}
			}
			t.Log(out)
		})
	}
}

// TestCheckpointRefusesForgedHistory: after the rewrite, the running
// server appends on top of the forged head; the next checkpoint refuses
// to sign it.
func TestCheckpointRefusesForgedHistory(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	f.mustCheckpoint(t)
	storetest.Attacker{RDB: f.rdb, Stream: f.stream}.Rewrite(t, 3, func(e *approval.Entry) { e.Actor = "U0EVE00001" })
	mustAppend(t, f.audit, 2)
	if _, _, err := f.cpr.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) {
		t.Fatalf("Checkpoint after a rewrite = %v, want ErrCheckpointDiverged", err)
	}
	if got := len(f.witness.all()); got != 1 {
		t.Errorf("witness has %d checkpoints, want only the first", got)
	}
}

// TestCheckpointUncovered: entries after the last checkpoint are named as
// not yet covered; a checkpoint covers at most Every entries, chained.
func TestCheckpointUncovered(t *testing.T) {
	f := mustCheckpointFixture(t, 3)
	f.mustCheckpoint(t) // 8 entries: 3 + 3 + 2
	mustAppend(t, f.audit, 2)
	if got := len(f.witness.all()); got != 3 {
		t.Fatalf("checkpoints = %d, want 3 (Every 3 over 8 entries)", got)
	}
	ok, out := f.verify(t, f.witness.all())
	if !ok || !strings.Contains(out, "8 entries up to seq 8 by 3 checkpoints") || !strings.Contains(out, "2 after it not yet covered by a checkpoint") {
		t.Errorf("VerifyCheckpointed = %v, %q", ok, out)
	}
	// A checkpoint missing from the witnesses breaks their chain.
	cps := f.witness.all()
	ok, out = f.verify(t, []approval.Checkpoint{cps[0], cps[2]})
	if ok || !strings.Contains(out, "audit checkpoints BROKEN: checkpoint 2") {
		t.Errorf("VerifyCheckpointed without the middle checkpoint = %v, %q", ok, out)
	}
	// Nothing new: no checkpoint.
	if _, _, err := f.cpr.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, made, err := f.cpr.Checkpoint(t.Context()); err != nil || made {
		t.Errorf("Checkpoint with nothing new = %v, %v, want nothing made", made, err)
	}
}

// TestCheckpointRotation: a checkpoint signed by the old key names the
// new one; a checkpointer with the new key continues the chain.
func TestCheckpointRotation(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	f.mustCheckpoint(t)
	newPub, newKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cpr.Rotate(t.Context(), newPub); err != nil {
		t.Fatalf("Rotate = %v", err)
	}
	mustAppend(t, f.audit, 2)
	// A replica still on the old key does not sign past the hand-over.
	if _, _, err := f.cpr.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) {
		t.Errorf("Checkpoint with the old key after the rotation = %v, want ErrCheckpointDiverged", err)
	}
	// The new key cannot check the old key's hand-over alone: it is
	// refused (it could be anyone's, issue 46), until the previous key is
	// given.
	blind := store.NewCheckpointer(f.audit, store.CheckpointOptions{Key: newKey, Witnesses: []store.Witness{f.witness}})
	if _, _, err := blind.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) || !strings.Contains(err.Error(), "COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY") {
		t.Errorf("Checkpoint with the new key and no previous key = %v, want ErrCheckpointDiverged naming COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY", err)
	}
	next := store.NewCheckpointer(f.audit, store.CheckpointOptions{Key: newKey, PreviousKey: f.key.Public().(ed25519.PublicKey), Witnesses: []store.Witness{f.witness}})
	if _, _, err := next.Checkpoint(t.Context()); err != nil {
		t.Fatalf("Checkpoint with the new key = %v", err)
	}
	ok, out := f.verify(t, f.witness.all()) // trusting the old key: the chain hands over
	if !ok || !strings.Contains(out, "10 entries up to seq 10 by 3 checkpoints") {
		t.Errorf("VerifyCheckpointed across a rotation = %v, %q", ok, out)
	}
	// A third key finds the checkpoint in Redis not its own: it refuses.
	_, other, _ := ed25519.GenerateKey(nil)
	mustAppend(t, f.audit, 1)
	stranger := store.NewCheckpointer(f.audit, store.CheckpointOptions{Key: other})
	if _, _, err := stranger.Checkpoint(t.Context()); !errors.Is(err, store.ErrCheckpointDiverged) {
		t.Errorf("Checkpoint with a key the chain never named = %v, want ErrCheckpointDiverged", err)
	}
}

// TestCheckpointWitnessesFail: when every witness fails, the checkpoint
// is not kept, so the next one does not name a checkpoint nobody has.
func TestCheckpointWitnessesFail(t *testing.T) {
	f := mustCheckpointFixture(t, 0)
	f.witness.err = errors.New("disk full")
	if _, _, err := f.cpr.Checkpoint(t.Context()); err == nil {
		t.Fatal("Checkpoint with every witness failing = nil error")
	}
	f.witness.err = nil
	f.mustCheckpoint(t)
	if ok, out := f.verify(t, f.witness.all()); !ok {
		t.Errorf("VerifyCheckpointed = %v, %q", ok, out)
	}
}
