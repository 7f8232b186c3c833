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

// CheckpointedResult is `audit verify --pubkey … --checkpoints … --json`.
type CheckpointedResult struct {
	// Proven is true when every checkpoint verifies and every entry up to
	// the last one is proven.
	Proven      bool  `json:"proven"`
	Entries     int   `json:"entries"`
	Checkpoints int   `json:"checkpoints"`
	Covered     int   `json:"covered"`
	Uncovered   int   `json:"uncovered"` // after the last checkpoint: not yet covered
	LastSeq     int64 `json:"last_checkpoint_seq"`
	// CheckpointBreak names the first checkpoint that fails; Break the
	// first entry (a rewrite, a truncation, a trim past a checkpoint).
	CheckpointBreak *approval.CheckpointError `json:"checkpoint_break,omitempty"`
	Break           *approval.ChainError      `json:"break,omitempty"`
	Entry           *approval.Entry           `json:"entry,omitempty"`
	// Why is the one-line verdict.
	Why string `json:"why"`
}

// VerifyCheckpointed checks the checkpoints (signed by pub, then by each
// rotation's next key; chained; about stream), then proves every entry of
// the stream up to the last checkpoint with them, and writes a one-line
// verdict. proven is false for a bad checkpoint, a rewritten entry, a cut
// tail or a trim past a checkpoint, or no checkpoint at all; an error
// means the stream could not be read.
func VerifyCheckpointed(ctx context.Context, r Ranger, w io.Writer, stream string, pub ed25519.PublicKey, cps []approval.Checkpoint, asJSON bool) (proven bool, err error) {
	res := CheckpointedResult{Checkpoints: len(cps)}
	res.Why, err = proveStream(ctx, r, stream, pub, cps, &res)
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

func proveStream(ctx context.Context, r Ranger, stream string, pub ed25519.PublicKey, cps []approval.Checkpoint, res *CheckpointedResult) (string, error) {
	if len(cps) == 0 {
		return "audit NOT PROVEN: no checkpoints given (is a witness configured? see docs/operations.md)", nil
	}
	if err := approval.VerifyCheckpoints(pub, stream, cps); err != nil {
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
	res.Proven = true
	last := cps[len(cps)-1]
	plural := "s"
	if len(cps) == 1 {
		plural = ""
	}
	return fmt.Sprintf("audit proven: %d entries up to seq %d by %d checkpoint%s (the last signed %s); %d after it not yet covered by a checkpoint",
		sum.Covered, sum.LastSeq, len(cps), plural, last.Time.UTC().Format(time.RFC3339), sum.Uncovered), nil
}
