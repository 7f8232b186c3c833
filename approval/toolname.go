package approval

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Refusals of a tool's name (Lifecycle.Propose): a call is judged by the
// rule of the tool the policy names, never by a look-alike's.
var (
	// ErrInvalidToolName: the name is not 1 to 64 of A-Z a-z 0-9 _ . -
	// (MCP's rule for tool names): no spaces, no emoji, no letters of
	// other scripts that could pass for Latin ones.
	ErrInvalidToolName = errors.New("approval: invalid tool name")
	// ErrConfusableTool: the name is not a declared tool's but reads like
	// one (case, separators, look-alike characters); the error names the
	// declared tool.
	ErrConfusableTool = errors.New("approval: tool name confusable with a declared tool")
)

// toolNameRe is MCP's rule for a tool's name.
var toolNameRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// CheckToolName refuses a tool name a caller may not use: one outside
// MCP's charset (ErrInvalidToolName), or one that is not in declared but
// whose skeleton (ToolSkeleton) is a declared tool's (ErrConfusableTool,
// wrapped with a message naming that tool). A declared name is always
// accepted.
func CheckToolName(name string, declared []string) error {
	if !toolNameRe.MatchString(name) {
		return fmt.Errorf("tool name %q: %w: a tool name is 1 to 64 of the characters A-Z a-z 0-9 _ . -", name, ErrInvalidToolName)
	}
	skel := ToolSkeleton(name)
	for _, d := range declared {
		if d == name {
			return nil
		}
	}
	for _, d := range declared {
		if ToolSkeleton(d) == skel {
			return fmt.Errorf("tool name %q looks like the declared tool %q but is not it: %w", name, d, ErrConfusableTool)
		}
	}
	return nil
}

// skeletonPairs map runs of ASCII characters to the one they pass for, in
// order, after case folding and without separators.
var skeletonPairs = strings.NewReplacer(
	"rn", "m", "vv", "w",
	"0", "o", "1", "l", "i", "l", "5", "s",
)

// ToolSkeleton is what a tool's name looks like to a reader: lower case,
// without the separators _ - and ., with ASCII look-alikes made one (0 as
// o; 1, i as l; 5 as s; rn as m; vv as w). Two names with the same
// skeleton are confusable. Non-ASCII names never get this far
// (CheckToolName refuses them first).
func ToolSkeleton(name string) string {
	s := strings.ToLower(name)
	s = strings.Map(func(r rune) rune {
		switch r {
		case '_', '-', '.':
			return -1
		}
		return r
	}, s)
	return skeletonPairs.Replace(s)
}
