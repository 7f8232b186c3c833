// Command testsum summarises `go test -json` for people: one line per
// package as it finishes, the output of every test that failed, then every
// test that skipped with its reason, and a count. It exits 1 when anything
// failed (a test, a build, a package that ended without a result) or when
// it read no test events at all, so it can end a pipe:
//
//	go test -vet=off -json ./... | go run ./cmd/testsum
//
// It is the README's test command instead of a test runner that must be
// built before the tests start: it needs only the standard library, so on
// a cold build cache it compiles in seconds beside the tests
// (docs/performance.md, "Test suite time"). Plain `go test ./...` prints
// only "ok" for a package whose tests skipped.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

// event is one line of `go test -json` (cmd/test2json), build events
// included.
type event struct {
	Action      string
	Package     string
	ImportPath  string // build-output, build-fail
	Test        string
	Time        time.Time
	Elapsed     float64 // seconds
	Output      string
	FailedBuild string
}

// test is one test's result and output.
type test struct {
	name       string
	action     string // pass, fail, skip; empty while running
	output     strings.Builder
	unfinished bool // still running when its package failed (a timeout's panic, a crash)
}

// pkg collects one package's events until it ends.
type pkg struct {
	name   string
	tests  map[string]*test
	order  []string        // test names in the order they started
	output strings.Builder // the package's own lines (panics, timeouts, "FAIL")
	done   bool
	failed bool // the package's own result was fail
	// failedBuild: the package's test binary did not build.
	failedBuild bool
}

func (p *pkg) test(name string) *test {
	t, ok := p.tests[name]
	if !ok {
		t = &test{name: name}
		p.tests[name] = t
		p.order = append(p.order, name)
	}
	return t
}

// summary is what the run found, in the order people read it.
type summary struct {
	pkgs      map[string]*pkg
	order     []string // packages in the order they started
	builds    map[string]*strings.Builder
	buildFail []string // import paths whose build failed
	events    int
	first     time.Time // of the events read
	last      time.Time
}

// run reads events from r, writes the summary to w and returns the exit
// code.
func run(r io.Reader, w io.Writer) int {
	s := &summary{pkgs: map[string]*pkg{}, builds: map[string]*strings.Builder{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line) // not an event: go test's own words
			continue
		}
		s.events++
		if !e.Time.IsZero() {
			if s.first.IsZero() {
				s.first = e.Time
			}
			s.last = e.Time
		}
		s.add(w, e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(w, "testsum: reading go test -json: %v\n", err)
		return 1
	}
	return s.report(w)
}

// add takes one event; a package's line is printed when it ends.
func (s *summary) add(w io.Writer, e event) {
	switch e.Action {
	case "build-output":
		b := s.builds[e.ImportPath]
		if b == nil {
			b = &strings.Builder{}
			s.builds[e.ImportPath] = b
		}
		b.WriteString(e.Output)
		return
	case "build-fail":
		s.buildFail = append(s.buildFail, e.ImportPath)
		return
	}
	if e.Package == "" {
		return
	}
	p, ok := s.pkgs[e.Package]
	if !ok {
		p = &pkg{name: e.Package, tests: map[string]*test{}}
		s.pkgs[e.Package] = p
		s.order = append(s.order, e.Package)
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			p.output.WriteString(e.Output)
		case "pass", "fail", "skip":
			p.done, p.failed = true, e.Action == "fail"
			if p.failed {
				for _, t := range p.tests {
					if t.action == "" { // its panic is in its output
						t.action, t.unfinished = "fail", true
					}
				}
			}
			s.packageLine(w, p, e)
		}
		return
	}
	t := p.test(e.Test)
	switch e.Action {
	case "output":
		t.output.WriteString(e.Output)
	case "pass", "fail", "skip":
		t.action = e.Action
	}
}

// packageLine prints a finished package: its status, time and counts, and
// the output of its failed tests (or its own, when it failed without one).
func (s *summary) packageLine(w io.Writer, p *pkg, e event) {
	n := p.count()
	switch {
	case e.FailedBuild != "":
		fmt.Fprintf(w, "FAIL  %s (build failed)\n", p.name)
		if b := s.builds[e.FailedBuild]; b != nil {
			fmt.Fprint(w, endLine(b.String()))
			delete(s.builds, e.FailedBuild) // shown
		}
		s.buildFail = slices.DeleteFunc(s.buildFail, func(path string) bool { return path == e.FailedBuild })
		p.failedBuild = true
	case e.Action == "fail":
		fmt.Fprintf(w, "FAIL  %s (%.1fs)%s\n", p.name, e.Elapsed, n.String())
		failed := false
		for _, name := range p.order {
			if p.failedLeaf(name) {
				fmt.Fprint(w, endLine(p.tests[name].output.String()))
				failed = true
			}
		}
		if !failed || strings.Contains(p.output.String(), "panic:") {
			fmt.Fprint(w, endLine(p.output.String()))
		}
	case strings.Contains(p.output.String(), "[no test files]"):
		fmt.Fprintf(w, "-     %s (no test files)\n", p.name)
	default:
		fmt.Fprintf(w, "ok    %s (%.1fs)%s\n", p.name, e.Elapsed, n.String())
	}
}

