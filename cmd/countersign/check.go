package main

import (
	"fmt"
	"os"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// runCheck validates a policy/tools file: YAML, CEL rules, schemas and
// templates. Every error names the key path. Exit 0 valid, 1 invalid. A
// valid file is summarised one tool per line, so an operator can see at a
// glance who decides what.
func runCheck(args []string, std Stdio) int {
	path := os.Getenv("COUNTERSIGN_CONFIG")
	switch {
	case len(args) > 0 && isHelp(args[0]):
		fmt.Fprint(std.Stdout, checkUsage)
		return 0
	case len(args) > 1:
		fmt.Fprintf(std.Stderr, "countersign check: one file at a time, got %q\n\n%s", args, checkUsage)
		return 2
	case len(args) == 1:
		path = args[0]
	}
	if path == "" {
		fmt.Fprintln(std.Stderr, "countersign check: no file given (pass a path or set COUNTERSIGN_CONFIG)")
		return 2
	}
	f, err := policyfile.Load(path)
	if err != nil {
		fmt.Fprintf(std.Stderr, "%s: invalid\n%v\n", path, err)
		return 1
	}
	if _, err := approval.NewGate(f.Policy); err != nil {
		fmt.Fprintf(std.Stderr, "%s: invalid\n%v\n", path, err)
		return 1
	}
	fmt.Fprintf(std.Stdout, "%s: ok (version %d, %d tools, approvals channel %s)\n", path, f.Version, len(f.Tools), f.Slack.ApprovalsChannel)
	_ = f.WriteSummary(std.Stdout)
	return 0
}
