package main

import (
	"fmt"
	"os"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// runCheck validates a policy/tools file: YAML, CEL rules, schemas and
// templates. Every error names the key path. Exit 0 valid, 1 invalid.
func runCheck(args []string, io stdio) int {
	path := os.Getenv("COUNTERSIGN_CONFIG")
	if len(args) > 0 {
		path = args[0]
	}
	if path == "" {
		fmt.Fprintln(io.Stderr, "countersign check: no file given (pass a path or set COUNTERSIGN_CONFIG)")
		return 2
	}
	f, err := policyfile.Load(path)
	if err != nil {
		fmt.Fprintf(io.Stderr, "%s: invalid\n%v\n", path, err)
		return 1
	}
	if _, err := approval.NewGate(f.Policy); err != nil {
		fmt.Fprintf(io.Stderr, "%s: invalid\n%v\n", path, err)
		return 1
	}
	fmt.Fprintf(io.Stdout, "%s: ok (version %d, %d tools, approvals channel %s)\n", path, f.Version, len(f.Tools), f.Slack.ApprovalsChannel)
	return 0
}