// failedLeaf reports whether the test name failed and none of its
// subtests did: its output is the one to show, not its parent's again.
func (p *pkg) failedLeaf(name string) bool {
	if p.tests[name].action != "fail" {
		return false
	}
	for _, other := range p.order {
		if strings.HasPrefix(other, name+"/") && p.tests[other].action == "fail" {
			return false
		}
	}
	return true
}

// counts of one package's (or the whole run's) tests.
type counts struct{ tests, skipped, failed int }

func (c counts) String() string {
	var parts []string
	parts = append(parts, plural(c.tests, "test"))
	if c.skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped", c.skipped))
	}
	if c.failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", c.failed))
	}
	return " " + strings.Join(parts, ", ")
}

func (p *pkg) count() counts {
	var c counts
	for name, t := range p.tests {
		c.tests++
		if t.action == "skip" {
			c.skipped++
		}
		if p.failedLeaf(name) {
			c.failed++
		}
	}
	return c
}

// report prints what skipped and why, what failed, and the count; it
// returns the exit code.
func (s *summary) report(w io.Writer) int {
	if s.events == 0 {
		fmt.Fprintln(w, "testsum: no test events read; run it as: go test -json ./... | go run ./cmd/testsum")
		return 1
	}
	var total counts
	var failed, unfinished []string
	var skipped []skip
	for _, name := range s.order {
		p := s.pkgs[name]
		c := p.count()
		total.tests += c.tests
		total.skipped += c.skipped
		total.failed += c.failed
		if !p.done {
			unfinished = append(unfinished, name)
		}
		switch {
		case p.failedBuild:
			failed = append(failed, name+" (build failed)")
		case p.failed && c.failed == 0: // a panic or timeout outside any test, a TestMain
			failed = append(failed, name+" (failed outside its tests: see its output above)")
		}
		for _, tn := range p.order {
			if p.tests[tn].action == "skip" {
				skipped = addSkip(skipped, name, tn, reason(p.tests[tn].output.String()))
			}
			if p.failedLeaf(tn) {
				note := ""
				if p.tests[tn].unfinished {
					note = " (did not finish)"
				}
				failed = append(failed, name+" "+tn+note)
			}
		}
	}
	for _, path := range s.buildFail { // not told as a package's
		failed = append(failed, path+" (build failed)")
		if b := s.builds[path]; b != nil {
			fmt.Fprintf(w, "\nBUILD FAILED %s\n%s", path, endLine(b.String()))
		}
	}
	for _, name := range unfinished {
		failed = append(failed, name+" (ended without a result)")
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "\n=== Skipped: %s, and what each needs\n", plural(total.skipped, "test"))
		for _, k := range skipped {
			fmt.Fprint(w, k)
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		fmt.Fprintf(w, "\n=== Failed (%d)\n", len(failed))
		for _, line := range failed {
			fmt.Fprintln(w, line)
		}
	}
	fmt.Fprintf(w, "\nDONE %s, %d skipped, %d failed in %.1fs\n", plural(total.tests, "test"),
		total.skipped, len(failed), s.last.Sub(s.first).Seconds())
	if len(failed) > 0 {
		return 1
	}
	return 0
}

// skip is one test that skipped, or several subtests of one test that
// skipped for the same reason.
type skip struct {
	pkg, test, why string
	subtests       int // 0: test is the one that skipped
}

func (k skip) String() string {
	head := k.pkg + " " + k.test
	if k.subtests > 0 {
		head += fmt.Sprintf(": %s", plural(k.subtests, "subtest"))
	}
	return head + "\n" + k.why
}

// addSkip adds a skipped test, folding it into the entry before when both
// are subtests of the same test that skipped for the same reason.
func addSkip(skips []skip, pkg, name, why string) []skip {
	parent, _, sub := strings.Cut(name, "/")
	if sub && len(skips) > 0 {
		last := &skips[len(skips)-1]
		if last.pkg == pkg && last.test == parent && last.why == why && last.subtests > 0 {
			last.subtests++
			return skips
		}
	}
	if sub {
		return append(skips, skip{pkg: pkg, test: parent, why: why, subtests: 1})
	}
	return append(skips, skip{pkg: pkg, test: name, why: why})
}

// reason is a skipped test's own words: its output without the framing
// lines go test adds (=== RUN, --- SKIP, === PAUSE, === CONT).
func reason(out string) string {
	var keep []string
	for line := range strings.Lines(out) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "=== ") || strings.HasPrefix(trimmed, "--- SKIP") || trimmed == "" {
			continue
		}
		keep = append(keep, strings.TrimRight(line, "\n"))
	}
	if len(keep) == 0 {
		return "(no reason given)\n"
	}
	return strings.Join(keep, "\n") + "\n"
}

// endLine ends s with a newline, so what follows starts on its own line.
func endLine(s string) string {
	if s != "" && !strings.HasSuffix(s, "\n") {
		return s + "\n"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
