package policyfile

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is wrapped by every error Parse and Load return for a file
// that was read but is not a valid policy (bad YAML, unknown keys, bad
// values).
var ErrInvalid = errors.New("policyfile: invalid policy file")

// Error is one problem in a policy file, located by key path and line.
type Error struct {
	// File is the file name (set by Load), empty for Parse.
	File string
	// Path is the key path, e.g. "tools[2].review.when"; empty for a
	// problem with the document as a whole (such as a YAML syntax error).
	Path string
	// Line is the 1-based line in the file, 0 when unknown.
	Line    int
	Message string
}

// Error formats e as "path: message (line N)", or compiler style
// "file:N: path: message" when the file name is known.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	if e.File == "" && e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	return b.String()
}

// ErrorList is every problem found in a policy file, in file order. Its
// Error is one problem per line.
type ErrorList []*Error

func (l ErrorList) Error() string {
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (l ErrorList) Unwrap() error { return ErrInvalid }
