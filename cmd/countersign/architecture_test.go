package main_test

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestArchitecture keeps the import rules of docs/architecture.md (and
// HOUSE_STYLE.md "Layout shows the architecture"): every outside
// dependency in its one home, the domain on the standard library and CEL,
// and the "never" arrows. It reads every package's non-test imports with
// go/build and names the file and line of each import that breaks a rule.
func TestArchitecture(t *testing.T) {
	t.Parallel()
	root, module := findModule(t)
	pkgs := modulePackages(t, root, module)
	if len(pkgs) < 10 {
		t.Fatalf("found %d packages under %s, want the whole module", len(pkgs), root)
	}
	for _, v := range architectureViolations(pkgs, module) {
		t.Error(v)
	}
}

// maxMainLines bounds package main's non-test Go (issue 48): main only
// wires (Main, Demo, Run picking a subcommand); a subcommand's body, a
// report or a loop belongs in the package named for its job.
const maxMainLines = 1200

// TestMainOnlyWires keeps package main (cmd/countersign/*.go, tests
// aside) within maxMainLines lines, and names its largest files when it
// is not.
func TestMainOnlyWires(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	total, sizes := 0, map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(b), "\n")
		total, sizes[f] = total+n, n
	}
	if total == 0 {
		t.Fatal("no non-test Go files in package main: run the test from cmd/countersign")
	}
	if total > maxMainLines {
		names := slices.SortedFunc(maps.Keys(sizes), func(a, b string) int { return sizes[b] - sizes[a] })
		var largest []string
		for _, f := range names[:min(5, len(names))] {
			largest = append(largest, fmt.Sprintf("%s %d", f, sizes[f]))
		}
		t.Errorf("package main has %d lines of non-test Go, want at most %d: main only wires; move a subcommand's body or a loop to the package named for its job (largest: %s)",
			total, maxMainLines, strings.Join(largest, ", "))
	}
}

// homes lists each outside dependency (by import path prefix) and the
// packages (a path relative to the module, and everything below it) that
// may import it.
var homes = []struct {
	dep, name string
	home      []string
}{
	{"github.com/redis/go-redis/", "go-redis", []string{"store"}},
	{"github.com/alicebob/miniredis/", "miniredis", []string{"store"}},
	{"github.com/slack-go/slack", "slack-go", []string{"bot"}},
	{"github.com/sashabaranov/go-openai", "go-openai", []string{"agent"}},
	{"github.com/kelseyhightower/envconfig", "envconfig", []string{"cmd/countersign/config"}},
	{"github.com/prometheus/", "Prometheus", []string{"cmd/countersign/metrics"}},
	{"github.com/santhosh-tekuri/jsonschema/", "jsonschema", []string{"approval/policyfile"}},
	{"github.com/modelcontextprotocol/go-sdk", "the MCP go-sdk", []string{"agent/mcp"}},
	{"go.opentelemetry.io/", "OpenTelemetry", []string{"agent/tracing"}},
	{"github.com/KimMachineGun/automemlimit", "automemlimit", []string{"cmd/countersign/gctune"}},
	// Envoy's ext_authz protos and the gRPC server that answers them: the
	// gateway surface (agent/extauthz, and below it agentgateway's ExtMcp
	// in agent/extauthz/extmcp, served by the same gRPC server) is the only
	// one speaking them.
	{"github.com/envoyproxy/", "go-control-plane", []string{"agent/extauthz"}},
	{"google.golang.org/grpc", "gRPC", []string{"agent/extauthz"}},
	{"google.golang.org/genproto/", "googleapis' generated protos", []string{"agent/extauthz"}},
	// jsontext reads a forwarded MCP body in one pass, by exact keys, a
	// key twice refused at any depth (RFC 7493): the gateways' hot path.
	{"github.com/go-json-experiment/", "jsontext (go-json-experiment)", []string{"agent/extauthz"}},
	// Passkeys (WebAuthn) of step-up votes: verified by the step-up page only.
	{"github.com/go-webauthn/", "go-webauthn", []string{"cmd/countersign/server/stepup"}},
	// Logins at the identity provider (OIDC) of step-up votes and
	// enrollments: the step-up page only.
	{"github.com/coreos/go-oidc/", "go-oidc", []string{"cmd/countersign/server/stepup"}},
	{"golang.org/x/oauth2", "golang.org/x/oauth2", []string{"cmd/countersign/server/stepup"}},
}

