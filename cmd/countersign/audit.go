package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/store"
)

const auditUsage = `usage: countersign audit <command> [flags]

commands:
  tail [-n 20] [-f] [--json]             the last entries, one line each; -f follows new ones
  show [--json] <request-id>             the whole story of one request
  verify [--json]                        check the hash chain (exit 0 intact, 1 broken)
  export [--since 24h] [--only rejected,edited,marked_wrong]
                                         requests as JSON Lines, for evals
  stats [--since 7d] [--json]            decisions per tool and per approver

Reads REDIS_URL and COUNTERSIGN_AUDIT_STREAM. --since takes a Go duration
or days: 90m, 24h, 7d, 1d12h. Exit status 2 means the command could not run
(bad flags, Redis unreachable). See docs/operations.md.
`

// auditLog is what the audit commands read; *store.Audit provides it.
type auditLog interface {
	Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error)
	RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error)
	Verify(ctx context.Context) (int, error)
	Follow(ctx context.Context, afterID string, fn func(approval.Entry) error) error
}

var _ auditLog = (*store.Audit)(nil)

// runAudit runs `countersign audit <command>`.
func runAudit(ctx context.Context, args []string, std stdio) int {
	if len(args) == 0 {
		fmt.Fprint(std.Stderr, auditUsage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(std.Stdout, auditUsage)
		return 0
	case "tail", "show", "verify", "export", "stats":
	default:
		fmt.Fprintf(std.Stderr, "countersign audit: unknown command %q\n\n%s", cmd, auditUsage)
		return 2
	}
	fs := flag.NewFlagSet("audit "+cmd, flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
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
		only = fs.String("only", "", "comma-separated outcomes to keep: approved, edited, rejected, responded, expired, cancelled, pending, run_now, window_elapsed, sampled, or marked_wrong (marked wrong whatever the outcome)")
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
		d, err := auditreport.ParseSince(*since)
		if err != nil {
			fmt.Fprintf(std.Stderr, "countersign audit %s: --since: %v\n", cmd, err)
			return 2
		}
		window = d
	}
	var onlySet map[string]bool
	if only != nil {
		s, err := auditreport.ParseOnly(*only)
		if err != nil {
			fmt.Fprintf(std.Stderr, "countersign audit export: %v\n", err)
			return 2
		}
		onlySet = s
	}
	if cmd == "show" && fs.NArg() != 1 {
		fmt.Fprintln(std.Stderr, "usage: countersign audit show [--json] <request-id>")
		return 2
	}
	if cmd != "show" && fs.NArg() > 0 {
		fmt.Fprintf(std.Stderr, "countersign audit %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}

	log, where, closeLog, err := openAuditLog()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit: %v\n", err)
		return 2
	}
	defer closeLog()
	if cmd != "show" {
		// An empty or missing stream reads as nothing at all: say so, and
		// where we looked (on stderr: stdout stays what was asked for).
		switch page, err := log.RevRange(ctx, "", 1); {
		case err != nil:
			fmt.Fprintf(std.Stderr, "countersign audit %s: %v\n", cmd, err)
			return 2
		case len(page) == 0:
			fmt.Fprintf(std.Stderr, "countersign audit: the audit stream %s is empty or missing: nothing was recorded there yet, "+
				"or REDIS_URL / COUNTERSIGN_REDIS_PREFIX / COUNTERSIGN_AUDIT_STREAM are not those of the process that writes it "+
				"(countersign demo prints its command)\n", where)
		}
	}

	now := time.Now()
	switch cmd {
	case "tail":
		err = auditTail(ctx, log, std.Stdout, *n, *follow, *asJSON)
	case "show":
		var found bool
		found, err = auditShow(ctx, log, std.Stdout, fs.Arg(0), *asJSON)
		if err == nil && !found {
			fmt.Fprintf(std.Stderr, "countersign audit show: no entries for request %q\n", fs.Arg(0))
			return 1
		}
	case "verify":
		return auditVerify(ctx, log, std, *asJSON)
	case "export":
		err = auditExport(ctx, log, std.Stdout, now.Add(-window), onlySet)
	case "stats":
		err = auditStats(ctx, log, std.Stdout, now.Add(-window), now, *asJSON)
	}
	if err != nil {
		if errors.Is(err, context.Canceled) && cmd == "tail" {
			return 0 // Ctrl-C ends tail -f
		}
		fmt.Fprintf(std.Stderr, "countersign audit %s: %v\n", cmd, err)
		return 2
	}
	return 0
}

// openAuditLog connects to the audit stream named by the environment and
// says which it is ("countersign:{audit} at redis://…").
func openAuditLog() (*store.Audit, string, func(), error) {
	cfg, err := loadConfig()
	if err != nil {
		return nil, "", nil, err
	}
	rdb, err := store.Dial(cfg.RedisURL)
	if err != nil {
		return nil, "", nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	where := fmt.Sprintf("%q at %s", cfg.AuditStream, store.RedactURL(cfg.RedisURL))
	return store.NewAudit(rdb, store.AuditOptions{Stream: cfg.AuditStream}), where, func() { _ = rdb.Close() }, nil
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
		_, err := fmt.Fprintln(w, auditreport.TailLine(e))
		return err
	}
	last, err := auditreport.Last(ctx, log, n)
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

// auditShow prints the story of one request (auditreport.ReadStory).
func auditShow(ctx context.Context, log auditLog, w io.Writer, id string, asJSON bool) (bool, error) {
	t, err := auditreport.ReadStory(ctx, log, id)
	if err != nil || t == nil {
		return false, err
	}
	if asJSON {
		s := auditreport.Story{ExportRecord: t.ExportRecord(), Reminded: t.Remind, Escalated: t.Escal, Entries: t.Entries}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(s)
	}
	return true, auditreport.WriteStory(w, t)
}

// verifyResult is `audit verify --json`.
type verifyResult struct {
	Intact  bool                 `json:"intact"`
	Entries int                  `json:"entries"`
	Break   *approval.ChainError `json:"break,omitempty"`
	Entry   *approval.Entry      `json:"entry,omitempty"`
}

// auditVerify checks the chain: exit 0 intact, 1 broken, 2 unknown.
func auditVerify(ctx context.Context, log auditLog, std stdio, asJSON bool) int {
	n, err := log.Verify(ctx)
	var ce *approval.ChainError
	if err != nil && !errors.As(err, &ce) {
		fmt.Fprintf(std.Stderr, "countersign audit verify: %v\n", err)
		return 2
	}
	res := verifyResult{Intact: err == nil, Entries: n, Break: ce}
	if ce != nil && ce.ID != "" {
		// Name the entry: read it back (it may be unreadable: that is the break).
		if page, rerr := log.Range(ctx, auditreport.IDBefore(ce.ID), 1); rerr == nil && len(page) == 1 && page[0].ID == ce.ID {
			res.Entry = &page[0]
		}
	}
	if asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintf(std.Stdout, "%s\n", b)
	} else if ce == nil {
		fmt.Fprintf(std.Stdout, "audit chain intact: %d entries\n", n)
	} else {
		fmt.Fprintf(std.Stdout, "audit chain BROKEN after %d intact entries\n%v\n", n, ce)
		if res.Entry != nil {
			fmt.Fprintf(std.Stdout, "first bad entry: %s\n", auditreport.TailLine(*res.Entry))
		}
	}
	if ce != nil {
		return 1
	}
	return 0
}

// auditExport writes one JSON line per request made since since.
func auditExport(ctx context.Context, log auditLog, w io.Writer, since time.Time, only map[string]bool) error {
	x := auditreport.NewExporter()
	if err := auditreport.ScanSince(ctx, log, since, func(e approval.Entry) error { x.Add(e); return nil }); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range x.Records(only) {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// auditStats prints decision statistics for entries since since.
func auditStats(ctx context.Context, log auditLog, w io.Writer, since, until time.Time, asJSON bool) error {
	s := auditreport.NewStatsBuilder()
	if err := auditreport.ScanSince(ctx, log, since, func(e approval.Entry) error { s.Add(e); return nil }); err != nil {
		return err
	}
	rep := s.Report(since, until)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return auditreport.WriteStats(w, rep)
}
