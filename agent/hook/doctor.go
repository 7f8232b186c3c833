package hook

// This file: `countersign hook claude-code doctor`, which checks the
// installation the hook serves — the claude CLI's version, the hooks in
// its settings files, their timeouts against the policy's — and says
// exactly what to change.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MinVersion is the first Claude Code that honours "onFailure": "block"
// on command and http hooks (2.1.295: checked with the real CLIs of npm,
// 2.1.294 ran a Bash call whose hook it had killed at its timeout under
// bypassPermissions, 2.1.295 refused it). An older CLI ignores the field:
// a hook it kills, or one that crashes, lets the call run.
const MinVersion = "2.1.295"

// DefaultSettingsTimeout is Claude Code's timeout of a hook that sets
// none (seconds).
const DefaultSettingsTimeout = 600

// SettingsFile is one settings file Claude Code reads.
type SettingsFile struct {
	// Path names it in the report.
	Path string
	// Data is its content.
	Data []byte
	// Interactive is true for the files interactive sessions load (the
	// user's, the project's, the local ones), false for a file given
	// with --settings (a claude -p run's).
	Interactive bool
}

// PolicyWait is a tool's deadline in the policy (its timeout, or the
// external rule's for "*").
type PolicyWait struct {
	Tool    string
	Timeout time.Duration
}

// DoctorOptions are what the doctor checks.
type DoctorOptions struct {
	// Version runs `claude --version`.
	Version func(ctx context.Context) (string, error)
	// Settings are the settings files found; none is a finding.
	Settings []SettingsFile
	// Waits are the policy's deadlines of the tools a person reviews;
	// nil when no policy was given (the check is skipped, saying so).
	Waits []PolicyWait
	// Self asks the server which key the API key is (nil: not checked).
	Self func(ctx context.Context) (name string, tools []string, err error)
}

// Finding is one thing the doctor checked.
type Finding struct {
	OK bool
	// Text says what was found and, when not OK, exactly what to change.
	Text string
}

// Doctor checks the installation and returns what it found, problems
// first in the order they were found.
func Doctor(ctx context.Context, o DoctorOptions) []Finding {
	var out []Finding
	ok := func(format string, args ...any) { out = append(out, Finding{true, fmt.Sprintf(format, args...)}) }
	fix := func(format string, args ...any) { out = append(out, Finding{false, fmt.Sprintf(format, args...)}) }

	v, err := o.Version(ctx)
	switch {
	case err != nil:
		fix("claude --version: %v. Put Claude Code on PATH (or name it with --claude): npm install -g @anthropic-ai/claude-code@latest (it needs Node 22; on Node 20 npm installs 2.1.197, which ignores onFailure)", err)
	default:
		got, perr := parseVersion(v)
		switch {
		case perr != nil:
			fix("claude --version said %q: %v; Countersign needs Claude Code %s or later", strings.TrimSpace(v), perr, MinVersion)
		case compareVersions(got, MinVersion) < 0:
			fix("Claude Code %s is older than %s: it ignores \"onFailure\": \"block\", so a hook it kills at its timeout (or that crashes) lets the call run — under bypassPermissions it runs unapproved. Update it: npm install -g @anthropic-ai/claude-code@latest with Node 22 (on Node 20 npm resolves 2.1.197; pin a version, e.g. @anthropic-ai/claude-code@2.1.332)", got, MinVersion)
		default:
			ok("Claude Code %s (%s or later: \"onFailure\": \"block\" is honoured)", got, MinVersion)
		}
	}

	var hooks []foundHook
	for _, f := range o.Settings {
		hs, err := findHooks(f)
		if err != nil {
			fix("%s: %v: fix the JSON (Claude Code reads nothing from a settings file it cannot parse)", f.Path, err)
			continue
		}
		hooks = append(hooks, hs...)
	}
	if len(hooks) == 0 {
		var paths []string
		for _, f := range o.Settings {
			paths = append(paths, f.Path)
		}
		fix("no PreToolUse hook runs countersign hook claude-code (or posts to %s) in %s: add the hook of docs/claude-code.md section 2", PathHTTP, orNothing(paths))
	}
	var longest PolicyWait
	for _, w := range o.Waits {
		if w.Timeout > longest.Timeout {
			longest = w
		}
	}
	for _, h := range hooks {
		where := h.file + ": " + h.what
		if h.problem != "" {
			fix("%s: %s", where, h.problem)
			continue
		}
		if h.onFailure == "block" {
			ok("%s has \"onFailure\": \"block\"", where)
		} else {
			fix("%s: \"onFailure\" is %q: set \"onFailure\": \"block\" on it, or Claude Code lets the call run when it kills the hook at its timeout", where, h.onFailure)
		}
		kill := time.Duration(h.timeout) * time.Second
		if kill > h.wait {
			ok("%s: Claude Code's timeout (%s) is above the hook's wait (%s)", where, kill, h.wait)
		} else {
			fix("%s: Claude Code's \"timeout\" (%s%s) is not above the hook's wait (%s): set \"timeout\": %d, or Claude Code stops the hook before it answers", where, kill, h.timeoutNote, h.wait, int((h.wait+time.Minute)/time.Second))
		}
		switch {
		case o.Waits == nil:
			fix("%s: the policy's timeouts were not checked (no policy read: pass --policy FILE): each reviewed tool's timeout (and external.timeout) must be below the hook's wait (%s)", where, h.wait)
		case len(o.Waits) == 0:
			ok("%s: the policy reviews no tool", where)
		case longest.Timeout < h.wait:
			ok("%s: the policy's longest deadline (%s, %s) is below the hook's wait (%s)", where, longest.Timeout, longest.Tool, h.wait)
		default:
			var late []string
			for _, w := range o.Waits {
				if w.Timeout >= h.wait {
					late = append(late, fmt.Sprintf("%s %s", w.Tool, w.Timeout))
				}
			}
			sort.Strings(late)
			fix("%s: the policy's deadlines are not all below the hook's wait (%s): %s. Set `timeout:` below %s on those tools (external.timeout for \"*\"), or the hook gives up first and withdraws the request", where, h.wait, strings.Join(late, ", "), h.wait)
		}
		if h.deferred && h.interactive {
			fix("%s: --defer in a settings file interactive sessions load: Claude Code ignores \"defer\" outside claude -p and goes on to its own permission handling. Put --defer only in a file given to claude -p --settings FILE", where)
		}
	}
	if o.Self != nil {
		name, tools, err := o.Self(ctx)
		if err != nil {
			fix("the API key: %v", err)
		} else {
			ok("the API key is %s (tools %s)", name, strings.Join(tools, ", "))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return !out[i].OK && out[j].OK })
	return out
}

