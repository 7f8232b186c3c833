package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSummarisesARealRun runs the real go test over testdata/fixture: a
// package that passes with skips, one that fails in a subtest, one whose
// test does not build, one whose test hangs until the timeout, one
// without tests.
func TestSummarisesARealRun(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	// -vet=off, as in the README's command: on a cold build cache go
	// test's vet would first analyse the fixture's standard library
	// imports, seconds of CPU at the end of a cold run. -timeout=1s ends
	// the hanging test; the others take microseconds.
	cmd := exec.Command(goBin, "test", "-json", "-vet=off", "-count=1", "-timeout=1s", "./...")
	cmd.Dir = filepath.Join("testdata", "fixture")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local")
	events, err := cmd.Output() // exits 1: the fixture fails on purpose
	if len(events) == 0 {
		t.Fatalf("go test -json in %s: %v (no output)", cmd.Dir, err)
	}

	var out strings.Builder
	if code := run(strings.NewReader(string(events)), &out); code != 1 {
		t.Errorf("run() = %d, want 1 (a test failed, a build failed)\n%s", code, out.String())
	}
	got := out.String()
	// Each package's line, as it finished (in any order), with what
	// failed right after it.
	for _, pkg := range [][]string{
		{"FAIL  fixture/broken (build failed)\n", `cannot use "not a number"`},
		{"-     fixture/empty (no test files)\n"},
		{"FAIL  fixture/fail (", ") 3 tests, 1 failed\n", "    fail_test.go:8: Sum() = 3, want 2\n"},
		{"FAIL  fixture/hang (", ") 2 tests, 1 failed\n", "panic: test timed out after 1s\n"},
		{"ok    fixture/pass (", ") 6 tests, 3 skipped\n"},
	} {
		inOrder(t, got, pkg...)
	}
	// Then what skipped and why, what failed, and the count.
	inOrder(t, got, "\n=== Skipped: 3 tests, and what each needs\n",
		"fixture/pass TestSkip\n    pass_test.go:7: needs a real thing: set THING_URL\n",
		"fixture/pass TestSub: 2 subtests\n    pass_test.go:11: needs a real Redis\n",
		"\n=== Failed (3)\nfixture/broken (build failed)\nfixture/fail TestFail/inner\nfixture/hang TestHangs (did not finish)\n",
		"\nDONE 11 tests, 3 skipped, 3 failed in ")
	if i := strings.Index(got, "=== Skipped"); i < strings.LastIndex(got, "fixture/pass (") {
		t.Errorf("the skips are listed before every package finished:\n%s", got)
	}
	if strings.Count(got, `cannot use "not a number"`) != 1 {
		t.Errorf("the build error is shown %d times, want once:\n%s", strings.Count(got, "cannot use"), got)
	}
}

// inOrder fails t unless got holds each of want, one after the other.
func inOrder(t *testing.T, got string, want ...string) {
	t.Helper()
	rest := got
	for n, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Errorf("summary lacks %q after %q; summary:\n%s", w, want[:n], got)
			return
		}
		rest = rest[i+len(w):]
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	const (
		start   = `{"Action":"start","Package":"p"}` + "\n"
		pass    = `{"Action":"pass","Package":"p","Test":"TestA"}` + "\n"
		pkgPass = `{"Action":"pass","Package":"p","Elapsed":0.5}` + "\n"
	)
	tests := []struct {
		name  string
		input string
		code  int
		says  string
	}{
		{"all passed", start + pass + pkgPass, 0, "DONE 1 test, 0 skipped, 0 failed"},
		{"nothing read", "", 1, "no test events read"},
		{"only go's own words", "go: no such flag -x\n", 1, "go: no such flag -x\n"},
		{"package never ended", start + pass, 1, "p (ended without a result)"},
		{"a build failed outside any package",
			`{"ImportPath":"q","Action":"build-output","Output":"q/x.go:1: bad\n"}` + "\n" +
				`{"ImportPath":"q","Action":"build-fail"}` + "\n" + start + pass + pkgPass,
			1, "BUILD FAILED q\nq/x.go:1: bad\n"},
		{"a panic is shown", start + `{"Action":"run","Package":"p","Test":"TestA"}` + "\n" +
			`{"Action":"output","Package":"p","Output":"panic: boom\n"}` + "\n" +
			`{"Action":"fail","Package":"p","Elapsed":0.1}` + "\n", 1, "panic: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			if code := run(strings.NewReader(tt.input), &out); code != tt.code {
				t.Errorf("run() = %d, want %d; output:\n%s", code, tt.code, out.String())
			}
			if !strings.Contains(out.String(), tt.says) {
				t.Errorf("output lacks %q:\n%s", tt.says, out.String())
			}
		})
	}
}
