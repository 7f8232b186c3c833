package auditweb_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAuditPackagesImportOnlyStdlibAndApproval keeps the house rule for
// the audit readers and the view: the standard library and approval
// packages only (Redis, Slack and the rest reach them through the
// interfaces they declare, wired in cmd/countersign).
func TestAuditPackagesImportOnlyStdlibAndApproval(t *testing.T) {
	const module = "github.com/countersign/countersign/"
	for _, dir := range []string{".", "../../../../approval/auditreport"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			pf, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range pf.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(path, "/")
				stdlib := !strings.Contains(first, ".")
				ours := path == module+"approval" || strings.HasPrefix(path, module+"approval/")
				if !stdlib && !ours {
					t.Errorf("%s imports %s: only the standard library and approval packages belong here", f, path)
				}
			}
		}
	}
}