// WriteFindings writes the findings, one a line, and reports whether
// every one was OK.
func WriteFindings(w io.Writer, fs []Finding) bool {
	all := true
	for _, f := range fs {
		mark := "ok "
		if !f.OK {
			mark, all = "FIX", false
		}
		fmt.Fprintf(w, "%s %s\n", mark, f.Text)
	}
	return all
}

// foundHook is one hook entry that runs Countersign.
type foundHook struct {
	file, what  string
	interactive bool
	onFailure   string
	timeout     int // seconds
	timeoutNote string
	wait        time.Duration // the hook's --timeout or ?timeout=
	deferred    bool
	problem     string // the entry cannot be read
}

var timeoutFlag = regexp.MustCompile(`--timeout[= ](\S+)`)

// findHooks reads the PreToolUse entries of f that run Countersign.
func findHooks(f SettingsFile) ([]foundHook, error) {
	var s struct {
		Hooks map[string][]struct {
			Matcher string `json:"matcher"`
			Hooks   []struct {
				Type      string          `json:"type"`
				Command   string          `json:"command"`
				Args      []string        `json:"args"`
				URL       string          `json:"url"`
				Timeout   json.RawMessage `json:"timeout"`
				OnFailure string          `json:"onFailure"`
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(f.Data, &s); err != nil {
		return nil, err
	}
	var out []foundHook
	for i, m := range s.Hooks["PreToolUse"] {
		for j, h := range m.Hooks {
			line := h.Command + " " + strings.Join(h.Args, " ")
			fh := foundHook{file: f.Path, interactive: f.Interactive, onFailure: h.OnFailure, timeout: DefaultSettingsTimeout,
				timeoutNote: ", the default", wait: DefaultTimeout}
			switch {
			case h.Type == "command" && strings.Contains(line, "hook claude-code") && !strings.Contains(line, "doctor"):
				fh.what = fmt.Sprintf("hooks.PreToolUse[%d].hooks[%d] (command %q)", i, j, strings.TrimSpace(line))
				if tm := timeoutFlag.FindStringSubmatch(line); tm != nil {
					d, err := time.ParseDuration(tm[1])
					if err != nil {
						fh.problem = fmt.Sprintf("--timeout %q is not a duration such as 9m", tm[1])
					}
					fh.wait = d
				}
				fh.deferred = strings.Contains(line, "--defer")
			case h.Type == "http" && strings.Contains(h.URL, PathHTTP):
				fh.what = fmt.Sprintf("hooks.PreToolUse[%d].hooks[%d] (http %s)", i, j, h.URL)
				u, err := url.Parse(h.URL)
				if err != nil {
					fh.problem = fmt.Sprintf("url %q: %v", h.URL, err)
					break
				}
				if q := u.Query().Get("timeout"); q != "" {
					d, err := time.ParseDuration(q)
					if err != nil {
						fh.problem = fmt.Sprintf("the url's timeout=%q is not a duration such as 9m", q)
					}
					fh.wait = d
				}
			default:
				continue
			}
			if len(h.Timeout) > 0 {
				n, err := strconv.ParseFloat(string(h.Timeout), 64)
				if err != nil || n <= 0 {
					fh.problem = fmt.Sprintf("\"timeout\" is %s, not a number of seconds", h.Timeout)
				}
				fh.timeout, fh.timeoutNote = int(n), ""
			}
			out = append(out, fh)
		}
	}
	return out, nil
}

// parseVersion reads `claude --version`'s "2.1.332 (Claude Code)".
func parseVersion(s string) (string, error) {
	v, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	if _, err := versionParts(v); err != nil {
		return "", err
	}
	return v, nil
}

func versionParts(v string) ([3]int, error) {
	var p [3]int
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return p, fmt.Errorf("%q is not a version such as %s", v, MinVersion)
	}
	for i, s := range parts {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return p, fmt.Errorf("%q is not a version such as %s", v, MinVersion)
		}
		p[i] = n
	}
	return p, nil
}

// compareVersions compares two versions a.b.c (both valid).
func compareVersions(a, b string) int {
	pa, _ := versionParts(a)
	pb, _ := versionParts(b)
	for i := range pa {
		if pa[i] != pb[i] {
			if pa[i] < pb[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func orNothing(paths []string) string {
	if len(paths) == 0 {
		return "no settings file (none was found)"
	}
	return strings.Join(paths, ", ")
}
