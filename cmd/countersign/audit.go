package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

const auditUsage = `usage: countersign audit <command> [flags]

commands:
  tail [-n 20] [-f] [--json]             the last entries, one line each; -f follows new ones
  show [--json] <request-id>             the whole story of one request
  verify [--json]                        check the hash chain (exit 0 intact, 1 broken)
  export [--since 24h] [--only rejected,edited]
                                         requests as JSON Lines, for evals
  stats [--since 7d] [--json]            decisions per tool and per approver

Reads REDIS_URL and COUNTERSIGN_AUDIT_STREAM. --since takes a Go duration
or days: 90m, 24h, 7d, 1d12h. Exit status 2 means the command could not run
(bad flags, Redis unreachable). See docs/operations.md.
`

// auditPage is how many entries one XRANGE reads; no command holds more
// than one page of entries (show keeps the matching ones only).
const auditPage = 1000

// sinceSkew widens the stream-id range start of --since: stream ids come
// from the Redis clock, entry times from the writer's, and the entry time
// decides.
const sinceSkew = 5 * time.Minute

// auditLog is what the audit commands read; *store.Audit provides it.
type auditLog interface {
	Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error)
	RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error)
	Verify(ctx context.Context) (int, error)
	Follow(ctx context.Context, afterID string, fn func(approval.Entry) error) error
}

var _ auditLog = (*store.Audit)(nil)

