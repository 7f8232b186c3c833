package main_test

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// moduleRoot is where the Dockerfile's build context starts (WORKDIR /src).
const moduleRoot = "../.."

// dockerfile is what the tests need of the Dockerfile.
type dockerfile struct {
	from       []string
	buildEnv   []string // VAR=value before `go build`
	buildArgs  []string // go build's arguments, output path included
	user       string
	expose     string
	entrypoint string
	cmd        string
}

// parseDockerfile reads the FROM, USER, EXPOSE, ENTRYPOINT, CMD lines and
// the one RUN line that calls `go build`.
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	builds := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			d.from = append(d.from, rest)
		case "USER":
			d.user = rest
		case "EXPOSE":
			d.expose = rest
		case "ENTRYPOINT":
			d.entrypoint = rest
		case "CMD":
			d.cmd = rest
		case "RUN":
			words, err := shellWords(rest)
			if err != nil {
				t.Fatalf("Dockerfile RUN %q: %v", rest, err)
			}
			i := slices.Index(words, "go")
			if i < 0 || i+1 >= len(words) || words[i+1] != "build" {
				continue
			}
			builds++
			d.buildEnv, d.buildArgs = words[:i], words[i+2:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if builds != 1 {
		t.Fatalf("Dockerfile has %d RUN lines with go build, want 1", builds)
	}
	return d
}

// shellWords splits a simple POSIX shell command line: whitespace, single
// and double quotes, backslash escapes. Anything fancier is refused.
func shellWords(s string) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool
		quote   rune
		escaped bool
	)
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quote != '\'':
			escaped, inWord = true, true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.ContainsRune("|&;<>()$`*?", r):
			return nil, fmt.Errorf("shell syntax %q not supported", r)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unterminated quote or escape")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

func TestBuildDockerfileShape(t *testing.T) {
	t.Parallel()
	d := parseDockerfile(t, filepath.Join(moduleRoot, "Dockerfile"))
	if len(d.from) != 2 || !strings.HasPrefix(d.from[0], "golang:1.26 ") || d.from[1] != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("FROM lines = %q, want golang:1.26 AS build, then gcr.io/distroless/static-debian12:nonroot", d.from)
	}
	if d.user != "nonroot" || d.expose != "8080" || d.entrypoint != `["/countersign"]` || d.cmd != `["serve"]` {
		t.Errorf("USER %q EXPOSE %q ENTRYPOINT %q CMD %q", d.user, d.expose, d.entrypoint, d.cmd)
	}
	wantEnv := []string{"CGO_ENABLED=0"}
	wantArgs := []string{"-trimpath", "-ldflags=-s -w", "-o", "/out/countersign", "./cmd/countersign"}
	if !slices.Equal(d.buildEnv, wantEnv) || !slices.Equal(d.buildArgs, wantArgs) {
		t.Errorf("Dockerfile go build: env %q args %q, want %q %q", d.buildEnv, d.buildArgs, wantEnv, wantArgs)
	}

	// CI builds with the same flags (only the output path differs).
	ci, err := os.ReadFile(filepath.Join(moduleRoot, ".ci", "run"))
	if err != nil {
		t.Skipf("no .ci/run to compare with: %v", err)
	}
	found := false
	for line := range strings.SplitSeq(string(ci), "\n") {
		words, err := shellWords(strings.TrimSpace(line))
		if err != nil || len(words) < 3 || !slices.Contains(words, "build") || words[0] != "CGO_ENABLED=0" {
			continue
		}
		found = true
		ciArgs := slices.Clone(words[3:])
		if i := slices.Index(ciArgs, "-o"); i >= 0 && i+1 < len(ciArgs) {
			ciArgs[i+1] = "/out/countersign"
		}
		if !slices.Equal(words[:3], []string{"CGO_ENABLED=0", "go", "build"}) || !slices.Equal(ciArgs, wantArgs) {
			t.Errorf(".ci/run builds with %q, the Dockerfile with %q", words, append(wantEnv, wantArgs...))
		}
	}
	if !found {
		t.Errorf(".ci/run has no CGO_ENABLED=0 go build line")
	}
}

// TestStaticBinary checks the binary built with the Dockerfile's go build
// line (TestBuildDockerfileShape keeps .ci/run's line equal to it), which
// .ci/run names in $COUNTERSIGN_TEST_BINARY: it needs no dynamic loader
// (the image has no libc) and runs. The process tests run that same
// binary. A plain `go test` does not build it a second time with other
// flags (a full recompile, most of a cold run): the check then skips,
// saying how to run it, and fails under CI=true.
func TestStaticBinary(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skipf("ELF checks need linux, have %s", runtime.GOOS)
	}
	bin := os.Getenv(envTestBinary)
	if bin == "" {
		msg := "no " + envTestBinary + ": the Dockerfile's static build is not checked; .ci/run checks it " +
			"(or: CGO_ENABLED=0 go build -trimpath -ldflags=\"-s -w\" -o /tmp/cs ./cmd/countersign && " +
			envTestBinary + "=/tmp/cs go test -run TestStaticBinary ./cmd/countersign)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " — required under CI=true")
		}
		t.Skip(msg)
	}
	checkStaticELF(t, bin)

	// It runs: no loader, no libc.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(b), "countersign ") {
		t.Errorf("%s version = %q, %v", bin, b, err)
	}
}

// checkStaticELF fails t unless path is a statically linked, stripped ELF
// binary: no PT_INTERP (no dynamic loader), no dynamic section, no shared
// libraries, no symbol table.
func checkStaticELF(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %s program header: dynamically linked", path, p.Type)
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		t.Errorf("%s has a .dynamic section: dynamically linked", path)
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s imports %q", path, libs)
	}
	if s := f.Section(".symtab"); s != nil {
		t.Errorf("%s has a symbol table: -ldflags=-s not applied", path)
	}
}
