package tracing_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOpenTelemetryHasOneHome keeps the house rule for OpenTelemetry: only
// agent/tracing imports go.opentelemetry.io (the agent speaks to it
// through its Tracer interface; cmd/countersign only wires it). Tests may
// import the SDK to look at spans.
func TestOpenTelemetryHasOneHome(t *testing.T) {
	const root = "../.."
	home := filepath.Join("agent", "tracing")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if filepath.Dir(rel) == home {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, "go.opentelemetry.io/") {
				t.Errorf("%s imports %s: OpenTelemetry belongs in agent/tracing only", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d files, want the whole module", checked)
	}
}