// runAudit runs `countersign audit <command>`.
func runAudit(ctx context.Context, args []string, io stdio) int {
	if len(args) == 0 {
		fmt.Fprint(io.Stderr, auditUsage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(io.Stdout, auditUsage)
		return 0
	case "tail", "show", "verify", "export", "stats":
	default:
		fmt.Fprintf(io.Stderr, "countersign audit: unknown command %q\n\n%s", cmd, auditUsage)
		return 2
	}
	fs := flag.NewFlagSet("audit "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Stderr)
	asJSON := fs.Bool("json", false, "machine-readable output")
	var (
		n      *int
		follow *bool
		since  *string
		only   *string
	)
	switch cmd {
	case "tail":
		n = fs.Int("n", 20, "how many of the latest entries to print")
		follow = fs.Bool("f", false, "keep printing new entries until interrupted")
	case "export":
		since = fs.String("since", "24h", "requests made within this long ago (e.g. 24h, 7d)")
		only = fs.String("only", "", "comma-separated outcomes to keep: approved, edited, rejected, responded, expired, cancelled, pending")
	case "stats":
		since = fs.String("since", "7d", "decisions within this long ago (e.g. 24h, 7d)")
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var window time.Duration
	if since != nil {
		d, err := parseSince(*since)
		if err != nil {
			fmt.Fprintf(io.Stderr, "countersign audit %s: --since: %v\n", cmd, err)
			return 2
		}
		window = d
	}
	var onlySet map[string]bool
	if only != nil {
		s, err := parseOnly(*only)
		if err != nil {
			fmt.Fprintf(io.Stderr, "countersign audit export: %v\n", err)
			return 2
		}
		onlySet = s
	}
	if cmd == "show" && fs.NArg() != 1 {
		fmt.Fprintln(io.Stderr, "usage: countersign audit show [--json] <request-id>")
		return 2
	}
	if cmd != "show" && fs.NArg() > 0 {
		fmt.Fprintf(io.Stderr, "countersign audit %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}

	log, closeLog, err := openAuditLog()
	if err != nil {
		fmt.Fprintf(io.Stderr, "countersign audit: %v\n", err)
		return 2
	}
	defer closeLog()

	now := time.Now()
	switch cmd {
	case "tail":
		err = auditTail(ctx, log, io.Stdout, *n, *follow, *asJSON)
	case "show":
		var found bool
		found, err = auditShow(ctx, log, io.Stdout, fs.Arg(0), *asJSON)
		if err == nil && !found {
			fmt.Fprintf(io.Stderr, "countersign audit show: no entries for request %q\n", fs.Arg(0))
			return 1
		}
	case "verify":
		return auditVerify(ctx, log, io, *asJSON)
	case "export":
		err = auditExport(ctx, log, io.Stdout, now.Add(-window), onlySet)
	case "stats":
		err = auditStats(ctx, log, io.Stdout, now.Add(-window), now, *asJSON)
	}
	if err != nil {
		if errors.Is(err, context.Canceled) && cmd == "tail" {
			return 0 // Ctrl-C ends tail -f
		}
		fmt.Fprintf(io.Stderr, "countersign audit %s: %v\n", cmd, err)
		return 2
	}
	return 0
}

// openAuditLog connects to the audit stream named by the environment.
func openAuditLog() (*store.Audit, func(), error) {
	cfg, err := loadConfig()
	if err != nil {
		return nil, nil, err
	}
	rdb, err := newRedis(cfg.RedisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return store.NewAudit(rdb, store.AuditOptions{Stream: cfg.AuditStream}), func() { _ = rdb.Close() }, nil
}

// scanAudit calls fn for every entry after afterID, oldest first, one page
// of auditPage entries at a time.
func scanAudit(ctx context.Context, log auditLog, afterID string, fn func(approval.Entry) error) error {
	for {
		page, err := log.Range(ctx, afterID, auditPage)
		if err != nil {
			return err
		}
		for _, e := range page {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(page) < auditPage {
			return nil
		}
		afterID = page[len(page)-1].ID
	}
}

// scanSince calls fn for entries stamped at or after since. The scan
// starts at the stream id of since (less sinceSkew), so older entries are
// never read.
func scanSince(ctx context.Context, log auditLog, since time.Time, fn func(approval.Entry) error) error {
	return scanAudit(ctx, log, streamIDBefore(since.Add(-sinceSkew)), func(e approval.Entry) error {
		if e.Time.Before(since) {
			return nil
		}
		return fn(e)
	})
}

// streamIDBefore is the largest stream id before every id of time t, for
// use as an exclusive range start; "" (the beginning) for times before
// the epoch.
func streamIDBefore(t time.Time) string {
	ms := t.UnixMilli()
	if ms <= 0 {
		return ""
	}
	return strconv.FormatInt(ms-1, 10) + "-18446744073709551615"
}

// idBefore is the largest stream id smaller than id ("" when there is
// none), so Range(idBefore(id), 1) reads the entry at id.
func idBefore(id string) string {
	msStr, seqStr, ok := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(msStr, 10, 64)
	seq, err2 := strconv.ParseUint(seqStr, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return ""
	}
	if seq > 0 {
		return fmt.Sprintf("%d-%d", ms, seq-1)
	}
	if ms == 0 {
		return ""
	}
	return fmt.Sprintf("%d-18446744073709551615", ms-1)
}

// auditTail prints the last n entries and, with follow, every new one
// until ctx ends.
func auditTail(ctx context.Context, log auditLog, w io.Writer, n int, follow, asJSON bool) error {
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
		_, err := fmt.Fprintln(w, tailLine(e))
		return err
	}
	var last []approval.Entry
	for before := ""; len(last) < n; {
		page, err := log.RevRange(ctx, before, int64(min(n-len(last), auditPage)))
		if err != nil {
			return err
		}
		last = append(last, page...)
		if len(page) == 0 {
			break
		}
		before = page[len(page)-1].ID
	}
	slices.Reverse(last)
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

// errStopScan ends a scan early.
var errStopScan = errors.New("stop scan")

// auditShow prints the story of one request, scanning the whole stream a
// page at a time and keeping only its entries.
func auditShow(ctx context.Context, log auditLog, w io.Writer, id string, asJSON bool) (bool, error) {
	t := &trail{}
	err := scanAudit(ctx, log, "", func(e approval.Entry) error {
		if e.RequestID == id {
			t.add(e, true)
		}
		return nil
	})
	if err != nil || len(t.Entries) == 0 {
		return false, err
	}
	if t.Requester == "" && t.RunID != "" {
		// The requester is the actor of the run's run_started entry, which
		// comes before the request's first entry: read up to there only.
		first := t.Entries[0].ID
		err := scanAudit(ctx, log, "", func(e approval.Entry) error {
			if e.ID == first {
				return errStopScan
			}
			if e.Event == approval.EventRunStarted && e.RunID == t.RunID {
				t.Requester = e.Actor
				return errStopScan
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			return false, err
		}
	}
	if asJSON {
		s := storyJSON{exportRecord: t.record(), Reminded: t.Remind, Escalated: t.Escal, Entries: t.Entries}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(s)
	}
	return true, writeStory(w, t)
}

// verifyResult is `audit verify --json`.
type verifyResult struct {
	Intact  bool                 `json:"intact"`
	Entries int                  `json:"entries"`
	Break   *approval.ChainError `json:"break,omitempty"`
	Entry   *approval.Entry      `json:"entry,omitempty"`
}

// auditVerify checks the chain: exit 0 intact, 1 broken, 2 unknown.
func auditVerify(ctx context.Context, log auditLog, io stdio, asJSON bool) int {
	n, err := log.Verify(ctx)
	var ce *approval.ChainError
	if err != nil && !errors.As(err, &ce) {
		fmt.Fprintf(io.Stderr, "countersign audit verify: %v\n", err)
		return 2
	}
	res := verifyResult{Intact: err == nil, Entries: n, Break: ce}
	if ce != nil && ce.ID != "" {
		// Name the entry: read it back (it may be unreadable: that is the break).
		if page, rerr := log.Range(ctx, idBefore(ce.ID), 1); rerr == nil && len(page) == 1 && page[0].ID == ce.ID {
			res.Entry = &page[0]
		}
	}
	if asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintf(io.Stdout, "%s\n", b)
	} else if ce == nil {
		fmt.Fprintf(io.Stdout, "audit chain intact: %d entries\n", n)
	} else {
		fmt.Fprintf(io.Stdout, "audit chain BROKEN after %d intact entries\n%v\n", n, ce)
		if res.Entry != nil {
			fmt.Fprintf(io.Stdout, "first bad entry: %s\n", tailLine(*res.Entry))
		}
	}
	if ce != nil {
		return 1
	}
	return 0
}

// auditExport writes one JSON line per request made since since.
func auditExport(ctx context.Context, log auditLog, w io.Writer, since time.Time, only map[string]bool) error {
	x := newExporter()
	if err := scanSince(ctx, log, since, func(e approval.Entry) error { x.add(e); return nil }); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range x.records(only) {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// auditStats prints decision statistics for entries since since.
func auditStats(ctx context.Context, log auditLog, w io.Writer, since, until time.Time, asJSON bool) error {
	s := newStatsBuilder()
	if err := scanSince(ctx, log, since, func(e approval.Entry) error { s.add(e); return nil }); err != nil {
		return err
	}
	rep := s.report(since, until)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeStats(w, rep)
}
