// Package check is `countersign check`: it validates a policy/tools file
// (policyfile.Load and the gate it compiles) and, with --slack, looks the
// file's Slack ids and names up in the workspace (bot.CheckSlack).
package check

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/config"
)

const usage = `usage: countersign check [--slack] [file]

Validates a policy/tools file (default $COUNTERSIGN_CONFIG): YAML, CEL
rules (each read against its tool's schema), schemas, templates, and that
Slack ids are ids (U…/W… users, S… user groups, C…/G… channels), not names.
Every problem names its key and line, and says how to find an id. Exit 0
valid (a one-line-per-tool summary follows), 1 invalid, 2 no file.

  --slack   also look the file's Slack ids and names up in the workspace
            with SLACK_BOT_TOKEN (and SLACK_API_URL): a name (@sre, #ops,
            alice) gets the id to write in its place; an id Slack does not
            know, or a channel the bot is not in, is reported. Exit 1 when
            anything must change, 2 when Slack could not be asked (a bad
            token, a scope the app lacks).
`

// Run is `countersign check` (args without "check"): it validates a
// policy/tools file: YAML, CEL rules, schemas, templates and the shape of
// its Slack ids. Every error names the key
// path. Exit 0 valid, 1 invalid. A valid file is summarised one tool per
// line, so an operator can see at a glance who decides what. With --slack
// the file's Slack ids and names are looked up with the bot token
// (bot.CheckSlack): a name gets the id to write, an id is checked to exist.
func Run(ctx context.Context, args []string, std config.Stdio) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(std.Stderr)
	fs.Usage = func() { fmt.Fprint(std.Stderr, usage) }
	withSlack := fs.Bool("slack", false, "look the file's Slack ids and names up in the workspace (SLACK_BOT_TOKEN, SLACK_API_URL)")
	if len(args) > 0 && config.IsHelp(args[0]) {
		fmt.Fprint(std.Stdout, usage)
		return 0
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) > 1 { // flags after the file: check policy.yaml --slack
		if err := fs.Parse(rest[1:]); err != nil {
			return 2
		}
		rest = append(rest[:1:1], fs.Args()...)
	}
	path := os.Getenv("COUNTERSIGN_CONFIG")
	switch {
	case len(rest) > 1:
		fmt.Fprintf(std.Stderr, "countersign check: one file at a time, got %q\n\n%s", rest, usage)
		return 2
	case len(rest) == 1:
		path = rest[0]
	}
	if path == "" {
		fmt.Fprintln(std.Stderr, "countersign check: no file given (pass a path or set COUNTERSIGN_CONFIG)")
		return 2
	}
	code := 0
	f, err := policyfile.Load(path)
	if err == nil {
		_, err = approval.NewGate(f.Policy)
	}
	if err != nil {
		fmt.Fprintf(std.Stderr, "%s: invalid\n%v\n", path, err)
		if !*withSlack || !errors.Is(err, policyfile.ErrInvalid) {
			return 1
		}
		code = 1 // and still say which ids the names are
	} else {
		fmt.Fprintf(std.Stdout, "%s: ok (version %d, %d tools, approvals channel %s)\n", path, f.Version, len(f.Tools), f.Slack.ApprovalsChannel)
		_ = f.WriteSummary(std.Stdout)
	}
	if *withSlack {
		code = max(code, checkSlack(ctx, path, std))
	}
	return code
}

// checkSlack is check --slack: every Slack id and name the file at path
// gives, as the workspace of SLACK_BOT_TOKEN knows it, one line each. 0
// when all work as written, 1 when one does not, 2 when Slack could not
// be asked.
func checkSlack(ctx context.Context, path string, std config.Stdio) int {
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign check --slack: %v\n", err)
		return 2
	}
	switch {
	case cfg.SlackBotToken == "":
		fmt.Fprintln(std.Stderr, "countersign check --slack: SLACK_BOT_TOKEN is not set: the names are looked up with the bot token (xoxb-...)")
		return 2
	case !strings.HasPrefix(cfg.SlackBotToken, "xoxb-"):
		fmt.Fprintln(std.Stderr, "countersign check --slack: SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
		return 2
	}
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign check --slack: %v\n", err)
		return 2
	}
	refs, err := policyfile.SlackRefs(data)
	if err != nil {
		return 1 // not YAML: reported above
	}
	found, err := bot.CheckSlack(ctx, bot.NewClient(bot.ClientOptions{APIURL: cfg.SlackAPIURL, BotToken: cfg.SlackBotToken}), refs)
	if err != nil {
		fmt.Fprintf(std.Stderr, "countersign check --slack: %v\n", err)
		return 2
	}
	fmt.Fprintf(std.Stdout, "\nSlack ids and names, as the workspace of SLACK_BOT_TOKEN knows them:\n")
	ok, err := bot.WriteSlackFindings(std.Stdout, found)
	if err != nil || !ok {
		return 1
	}
	return 0
}
