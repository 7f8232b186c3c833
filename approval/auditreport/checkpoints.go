package auditreport

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/countersign/countersign/approval"
)

// This file: `countersign audit verify --pubkey … --checkpoints …`, the
// proof of the stream against signed checkpoints kept outside Redis.

// checkpointPage is how many entries VerifyCheckpointed reads at a time.
const checkpointPage = 1000

// Proof is what VerifyCheckpointed proves a stream with.
type Proof struct {
	// Stream is the stream the checkpoints must be about ("" any).
	Stream string
	// PubKey is the trusted key: the first checkpoints' signer (each
	// rotation's next key after it).
	PubKey      ed25519.PublicKey
	Checkpoints []approval.Checkpoint
	// Bound is how long an entry may wait for a checkpoint
	// (approval.CheckpointBound of the deployment's interval): an entry
	// older than Bound at Now that no checkpoint covers is NOT PROVEN,
	// since checkpoints have stopped. It must be positive.
	Bound time.Duration
	Now   time.Time
}

// CheckpointedResult is `audit verify --pubkey … --checkpoints … --json`.
type CheckpointedResult struct {
	// Proven is true when every checkpoint verifies, every entry up to
	// the last one is proven, and no entry after it is older than the
	// bound.
	Proven      bool  `json:"proven"`
	Entries     int   `json:"entries"`
	Checkpoints int   `json:"checkpoints"`
	Covered     int   `json:"covered"`
	Uncovered   int   `json:"uncovered"` // after the last checkpoint: not yet covered
	LastSeq     int64 `json:"last_checkpoint_seq"`
	// Overdue counts the uncovered entries older than the bound; Bound is
	// that bound, in seconds.
	Overdue int     `json:"overdue"`
	Bound   float64 `json:"bound_seconds"`
	// CheckpointBreak names the first checkpoint that fails; Break the
	// first entry (a rewrite, a truncation, a trim past a checkpoint).
	CheckpointBreak *approval.CheckpointError `json:"checkpoint_break,omitempty"`
	Break           *approval.ChainError      `json:"break,omitempty"`
	// Entry is the entry of Break, or the oldest overdue one.
	Entry *approval.Entry `json:"entry,omitempty"`
	// Why is the one-line verdict.
	Why string `json:"why"`
}

// VerifyCheckpointed checks the checkpoints (signed by p.PubKey, then by
// each rotation's next key; chained; about p.Stream), then proves every
// entry of the stream up to the last checkpoint with them, and writes a
// one-line verdict. proven is false for a bad checkpoint, a rewritten
// entry, a cut tail or a trim past a checkpoint, no checkpoint at all, or
// entries older than p.Bound that no checkpoint covers; an error means
// the stream could not be read.
func VerifyCheckpointed(ctx context.Context, r Ranger, w io.Writer, p Proof, asJSON bool) (proven bool, err error) {
	if p.Bound <= 0 {
		return false, errors.New("verify checkpoints: the bound must be positive")
	}
	res := CheckpointedResult{Checkpoints: len(p.Checkpoints), Bound: p.Bound.Seconds()}
	res.Why, err = proveStream(ctx, r, p, &res)
	if err != nil {
		return false, err
	}
	if asJSON {
		b, _ := json.Marshal(res)
		_, err = fmt.Fprintf(w, "%s\n", b)
		return res.Proven, err
	}
	_, err = fmt.Fprintln(w, res.Why)
	if err == nil && res.Entry != nil {
		_, err = fmt.Fprintf(w, "at entry: %s\n", TailLine(*res.Entry))
	}
	return res.Proven, err
}

func proveStream(ctx context.Context, r Ranger, pr Proof, res *CheckpointedResult) (string, error) {
	cps := pr.Checkpoints
	if len(cps) == 0 {
		return "audit NOT PROVEN: no checkpoints given (is a witness configured? see docs/operations.md)", nil
	}
	if err := approval.VerifyCheckpoints(pr.PubKey, pr.Stream, cps); err != nil {
		var ce *approval.CheckpointError
		if !errors.As(err, &ce) {
			return "", err
		}
		res.CheckpointBreak = ce
		return "audit checkpoints BROKEN: " + ce.Error(), nil
	}
	p := approval.NewCheckpointProof(cps)
	fail := func(ce *approval.ChainError) (string, error) {
		res.Break, res.Entries = ce, p.Checked()
		if ce.ID != "" {
			if page, err := r.Range(ctx, IDBefore(ce.ID), 1); err == nil && len(page) == 1 && page[0].ID == ce.ID {
				res.Entry = &page[0]
			}
		}
		return fmt.Sprintf("audit BROKEN at seq %d (id %s): %s", ce.Seq, ce.ID, ce.Why), nil
	}
	last := cps[len(cps)-1]
	// Entries after the last checkpoint written before this are overdue:
	// a checkpoint should have covered them.
	deadline := pr.Now.Add(-pr.Bound)
	var overdue *approval.Entry
	after := ""
	for {
		page, err := r.Range(ctx, after, checkpointPage)
		if err != nil {
			return "", err
		}
		for _, e := range page {
			if err := p.Next(e); err != nil {
				var ce *approval.ChainError
				if !errors.As(err, &ce) {
					return "", err
				}
				return fail(ce)
			}
			if e.Seq > last.Seq && e.Time.Before(deadline) {
				if overdue == nil {
					overdue = &e
				}
				res.Overdue++
			}
		}
		if len(page) < checkpointPage {
			break
		}
		after = page[len(page)-1].ID
	}
	sum, err := p.Finish()
	res.Entries, res.Covered, res.Uncovered, res.LastSeq = p.Checked(), sum.Covered, sum.Uncovered, sum.LastSeq
	if err != nil {
		var ce *approval.ChainError
		if !errors.As(err, &ce) {
			return "", err
		}
		return fail(ce)
	}
	plural := "s"
	if len(cps) == 1 {
		plural = ""
	}
	if overdue != nil {
		res.Entry = overdue
		return fmt.Sprintf("audit NOT PROVEN: %d entries after the last checkpoint (seq %d, signed %s) are older than the bound (%s) and no checkpoint covers them, from seq %d (written %s): checkpoints have stopped, and these entries could have been rewritten since; see the checkpointer's alarm (docs/operations.md \"Checkpoint alarms\"). The %d entries up to seq %d are proven by %d checkpoint%s",
			res.Overdue, last.Seq, last.Time.UTC().Format(time.RFC3339), pr.Bound, overdue.Seq, overdue.Time.UTC().Format(time.RFC3339),
			sum.Covered, sum.LastSeq, len(cps), plural), nil
	}
	res.Proven = true
	return fmt.Sprintf("audit proven: %d entries up to seq %d by %d checkpoint%s (the last signed %s); %d after it not yet covered by a checkpoint (all younger than the bound, %s)",
		sum.Covered, sum.LastSeq, len(cps), plural, last.Time.UTC().Format(time.RFC3339), sum.Uncovered, pr.Bound), nil
}