// domainNever are what no package under approval imports (HOUSE_STYLE.md
// "Folders tell the truth"): the domain's folder holds no HTTP (server or
// client: the surfaces and the server speak it), no Slack, no OpenAI and no
// Prometheus. domainExceptions would name a package allowed one anyway,
// with its reason, as docs/architecture.md must; there is none today.
var domainNever = []struct{ dep, name string }{
	{"net/http", "HTTP"},
	{"github.com/slack-go/", "Slack"},
	{"github.com/sashabaranov/go-openai", "OpenAI"},
	{"github.com/prometheus/", "Prometheus"},
}

var domainExceptions = map[string]string{} // "approval/x imports dep" → why

// listeners are the calls and types that open a listener or run an HTTP
// server. The process has one, cmd/countersign/server; the packages in
// ownServers run servers that are not the process's.
var listeners = []string{"net.Listen", "net/http.Server", "net/http.ListenAndServe", "net/http.ListenAndServeTLS", "net/http.Serve", "google.golang.org/grpc.NewServer"}

var ownServers = map[string]string{
	"cmd/countersign/server": "the process's one HTTP front",
	"bot/slacksim":           "the local Slack workspace is a Slack of its own",
	"cmd/countersign/demo":   "the demo world serves the workspace and the system of record beside the process",
	"store/storetest":        "a TCP proxy the tests cut Redis with",
	"agent/extauthz":         "Envoy's gRPC ext_authz is a protocol of its own (HTTP/2 gRPC, COUNTERSIGN_EXTAUTHZ_ADDR); it serves on a listener cmd/countersign/server opens",
}

// leaves are standard-library-only packages that any package may import,
// the domain and the API's Go client included: one job each, done once
// for the whole module (approval/clip: the one truncation;
// approval/duration: the one reader and writer of durations with days;
// approval/option: how an option struct falls back to its defaults;
// approval/bodytap: the one wrapper of a reply's body, for the bot's,
// the agent's and the MCP gateway's transports).
var leaves = []string{"approval/clip", "approval/duration", "approval/option", "approval/bodytap"}

// leafRule: a leaf serves every package, so it may import nothing of ours
// and nothing from outside.
const leafRule = "imports only the standard library: it is a leaf every package may import (docs/architecture.md)"

// apart are the packages that never import one another (each declares the
// small interface it needs; cmd wires them).
var apart = []string{"bot", "agent", "store"}

// pkg is one package of the module: its path relative to the module
// ("" for the root) and each non-test import with where it is written.
type pkg struct {
	rel     string
	imports map[string]string // import path → "file.go:line"
	uses    map[string]string // "import/path.Name" → "file.go:line" (the first use)
}

