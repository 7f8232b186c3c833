package main_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestScriptTables keeps the layout of store's Lua scripts (asynq's
// rdb.go, docs/architecture.md): each redis.NewScript has a doc comment
// with a table of the KEYS and ARGV it reads, one per line
// ("\tKEYS[1]   record"), and the table names every key and argument the
// script uses and none it does not ("ARGV[8..]" covers the rest of a
// variadic tail).
func TestScriptTables(t *testing.T) {
	t.Parallel()
	root, _ := findModule(t)
	files, err := filepath.Glob(filepath.Join(root, "store", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	scripts := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		n, problems, err := scriptTableProblems(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		scripts += n
		for _, p := range problems {
			t.Error(p)
		}
	}
	if scripts < 10 {
		t.Fatalf("found %d Lua scripts in store, want all of them", scripts)
	}
}

// TestScriptTablesFire: a missing table, a missing row and a stale row
// are each reported.
func TestScriptTablesFire(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, src, want string }{
		{"no table", "// s does it.\nvar s = redis.NewScript(`return KEYS[1]`)\n", "no KEYS/ARGV table"},
		{"missing row", "// s does it.\n//\n//\tKEYS[1]   record\nvar s = redis.NewScript(`return {KEYS[1], ARGV[1]}`)\n", "uses ARGV[1]"},
		{"stale row", "// s does it.\n//\n//\tKEYS[1]   record\n//\tARGV[2]   gone\nvar s = redis.NewScript(`return KEYS[1]`)\n", "ARGV[2] the script does not use"},
		{"one line", "// s does it. KEYS[1] record.\nvar s = redis.NewScript(`return KEYS[1]`)\n", "no KEYS/ARGV table"},
	} {
		src := "package store\n\n" + tt.src
		_, problems, err := scriptTableProblems("x.go", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(problems, "\n"); !strings.Contains(got, tt.want) {
			t.Errorf("%s: problems %q, want one saying %q", tt.name, got, tt.want)
		}
	}
	ok := "package store\n\n// s does it.\n//\n//\tKEYS[1]   record\n//\tARGV[1]   op\n//\tARGV[2..] field, value, ...\nvar s = redis.NewScript(luaOp + `return {KEYS[1], ARGV[1], unpack(ARGV, 2)}`)\n"
	if _, problems, err := scriptTableProblems("x.go", []byte(ok)); err != nil || len(problems) > 0 {
		t.Errorf("a script with its table: problems %q, error %v, want none", problems, err)
	}
}

var (
	scriptRef = regexp.MustCompile(`\b(KEYS|ARGV)\[(\d+)\]`)
	tableRow  = regexp.MustCompile(`(?m)^\t(KEYS|ARGV)\[(\d+)(\.\.)?\]`)
)

// scriptTableProblems checks every redis.NewScript declared in the file
// (src, or the file at path when src is nil). It returns how many scripts
// it found.
func scriptTableProblems(path string, src []byte) (int, []string, error) {
	var in any // nil: read the file
	if src != nil {
		in = src
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, in, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var problems []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			if len(vs.Values) != 1 || !isNewScript(vs.Values[0]) {
				continue
			}
			n++
			doc := vs.Doc
			if doc == nil {
				doc = gd.Doc
			}
			where := fmt.Sprintf("%s:%d: %s", filepath.Base(path), fset.Position(vs.Pos()).Line, vs.Names[0].Name)
			problems = append(problems, tableProblems(where, doc.Text(), scriptText(vs.Values[0]))...)
		}
	}
	return n, problems, nil
}

func isNewScript(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "NewScript"
}

// scriptText is the Lua written in the call: its string literals (the
// shared preludes, luaOp and the like, are named constants and not part
// of the script's own table).
func scriptText(e ast.Expr) string {
	var b strings.Builder
	ast.Inspect(e, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, err := strconv.Unquote(lit.Value)
			if err == nil {
				b.WriteString(s)
			}
		}
		return true
	})
	return b.String()
}

func tableProblems(where, doc, lua string) []string {
	type ref struct {
		kind string
		i    int
	}
	var rows []ref
	tails := map[string]int{} // "ARGV" → first index a "n.." row covers
	for _, m := range tableRow.FindAllStringSubmatch(doc, -1) {
		i, _ := strconv.Atoi(m[2])
		if m[3] != "" {
			tails[m[1]] = i
			continue
		}
		rows = append(rows, ref{m[1], i})
	}
	if len(rows) == 0 && len(tails) == 0 {
		return []string{where + ": no KEYS/ARGV table in its doc comment (one \"\\tKEYS[1]   what\" line each, as decideScript's)"}
	}
	var used []ref
	for _, m := range scriptRef.FindAllStringSubmatch(lua, -1) {
		i, _ := strconv.Atoi(m[2])
		if r := (ref{m[1], i}); !slices.Contains(used, r) {
			used = append(used, r)
		}
	}
	var out []string
	for _, u := range used {
		if t, ok := tails[u.kind]; ok && u.i >= t {
			continue
		}
		if !slices.Contains(rows, u) {
			out = append(out, fmt.Sprintf("%s: uses %s[%d], which its table does not name", where, u.kind, u.i))
		}
	}
	for _, r := range rows {
		if !slices.Contains(used, r) {
			out = append(out, fmt.Sprintf("%s: its table names %s[%d] the script does not use", where, r.kind, r.i))
		}
	}
	return out
}
