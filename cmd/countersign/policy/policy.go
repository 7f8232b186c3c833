// Package policy is `countersign policy`: replay a candidate policy
// against the audit stream, or suggest rules from it. It loads the policy
// files and the stream and turns approval/replay's report into an exit
// code; the judging is approval/replay's.
package policy

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/cmd/countersign/config"
	"github.com/countersign/countersign/cmd/countersign/gctune"
)

const policyUsage = `usage: countersign policy <command> [flags]

commands:
  replay [--current FILE] [--since 30d] [--tool NAME] [--json] CANDIDATE.yaml
        judge every audited call again by CANDIDATE and by the policy in force
        (--current, default $COUNTERSIGN_CONFIG), through the same gate; per tool:
        auto / asked / denied now and with the candidate, approvals asked,
        people-minutes saved or added, pre-authorisations that would have run out;
        every regression (a call a person rejected, edited or marked wrong that
        the candidate runs without a person) is listed
  suggest [--current FILE] [--since 30d] [--min 20] [--json]
        approvals that were always the same (one tool, one requester, approved
        unedited, never marked wrong) and the narrowest rule letting them
        through, each replayed, as a YAML patch for the policy file; nothing
        is applied

Reads REDIS_URL and COUNTERSIGN_AUDIT_STREAM (or COUNTERSIGN_REDIS_PREFIX) as
` + "`countersign audit`" + ` does. --since takes a Go duration or days: 90m, 24h, 30d.
Exit status: 0 no regression (suggest: done), 1 a regression, 2 the command
could not run (bad flags, a policy that does not parse, an empty or trimmed
audit stream, Redis unreachable). See docs/tuning.md.
`

// Run runs `countersign policy <command>` (args without "policy") and
// returns the exit code.
func Run(ctx context.Context, args []string, std config.Stdio) int {
	if len(args) == 0 {
		fmt.Fprint(std.Stderr, policyUsage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(std.Stdout, policyUsage)
		return 0
	case "replay", "suggest":
	default:
		fmt.Fprintf(std.Stderr, "countersign policy: unknown command %q\n\n%s", cmd, policyUsage)
		return 2
	}
	fs := flag.NewFlagSet("policy "+cmd, flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() {} // help goes to stdout, a bad flag's usage to stderr (below)
	var current, since, tool string
	var asJSON bool
	var minN int
	fs.StringVar(&current, "current", "", "the policy in force (default $COUNTERSIGN_CONFIG)")
	fs.StringVar(&since, "since", "30d", "calls made within this long ago (e.g. 24h, 30d)")
	fs.BoolVar(&asJSON, "json", false, "machine-readable output")
	if cmd == "replay" {
		fs.StringVar(&tool, "tool", "", "replay one tool's calls only")
	} else {
		fs.IntVar(&minN, "min", 20, "the fewest identical approvals that make a suggestion")
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(std.Stdout, policyUsage)
			return 0
		}
		fmt.Fprint(std.Stderr, "\n"+policyUsage)
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(std.Stderr, "countersign policy %s: %s\n", cmd, fmt.Sprintf(format, a...))
		return 2
	}
	switch {
	case cmd == "replay" && fs.NArg() != 1:
		return fail("one candidate policy file, got %d arguments\n\n%s", fs.NArg(), policyUsage)
	case cmd == "suggest" && fs.NArg() != 0:
		return fail("unexpected arguments %q", fs.Args())
	case cmd == "suggest" && minN < 2:
		return fail("--min %d: at least 2", minN)
	}
	window, err := auditreport.ParseSince(since)
	if err != nil {
		return fail("--since: %v", err)
	}
	cfg, err := config.Load()
	if err != nil {
		return fail("%v", err)
	}
	current = cmp.Or(current, cfg.ConfigFile)
	if current == "" {
		return fail("no policy in force: pass --current FILE or set COUNTERSIGN_CONFIG")
	}
	cur, err := loadPolicy(current)
	if err != nil {
		return fail("the policy in force %s does not load:\n%v", current, err)
	}
	cand := cur
	if cmd == "replay" {
		if cand, err = loadPolicy(fs.Arg(0)); err != nil {
			return fail("the candidate %s does not load:\n%v", fs.Arg(0), err)
		}
	}
	log, where, closeLog, err := cfg.OpenAudit()
	if err != nil {
		return fail("%v", err)
	}
	defer closeLog()
	// A replay allocates ~10 KB a call over a live heap of ~25 MB: the
	// collector of serve (GOGC 400) cuts its CPU by a third.
	gctune.Apply(os.Getenv)

	now := time.Now()
	opts := replay.Options{Current: cur, Candidate: cand, Since: now.Add(-window), Tool: tool}
	if cmd == "suggest" {
		sugs, err := replay.Suggest(ctx, log, replay.SuggestOptions{Current: cur, Since: opts.Since, Min: minN})
		if err != nil {
			return fail("%v", streamError(err, where))
		}
		if asJSON {
			err = replay.WriteSuggestionsJSON(std.Stdout, sugs)
		} else {
			err = replay.WriteSuggestions(std.Stdout, sugs, current)
		}
		if err != nil {
			return fail("%v", err)
		}
		return 0
	}
	rep, err := replay.Run(ctx, log, opts)
	if err != nil {
		return fail("%v", streamError(err, where))
	}
	if asJSON {
		err = replay.WriteJSON(std.Stdout, rep)
	} else {
		err = replay.Write(std.Stdout, rep)
	}
	if err != nil {
		return fail("%v", err)
	}
	if len(rep.Regressions) > 0 {
		return 1
	}
	return 0
}

// loadPolicy reads a policy file as replay judges with it: the policy and
// its argument schemas; its gate must compile (as countersign check asks).
func loadPolicy(path string) (replay.Policy, error) {
	f, err := policyfile.Load(path)
	if err != nil {
		return replay.Policy{}, err
	}
	if _, err := replay.NewJudge(replay.Policy{Policy: f.Policy}); err != nil {
		return replay.Policy{}, err
	}
	return replay.Policy{Policy: f.Policy, Schemas: f}, nil
}

// streamError says where an empty stream was looked for.
func streamError(err error, where string) error {
	if errors.Is(err, replay.ErrEmpty) {
		return fmt.Errorf("the audit stream %s is empty or missing: nothing was recorded there yet, "+
			"or REDIS_URL / COUNTERSIGN_REDIS_PREFIX / COUNTERSIGN_AUDIT_STREAM are not those of the process that writes it", where)
	}
	return err
}