func architectureViolations(pkgs []pkg, module string) []string {
	var out []string
	bad := func(p pkg, imp, why string) {
		out = append(out, fmt.Sprintf("%s: imports %q: %s", p.imports[imp], imp, why))
	}
	for _, p := range pkgs {
		for imp := range p.imports {
			rel, ours := strings.CutPrefix(imp, module+"/")
			for _, h := range homes {
				if strings.HasPrefix(imp, h.dep) && !under(p.rel, h.home...) {
					bad(p, imp, fmt.Sprintf("%s's one home is %s (docs/architecture.md); declare the small interface you need and let cmd/countersign wire it", h.name, strings.Join(h.home, ", ")))
				}
			}
			for _, d := range domainNever {
				if under(p.rel, "approval") && (imp == d.dep || strings.HasPrefix(imp, d.dep+"/") || strings.HasPrefix(imp, d.dep) && strings.HasSuffix(d.dep, "/")) && domainExceptions[p.rel+" imports "+d.dep] == "" {
					bad(p, imp, fmt.Sprintf("no package under approval (the domain's folder) imports %s: it belongs with the adapter or the server (docs/architecture.md \"Folders\")", d.name))
				}
			}
			if p.rel == "cmd/countersign/server" && !std(imp) {
				bad(p, imp, "the server (cmd/countersign/server) imports only the standard library: cmd/countersign builds the handlers it mounts")
			}
			if !ours {
				if p.rel == "approval/clock" && !std(imp) {
					bad(p, imp, "approval/clock imports only the standard library")
				}
				if p.rel == "approval" && !std(imp) && !strings.HasPrefix(imp, "github.com/google/cel-go/") {
					bad(p, imp, "the domain package approval imports only the standard library and CEL")
				}
				if under(p.rel, "approval/auditreport", "cmd/countersign/server/auditweb", "approval/clocktest") && !std(imp) {
					bad(p, imp, p.rel+" imports only the standard library and approval packages")
				}
				if p.rel == "cmd/testsum" && !std(imp) {
					bad(p, imp, testsumRule)
				}
				if under(p.rel, "agent/hook") && !std(imp) {
					bad(p, imp, hookRule)
				}
				if under(p.rel, leaves...) && !std(imp) {
					bad(p, imp, p.rel+" "+leafRule)
				}
				continue
			}
			if under(p.rel, leaves...) {
				bad(p, imp, p.rel+" "+leafRule)
			}
			if under(rel, leaves...) && p.rel != "bot/slacksim" && p.rel != "cmd/testsum" {
				continue // every package may use a leaf
			}
			if under(rel, "cmd") && !under(p.rel, "cmd") {
				bad(p, imp, "nothing imports cmd")
			}
			if rel == "approval/approvaltest" {
				bad(p, imp, "only tests import approval/approvaltest: its doubles are the store on an embedded Redis (docs/architecture.md)")
			}
			if rel == "cmd/countersign" {
				bad(p, imp, "nothing imports package main (cmd/countersign): what it would share belongs in a package, as the demo world is cmd/countersign/demo")
			}
			if p.rel == "approval" && rel != "approval/clock" {
				bad(p, imp, "the domain package approval imports nothing of ours but approval/clock (the real-time defaults, standard library only)")
			}
			if p.rel == "approval/clock" {
				bad(p, imp, "approval/clock imports only the standard library")
			}
			if p.rel == "cmd/countersign/server" {
				bad(p, imp, "the server (cmd/countersign/server) imports only the standard library: cmd/countersign builds the handlers it mounts")
			}
			if p.rel == "cmd/countersign/metrics" && !under(rel, "approval") {
				bad(p, imp, "the metrics (cmd/countersign/metrics) import only approval packages: bot, agent and store tell them through interfaces they declare (bot.SlackCalls, agent.ModelCalls), wired by cmd/countersign")
			}
			if under(p.rel, "approval/auditreport", "cmd/countersign/server/auditweb", "approval/clocktest") && !under(rel, "approval") {
				bad(p, imp, p.rel+" imports only the standard library and approval packages")
			}
			if p.rel == "bot/slacksim" {
				bad(p, imp, "the local Slack workspace imports nothing of ours")
			}
			if p.rel == "agent/api/client" {
				bad(p, imp, "the API's Go client imports only the standard library")
			}
			if under(p.rel, "agent/hook") && rel != "agent/api/client" {
				bad(p, imp, hookRule)
			}
			if p.rel == "cmd/testsum" {
				bad(p, imp, testsumRule)
			}
			for _, a := range apart {
				for _, b := range apart {
					if a != b && under(p.rel, a) && under(rel, b) {
						bad(p, imp, fmt.Sprintf("%s never imports %s (bot, agent and store never import one another; cmd/countersign wires them)", a, b))
					}
				}
			}
		}
	}
	for _, p := range pkgs {
		for use, where := range p.uses {
			if slices.Contains(listeners, use) && ownServers[p.rel] == "" {
				out = append(out, fmt.Sprintf("%s: uses %s: only the server (cmd/countersign/server) listens for the process; a surface hands its http.Handler to server.Routes", where, use))
			}
			if p.rel == "cmd/countersign" && use == "net/http.NewServeMux" {
				out = append(out, fmt.Sprintf("%s: uses %s: main mounts no path; server.Mux mounts them all (main fills server.Routes)", where, use))
			}
		}
	}
	sort.Strings(out)
	return out
}

