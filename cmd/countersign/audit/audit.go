// Package audit is `countersign audit`: it reads the flags of each
// command into an auditreport.Command (tail, show, verify, export, stats)
// and turns its outcome into an exit code, and it runs `audit checkpoint`
// and `audit keygen`. What the commands print is approval/auditreport's.
package audit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/store"
)

// The CLI names people through the bot's lookup.
var _ auditreport.Names = (*bot.Names)(nil)

const auditUsage = `usage: countersign audit <command> [flags]

commands:
  tail [-n 20] [-f] [--json] [--ids]     the last entries, one line each; -f follows new ones
  show [--json] [--ids] <request-id>     the whole story of one request
  verify [--json] [--ids]                check the hash chain (exit 0 intact, 1 broken)
  verify --pubkey <file|base64> --checkpoints <file> [--checkpoints <file>...] [--json] [--ids]
                                         prove every entry up to the last signed checkpoint
                                         (exit 0 proven, 1 rewritten, cut, trimmed, bad checkpoint,
                                         or entries older than the interval + 30 s not covered)
  checkpoint [--next-key <file|base64>]  sign and publish a checkpoint now (with --next-key:
                                         hand the chain over to that key, a rotation)
  keygen --out <file>                    make an audit signing key (private key to the file,
                                         public key on stdout)
  export [--since 24h] [--only rejected,edited,marked_wrong]
                                         requests as JSON Lines, for evals
  stats [--since 7d] [--json] [--ids]    decisions per tool and per approver

Reads REDIS_URL and COUNTERSIGN_AUDIT_STREAM; verify with checkpoints also
COUNTERSIGN_AUDIT_CHECKPOINT_INTERVAL; checkpoint also the
COUNTERSIGN_AUDIT_SIGNING_KEY*, COUNTERSIGN_AUDIT_PREVIOUS_PUBLIC_KEY and
COUNTERSIGN_AUDIT_WITNESS_* variables. People and channels are printed by name
when SLACK_BOT_TOKEN is set (Slack's users.info and conversations.info at
SLACK_API_URL, as the audit view shows them; an id Slack cannot name stays an
id); --ids prints the Slack ids as recorded, for scripts (--json and export
always do). --since
takes a Go duration or days: 90m, 24h, 7d, 1d12h. Exit status 2 means the command could not run
(bad flags, Redis unreachable). See docs/operations.md.
`

var _ auditreport.Log = (*store.Audit)(nil)

// Run runs `countersign audit <command>` (args without "audit") and
// returns the exit code.
func Run(ctx context.Context, args []string, std config.Stdio) int {
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
	case "checkpoint":
		return runAuditCheckpoint(ctx, rest, std)
	case "keygen":
		return runAuditKeygen(rest, std)
	default:
		fmt.Fprintf(std.Stderr, "countersign audit: unknown command %q\n\n%s", cmd, auditUsage)
		return 2
	}
	c := auditreport.Command{Name: cmd}
	fs := flag.NewFlagSet("audit "+cmd, flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.BoolVar(&c.JSON, "json", false, "machine-readable output")
	var since, only, pubkey string
	var checkpoints []string
	var ids bool
	if cmd != "export" {
		fs.BoolVar(&ids, "ids", false, "print Slack user ids as recorded instead of names (for scripts)")
	}
	switch cmd {
	case "verify":
		fs.StringVar(&pubkey, "pubkey", "", "the audit signing key's public key (a file holding it, or base64): prove the stream against signed checkpoints")
		fs.Func("checkpoints", "a file of checkpoints (the file witness's); repeat for several witnesses", func(v string) error {
			checkpoints = append(checkpoints, v)
			return nil
		})
	case "tail":
		fs.IntVar(&c.N, "n", 20, "how many of the latest entries to print")
		fs.BoolVar(&c.Follow, "f", false, "keep printing new entries until interrupted")
	case "export":
		fs.StringVar(&since, "since", "24h", "requests made within this long ago (e.g. 24h, 7d)")
		fs.StringVar(&only, "only", "", "comma-separated outcomes to keep: approved, edited, rejected, responded, expired, cancelled, pending, run_now, window_elapsed, sampled, or marked_wrong (marked wrong whatever the outcome)")
	case "stats":
		fs.StringVar(&since, "since", "7d", "decisions within this long ago (e.g. 24h, 7d)")
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var err error
	if cmd == "export" || cmd == "stats" {
		if c.Since, err = auditreport.ParseSince(since); err != nil {
			fmt.Fprintf(std.Stderr, "countersign audit %s: --since: %v\n", cmd, err)
			return 2
		}
	}
	if c.Only, err = auditreport.ParseOnly(only); err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit export: %v\n", err)
		return 2
	}
	switch {
	case cmd == "show" && fs.NArg() != 1:
		fmt.Fprintln(std.Stderr, "usage: countersign audit show [--json] <request-id>")
		return 2
	case cmd != "show" && fs.NArg() > 0:
		fmt.Fprintf(std.Stderr, "countersign audit %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}
	c.RequestID = fs.Arg(0)
	if pubkey != "" || len(checkpoints) > 0 {
		if c.PubKey, c.Checkpoints, err = readCheckpoints(pubkey, checkpoints); err != nil {
			fmt.Fprintf(std.Stderr, "countersign audit verify: %v\n", err)
			return 2
		}
	}

	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit: %v\n", err)
		return 2
	}
	log, where, closeLog, err := cfg.OpenAudit()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign audit: %v\n", err)
		return 2
	}
	defer closeLog()
	if !ids && cfg.SlackBotToken != "" {
		// Names as the audit view shows them: users.info and
		// conversations.info, cached for the command's run; an id Slack
		// cannot name is printed as the id.
		c.Names = bot.NewNames(bot.NewClient(bot.ClientOptions{APIURL: cfg.SlackAPIURL, BotToken: cfg.SlackBotToken}), nil, nil)
	}
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

	c.Stream = log.Stream()
	// Entries older than this that no checkpoint covers are not proven:
	// checkpoints follow within the interval the deployment runs with.
	c.Bound = approval.CheckpointBound(cfg.AuditCheckpointInterval)
	ok, err := c.Run(ctx, log, std.Stdout, time.Now())
	switch {
	case errors.Is(err, context.Canceled) && cmd == "tail":
		return 0 // Ctrl-C ends tail -f
	case err != nil:
		fmt.Fprintf(std.Stderr, "countersign audit %s: %v\n", cmd, err)
		return 2
	case !ok && cmd == "show":
		fmt.Fprintf(std.Stderr, "countersign audit show: no entries for request %q\n", c.RequestID)
		return 1
	case !ok:
		return 1 // verify: the chain is broken (or not proven by the checkpoints)
	}
	return 0
}
