package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

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

var _ auditreport.Log = (*store.Audit)(nil)

// runAudit runs `countersign audit <command>`.
func runAudit(ctx context.Context, args []string, std Stdio) int {
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
		switch empty, err := auditreport.Empty(ctx, log); {
		case err != nil:
			fmt.Fprintf(std.Stderr, "countersign audit %s: %v\n", cmd, err)
			return 2
		case empty:
			fmt.Fprintf(std.Stderr, "countersign audit: the audit stream %s is empty or missing: nothing was recorded there yet, "+
				"or REDIS_URL / COUNTERSIGN_REDIS_PREFIX / COUNTERSIGN_AUDIT_STREAM are not those of the process that writes it "+
				"(countersign demo prints its command)\n", where)
		}
	}

	now := time.Now()
	switch cmd {
	case "tail":
		err = auditreport.Tail(ctx, log, std.Stdout, *n, *follow, *asJSON)
	case "show":
		var found bool
		found, err = auditreport.Show(ctx, log, std.Stdout, fs.Arg(0), *asJSON)
		if err == nil && !found {
			fmt.Fprintf(std.Stderr, "countersign audit show: no entries for request %q\n", fs.Arg(0))
			return 1
		}
	case "verify":
		var intact bool
		intact, err = auditreport.Verify(ctx, log, std.Stdout, *asJSON)
		if err == nil && !intact {
			return 1 // broken
		}
	case "export":
		err = auditreport.Export(ctx, log, std.Stdout, now.Add(-window), onlySet)
	case "stats":
		err = auditreport.Stats(ctx, log, std.Stdout, now.Add(-window), now, *asJSON)
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