// testsumRule: the README's test command builds cmd/testsum beside the
// tests, so on a cold build cache it must cost no more than the standard
// library the tests compile anyway.
const testsumRule = "the test command's summary (cmd/testsum) imports only the standard library: it compiles beside the tests on a cold cache (docs/performance.md)"

// hookRule: the Claude Code hook is an outside agent of the API, like any
// other: it speaks /v1 through the Go client and nothing else.
const hookRule = "the Claude Code hook (agent/hook) imports only the standard library and agent/api/client (and the leaves): it asks through /v1 like any outside agent"

// under reports whether the package rel is one of dirs or below one.
func under(rel string, dirs ...string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// std reports whether imp is in the standard library (no dot in its first
// element).
func std(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

// findModule returns the directory holding go.mod and the module path.
func findModule(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(m), `"`)
				}
			}
			t.Fatalf("%s/go.mod has no module line", dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// modulePackages reads the non-test imports of every package below root.
func modulePackages(t *testing.T, root, module string) []pkg {
	t.Helper()
	var pkgs []pkg
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
			return filepath.SkipDir
		}
		bp, err := build.Default.ImportDir(path, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		p := pkg{rel: filepath.ToSlash(rel), imports: map[string]string{}, uses: map[string]string{}}
		if err := readUses(root, path, bp.GoFiles, p.uses); err != nil {
			return err
		}
		for _, imp := range bp.Imports {
			where := p.rel + "/?"
			if pos := bp.ImportPos[imp]; len(pos) > 0 {
				r, _ := filepath.Rel(root, pos[0].Filename)
				where = fmt.Sprintf("%s:%d", filepath.ToSlash(r), pos[0].Line)
			}
			p.imports[imp] = where
		}
		pkgs = append(pkgs, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// readUses records, for each file, every selector on an imported package
// (net.Listen, http.Server) as "import/path.Name", where it is first used.
func readUses(root, dir string, files []string, uses map[string]string) error {
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		local := map[string]string{} // name in the file → import path
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			n := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				n = imp.Name.Name
			}
			local[n] = path
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok || local[id.Name] == "" {
				return true
			}
			use := local[id.Name] + "." + sel.Sel.Name
			if _, seen := uses[use]; !seen {
				pos := fset.Position(sel.Pos())
				r, _ := filepath.Rel(root, pos.Filename)
				uses[use] = fmt.Sprintf("%s:%d", filepath.ToSlash(r), pos.Line)
			}
			return true
		})
	}
	return nil
}

