package bot_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFilesReferenceOneWay: no two files of the package refer to each
// other's declarations (a type, function, method, field, variable or
// constant declared at the top of the other file). References between
// files go one way, so each file can be read knowing only the files below
// it: the bot's parts (member cache, rate limits, card writer, names) below
// the Bot, the Bot below what handles Slack's calls (ingress, clicks,
// modals, home), card pieces below the card. Issue 48 counted 18 such pairs.
func TestFilesReferenceOneWay(t *testing.T) {
	refs, err := fileReferences(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) == 0 {
		t.Fatal("no reference between the package's files found: the check reads nothing")
	}
	for _, p := range mutualPairs(refs) {
		t.Errorf("%s and %s refer to each other: %s uses %s of %s, and %s uses %s of %s; move the declarations so that one of the two no longer refers to the other (a helper both use goes to a file below both)",
			p[0], p[1], p[0], strings.Join(refs[[2]string{p[0], p[1]}], ", "), p[1], p[1], strings.Join(refs[[2]string{p[1], p[0]}], ", "), p[0])
	}
}

// TestMutualPairsFound: the check finds a pair whatever declaration makes
// it (a method, a field, a type, a constant), and no pair in a chain.
func TestMutualPairsFound(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  [][2]string
	}{
		{"method and type", map[string]string{
			"a.go": "package p\ntype T struct{ n int }\nfunc use(t *T) { t.m() }\n",
			"b.go": "package p\nfunc (t *T) m() {}\n",
		}, [][2]string{{"a.go", "b.go"}}},
		{"field and constant", map[string]string{
			"a.go": "package p\nconst size = 3\nfunc f(s S) int { return s.n }\n",
			"b.go": "package p\ntype S struct{ n [size]int }\n",
		}, [][2]string{{"a.go", "b.go"}}},
		{"a chain", map[string]string{
			"a.go": "package p\nimport \"time\"\nfunc f() time.Duration { return g() }\n",
			"b.go": "package p\nimport \"time\"\nfunc g() time.Duration { return h + time.Second }\n",
			"c.go": "package p\nconst h = 2\n",
		}, nil},
		{"the test files left out", map[string]string{
			"a.go":      "package p\nfunc f() {}\n",
			"a_test.go": "package p\nfunc g() { f() }\n",
			"b.go":      "package p\nfunc h() { f() }\n",
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, src := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			refs, err := fileReferences(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := mutualPairs(refs); !slices.Equal(got, tc.want) {
				t.Errorf("mutualPairs = %v, want %v (references %v)", got, tc.want, refs)
			}
		})
	}
}

// fileReferences type-checks the package in dir (its non-test files) and
// returns, for each ordered pair of its files, the names of the package's
// declarations the first uses from the second. Imported packages are
// stood in by empty ones: only the package's own names are resolved (what
// cannot be resolved without an import's types is about that import, never
// about a file of this package), so the check needs no build.
func fileReferences(dir string) (map[[2]string][]string, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: emptyImports{}, Error: func(error) {}}
	pkg, _ := conf.Check("p", fset, files, info) // errors: only what the stand-ins lack
	sets := map[[2]string]map[string]bool{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !declaredAtTop(pkg, obj) {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		k := [2]string{from, to}
		if sets[k] == nil {
			sets[k] = map[string]bool{}
		}
		sets[k][obj.Name()] = true
	}
	refs := map[[2]string][]string{}
	for k, s := range sets {
		for name := range s {
			refs[k] = append(refs[k], name)
		}
		slices.Sort(refs[k])
	}
	return refs, nil
}

// declaredAtTop reports whether obj is a declaration of pkg a file can
// refer to from another: a package-level name, a method, or a field.
func declaredAtTop(pkg *types.Package, obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Var:
		return o.IsField() || o.Parent() == pkg.Scope()
	case *types.Func:
		return o.Signature().Recv() != nil || o.Parent() == pkg.Scope()
	case *types.TypeName, *types.Const:
		return o.Parent() == pkg.Scope()
	}
	return false
}

// mutualPairs returns the pairs of files that refer to each other, each
// pair in name order, sorted.
func mutualPairs(refs map[[2]string][]string) [][2]string {
	var out [][2]string
	for k := range refs {
		if _, back := refs[[2]string{k[1], k[0]}]; back && k[0] < k[1] {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	return out
}

// emptyImports stands in an empty, complete package for every import,
// named as the import path's last element says (less a major version
// suffix such as /v9).
type emptyImports struct{}

var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

func (emptyImports) Import(p string) (*types.Package, error) {
	name := path.Base(p)
	if majorVersion.MatchString(name) {
		name = path.Base(path.Dir(p))
	}
	pkg := types.NewPackage(p, name)
	pkg.MarkComplete()
	return pkg, nil
}
