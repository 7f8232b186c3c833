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

// The commands of `countersign audit` (tail, show, verify, export, stats):
// each reads the stream through the interfaces declared here and writes
// what the operator asked for to w. The CLI only parses flags and picks
// one.

// Log is the whole audit stream as the commands read it; *store.Audit
// provides it.
type Log interface {
	Ranger
	RevRanger
	// Verify checks the hash chain of the whole stream: a
	// *approval.ChainError names a break; any other error means the
	// stream could not be checked.
	Verify(ctx context.Context) (checked int, err error)
	// Follow calls fn for every entry after afterID as it is appended,
	// until ctx ends (its error then) or fn fails.
	Follow(ctx context.Context, afterID string, fn func(approval.Entry) error) error
}

// Command is one `countersign audit` command with its flags read.
type Command struct {
	// Name is tail, show, verify, export or stats.
	Name string
	// JSON asks for machine-readable output (tail, show, verify, stats).
	JSON bool
	// N is how many of the latest entries tail prints; Follow keeps
	// printing new ones.
	N      int
	Follow bool
	// Since is how far back export and stats read.
	Since time.Duration
	// Only keeps the export's requests with these outcomes (ParseOnly);
	// nil keeps all.
	Only map[string]bool
	// RequestID is the request show tells the story of.
	RequestID string
	// Names, when set, shows Slack user ids as names in the text output
	// (tail, show, stats, verify); JSON and export keep the ids.
	Names Names
	// PubKey and Checkpoints make verify prove the stream against signed
	// checkpoints (VerifyCheckpointed) instead of checking its keyless
	// chain only; Stream is the stream they must be about.
	PubKey      ed25519.PublicKey
	Checkpoints []approval.Checkpoint
	Stream      string
	// Bound is how long an entry may wait for a checkpoint
	// (approval.CheckpointBound of COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL):
	// verify with checkpoints says NOT PROVEN for older entries no
	// checkpoint covers.
	Bound time.Duration
}

// Run runs c over log, writing what was asked for to w; now ends the
// window of export and stats, and is when verify's bound is counted
// back from. ok is false when show found no entry of
// the request or verify found the chain broken (or, with checkpoints,
// not proven).
func (c Command) Run(ctx context.Context, log Log, w io.Writer, now time.Time) (ok bool, err error) {
	if c.Names != nil && !c.JSON && c.Name != "export" {
		log = Named(log, c.Names)
	}
	switch c.Name {
	case "tail":
		return true, Tail(ctx, log, w, c.N, c.Follow, c.JSON)
	case "show":
		return Show(ctx, log, w, c.RequestID, c.JSON)
	case "verify":
		if c.PubKey != nil {
			return VerifyCheckpointed(ctx, log, w, Proof{Stream: c.Stream, PubKey: c.PubKey, Checkpoints: c.Checkpoints, Bound: c.Bound, Now: now}, c.JSON)
		}
		return Verify(ctx, log, w, c.JSON)
	case "export":
		return true, Export(ctx, log, w, now.Add(-c.Since), c.Only)
	case "stats":
		return true, Stats(ctx, log, w, now.Add(-c.Since), now, c.JSON)
	}
	return false, fmt.Errorf("unknown command %q", c.Name)
}

// Empty reports whether the stream has no entries at all (an empty or
// missing stream reads as nothing, which the CLI says with where it looked).
func Empty(ctx context.Context, r RevRanger) (bool, error) {
	page, err := r.RevRange(ctx, "", 1)
	return len(page) == 0, err
}

// Tail writes the last n entries, one line each (or one JSON object a
// line), and with follow every new one until ctx ends.
func Tail(ctx context.Context, log Log, w io.Writer, n int, follow, asJSON bool) error {
	if n < 0 {
		n = 0
	}
	emit := func(e approval.Entry) error {
		if asJSON {
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(w, "%s\n", b)
			return err
		}
		_, err := fmt.Fprintln(w, TailLine(e))
		return err
	}
	last, err := Last(ctx, log, n)
	if err != nil {
		return err
	}
	for _, e := range last {
		if err := emit(e); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	after := ""
	if len(last) > 0 {
		after = last[len(last)-1].ID
	}
	return log.Follow(ctx, after, emit)
}

// Show writes the story of request id (ReadStory) as text or indented
// JSON; found is false when the stream has no entry of it.
func Show(ctx context.Context, r Ranger, w io.Writer, id string, asJSON bool) (found bool, err error) {
	t, err := ReadStory(ctx, r, id)
	if err != nil || t == nil {
		return false, err
	}
	if asJSON {
		s := Story{ExportRecord: t.ExportRecord(), Reminded: t.Remind, Escalated: t.Escal, Entries: t.Entries}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(s)
	}
	return true, WriteStory(w, t)
}

// VerifyResult is `audit verify --json`.
type VerifyResult struct {
	Intact  bool                 `json:"intact"`
	Entries int                  `json:"entries"`
	Break   *approval.ChainError `json:"break,omitempty"`
	Entry   *approval.Entry      `json:"entry,omitempty"`
}

// Verify checks the hash chain and writes the verdict, naming the first
// bad entry of a broken chain. intact is false for a broken chain; an
// error means the chain could not be checked.
func Verify(ctx context.Context, log Log, w io.Writer, asJSON bool) (intact bool, err error) {
	n, err := log.Verify(ctx)
	var ce *approval.ChainError
	if err != nil && !errors.As(err, &ce) {
		return false, err
	}
	res := VerifyResult{Intact: err == nil, Entries: n, Break: ce}
	if ce != nil && ce.ID != "" {
		// Name the entry: read it back (it may be unreadable: that is the break).
		if page, rerr := log.Range(ctx, IDBefore(ce.ID), 1); rerr == nil && len(page) == 1 && page[0].ID == ce.ID {
			res.Entry = &page[0]
		}
	}
	switch {
	case asJSON:
		b, _ := json.Marshal(res)
		_, err = fmt.Fprintf(w, "%s\n", b)
	case ce == nil:
		_, err = fmt.Fprintf(w, "audit chain intact: %d entries\n", n)
	default:
		_, err = fmt.Fprintf(w, "audit chain BROKEN after %d intact entries\n%v\n", n, ce)
		if err == nil && res.Entry != nil {
			_, err = fmt.Fprintf(w, "first bad entry: %s\n", TailLine(*res.Entry))
		}
	}
	return res.Intact, err
}

// Export writes one JSON line per request made since since, keeping the
// outcomes in only (all when only is empty; see ParseOnly).
func Export(ctx context.Context, r Ranger, w io.Writer, since time.Time, only map[string]bool) error {
	x := NewExporter()
	if err := ScanSince(ctx, r, since, func(e approval.Entry) error { x.Add(e); return nil }); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, rec := range x.Records(only) {
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return nil
}

// Stats writes the decision statistics of the entries from since to
// until, as a table or indented JSON.
func Stats(ctx context.Context, r Ranger, w io.Writer, since, until time.Time, asJSON bool) error {
	s := NewStatsBuilder()
	if err := ScanSince(ctx, r, since, func(e approval.Entry) error { s.Add(e); return nil }); err != nil {
		return err
	}
	rep := s.Report(since, until)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return WriteStats(w, rep)
}