// TestArchitectureRulesFire: each rule names the file of an import that
// breaks it (imports the build could not compile, so checked on made-up
// packages).
func TestArchitectureRulesFire(t *testing.T) {
	t.Parallel()
	const mod = "example.com/m"
	for _, tt := range []struct {
		rel, imp, want string
	}{
		{"store", mod + "/cmd/countersign", "nothing imports cmd"},
		{"cmd/countersign/demo", mod + "/cmd/countersign", "nothing imports package main"},
		{"agent", mod + "/bot", "agent never imports bot"},
		{"store/storetest", mod + "/agent", "store never imports agent"},
		{"approval", mod + "/approval/policyfile", "imports nothing of ours"},
		{"approval/auditreport", "github.com/google/cel-go/cel", "imports only the standard library and approval packages"},
		{"cmd/countersign/server/auditweb", mod + "/store", "imports only the standard library and approval packages"},
		{"agent/api/client", mod + "/approval", "imports only the standard library"},
		{"agent/hook", mod + "/approval", "agent/hook) imports only the standard library and agent/api/client"},
		{"agent/hook", "github.com/modelcontextprotocol/go-sdk/mcp", "agent/hook) imports only the standard library and agent/api/client"},
		{"cmd/testsum", "github.com/fatih/color", "cmd/testsum) imports only the standard library"},
		{"cmd/testsum", mod + "/approval", "cmd/testsum) imports only the standard library"},
		{"agent/api", "github.com/prometheus/client_golang/prometheus", "Prometheus's one home is cmd/countersign/metrics"},
		{"agent", "github.com/santhosh-tekuri/jsonschema/v6", "jsonschema's one home is approval/policyfile"},
		{"bot", "github.com/modelcontextprotocol/go-sdk/mcp", "MCP go-sdk's one home is agent/mcp"},
		{"cmd/countersign", "go.opentelemetry.io/otel", "OpenTelemetry's one home is agent/tracing"},
		{"agent", "github.com/kelseyhightower/envconfig", "envconfig's one home is cmd/countersign"},
		{"bot/slacksim", "github.com/alicebob/miniredis/v2", "miniredis's one home is store"},
		{"cmd/countersign", "github.com/slack-go/slack", "slack-go's one home is bot"},
		{"bot", "github.com/sashabaranov/go-openai", "go-openai's one home is agent"},
		{"cmd/countersign", "github.com/KimMachineGun/automemlimit/memlimit", "automemlimit's one home is cmd/countersign/gctune"},
		{"approval/policyfile", "net/http", "no package under approval (the domain's folder) imports HTTP"},
		{"approval/auditreport", "net/http/httptest", "no package under approval (the domain's folder) imports HTTP"},
		{"approval", "github.com/slack-go/slack", "no package under approval (the domain's folder) imports Slack"},
		{"approval/approvaltest", "github.com/sashabaranov/go-openai", "no package under approval (the domain's folder) imports OpenAI"},
		{"approval/auditreport", "github.com/prometheus/client_golang/prometheus", "no package under approval (the domain's folder) imports Prometheus"},
		{"approval/clock", mod + "/approval", "approval/clock imports only the standard library"},
		{"approval/clock", "github.com/google/cel-go/cel", "approval/clock imports only the standard library"},
		{"cmd/countersign/server", mod + "/agent/api", "the server (cmd/countersign/server) imports only the standard library"},
		{"cmd/countersign/server", "github.com/prometheus/client_golang/prometheus", "the server (cmd/countersign/server) imports only the standard library"},
		{"cmd/countersign/metrics", mod + "/bot", "the metrics (cmd/countersign/metrics) import only approval packages"},
		{"cmd/countersign/metrics", mod + "/store", "the metrics (cmd/countersign/metrics) import only approval packages"},
		{"cmd/countersign/server/auditweb", mod + "/store", "imports only the standard library and approval packages"},
		{"approval/clip", mod + "/approval", "approval/clip imports only the standard library: it is a leaf"},
		{"approval/clip", "golang.org/x/text/width", "approval/clip imports only the standard library: it is a leaf"},
		{"bot/slacksim", mod + "/approval/clip", "the local Slack workspace imports nothing of ours"},
		{"approval/duration", mod + "/approval/clip", "approval/duration imports only the standard library: it is a leaf"},
		{"cmd/countersign/demo", mod + "/approval/approvaltest", "only tests import approval/approvaltest"},
	} {
		p := pkg{rel: tt.rel, imports: map[string]string{tt.imp: tt.rel + "/x.go:3"}}
		got := strings.Join(architectureViolations([]pkg{p}, mod), "\n")
		if !strings.Contains(got, tt.want) || !strings.Contains(got, tt.rel+"/x.go:3") {
			t.Errorf("%s importing %s: violations %q, want one at %s/x.go:3 saying %q", tt.rel, tt.imp, got, tt.rel, tt.want)
		}
	}
	for _, tt := range []struct {
		rel, use, want string
	}{
		{"agent/api", "net/http.Server", "only the server (cmd/countersign/server) listens for the process"},
		{"bot", "net.Listen", "only the server (cmd/countersign/server) listens for the process"},
		{"agent/mcp", "net/http.ListenAndServe", "only the server (cmd/countersign/server) listens for the process"},
		{"cmd/countersign", "net/http.Serve", "only the server (cmd/countersign/server) listens for the process"},
		{"agent/mcp", "google.golang.org/grpc.NewServer", "only the server (cmd/countersign/server) listens for the process"},
		{"cmd/countersign", "net/http.NewServeMux", "main mounts no path; server.Mux mounts them all"},
	} {
		p := pkg{rel: tt.rel, uses: map[string]string{tt.use: tt.rel + "/x.go:3"}}
		got := strings.Join(architectureViolations([]pkg{p}, mod), "\n")
		if !strings.Contains(got, tt.want) || !strings.Contains(got, tt.rel+"/x.go:3") {
			t.Errorf("%s using %s: violations %q, want one at %s/x.go:3 saying %q", tt.rel, tt.use, got, tt.rel, tt.want)
		}
	}
	ok := []pkg{
		{rel: "approval", imports: map[string]string{mod + "/approval/clock": "x"}},
		{rel: "cmd/countersign/server", imports: map[string]string{"net/http": "x", "net": "x"}, uses: map[string]string{"net.Listen": "x", "net/http.Server": "x", "net/http.NewServeMux": "x"}},
		{rel: "cmd/countersign/server/auditweb", imports: map[string]string{"net/http": "x", mod + "/approval/auditreport": "x"}},
		{rel: "cmd/countersign/metrics", imports: map[string]string{"github.com/prometheus/client_golang/prometheus": "x", mod + "/approval": "x"}},
		{rel: "bot/slacksim", uses: map[string]string{"net/http.Server": "x", "net.Listen": "x"}},
		{rel: "agent/api", uses: map[string]string{"net/http.NewServeMux": "x"}}, // a surface routes below its own path

		{rel: "store/storetest", imports: map[string]string{"github.com/redis/go-redis/v9": "x", mod + "/store": "x"}},
		{rel: "approval", imports: map[string]string{"github.com/google/cel-go/cel": "x", "context": "x"}},
		{rel: "agent/hook", imports: map[string]string{mod + "/agent/api/client": "x", "encoding/json": "x", mod + "/approval/clip": "x"}},
		{rel: "approval", imports: map[string]string{mod + "/approval/clip": "x"}},
		{rel: "agent/api/client", imports: map[string]string{mod + "/approval/clip": "x"}},
		{rel: "agent/tracing", imports: map[string]string{"go.opentelemetry.io/otel": "x", mod + "/agent": "x"}},
		{rel: "cmd/countersign", imports: map[string]string{mod + "/bot": "x", mod + "/agent": "x", mod + "/store": "x", mod + "/cmd/countersign/demo": "x"}},
		{rel: "cmd/countersign/demo", imports: map[string]string{mod + "/store": "x", mod + "/bot/slacksim": "x", mod + "/cmd/countersign/demosor": "x"}},
	}
	if got := architectureViolations(ok, mod); len(got) > 0 {
		t.Errorf("allowed imports reported: %q", got)
	}
}
