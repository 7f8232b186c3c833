package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/cmd/countersign/demosor"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// syncBuffer collects a process's stderr.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serveProcess is one `countersign serve` child process.
type serveProcess struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error // receives Wait's result once
}

// envTestBinary names a binary already built from this tree with the
// Dockerfile's build line (.ci/run sets it): the process tests run it, and
// TestStaticBinary checks it.
const envTestBinary = "COUNTERSIGN_TEST_BINARY"

// envAsCommand, set to 1 in a child process's environment, makes this
// test binary run as the command itself (TestMain): without
// $COUNTERSIGN_TEST_BINARY the process tests run the test binary, which
// holds every package of the command, instead of building it again.
const envAsCommand = "COUNTERSIGN_TEST_RUN_AS_COMMAND"

// command is the real command for the process tests: the binary they
// start as a child process, and what its environment must add.
type command struct {
	path string
	env  []string
}

// Command returns the command with args, its environment env (plus what
// the binary needs to run as the command).
func (c command) Command(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.path, args...)
	cmd.Env = append(slices.Clip(env), c.env...)
	return cmd
}

// buildBinary returns the command: $COUNTERSIGN_TEST_BINARY when set (CI:
// the Dockerfile's build), else this test binary run as the command.
func buildBinary(t testing.TB) command {
	t.Helper()
	if p := os.Getenv(envTestBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", envTestBinary, err)
		}
		return command{path: p}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("the test binary's path: %v", err)
	}
	return command{path: self, env: []string{envAsCommand + "=1"}}
}

func TestMain(m *testing.M) {
	if f := os.Getenv(envTestUpstream); f != "" {
		// An MCP upstream of a process test (mcp_orphans_e2e_test.go).
		os.Exit(serveTestUpstream(f))
	}
	if cpu := os.Getenv(envHostNoiseCPU); cpu != "" {
		// A host-noise meter of a latency benchmark (hostnoise_linux_test.go).
		os.Exit(hostNoiseChild(cpu))
	}
	if spec := os.Getenv(envExtLoad); spec != "" {
		// The client process of an ext_authz benchmark (extauthz_bench_test.go).
		os.Exit(extLoadChild(spec))
	}
	if os.Getenv(envAsCommand) == "1" {
		// A child process of a process test: be the command, as main is.
		os.Exit(runAsCommand(os.Args[1:]))
	}
	flag.Parse()
	parallelAtLeast(8)
	os.Exit(slacksimtest.Main(m)) // m.Run, then stop the browser tests' shared Chromium
}

// parallelAtLeast lets at least n of the package's parallel tests run at
// once unless -parallel was given. go test's default is GOMAXPROCS (2 on
// a 2-core machine), but these tests mostly wait on processes, Chromium,
// Redis and timers rather than use a core: with 4 the package took 13–16 s
// instead of 18–19 s here, and with 8 it takes 16–19 s instead of 22 s
// now that it holds more process and browser tests (docs/performance.md,
// "Test suite time").
func parallelAtLeast(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if f := flag.Lookup("test.parallel"); f != nil && !set {
		if cur, err := strconv.Atoi(f.Value.String()); err == nil && cur < n {
			_ = f.Value.Set(strconv.Itoa(n))
		}
	}
}

// envCPUProfile, in a child process's environment beside envAsCommand,
// names a file for the command's CPU profile, written when it exits
// (BenchmarkClickToToolProcess with CLICK_SERVE_CPUPROFILE).
const envCPUProfile = "COUNTERSIGN_TEST_CPUPROFILE"

// runAsCommand runs the command as main does, with a CPU profile when
// envCPUProfile names a file.
func runAsCommand(args []string) int {
	file := os.Getenv(envCPUProfile)
	if file == "" {
		return main.RunProcess(args)
	}
	f, err := os.Create(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pprof.StopCPUProfile()
	return main.RunProcess(args)
}

func startServe(t testing.TB, bin command, env []string) *serveProcess {
	t.Helper()
	p := &serveProcess{cmd: bin.Command(env, "serve"), stderr: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start serve: %v", err)
	}
	go func() { p.done <- p.cmd.Wait() }() // exits when the process does
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends SIGTERM and requires a clean exit (code 0) within 10 s.
func (p *serveProcess) stop(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	bound := time.NewTimer(10 * time.Second)
	defer bound.Stop()
	select {
	case err := <-p.done:
		took := time.Since(start)
		if err != nil {
			t.Fatalf("after SIGTERM: %v (want exit code 0)\nlogs:\n%s", err, p.stderr.String())
		}
		return took
	case <-bound.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("process still running 10 s after SIGTERM\nlogs:\n%s", p.stderr.String())
	}
	return 0
}

// jsonLogs parses every log line; a line that is not JSON fails the test.
func jsonLogs(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		out = append(out, m)
	}
	return out
}

// waitUntil polls cond (Redis state has no change feed) until it holds or
// 20 s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	bound := time.NewTimer(20 * time.Second)
	defer bound.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-bound.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestSIGTERMLeavesWaitsDurable runs the real binary twice against one real
// Redis and one local workspace. The first process gets a task whose refund
// needs approval; once the card is up it gets SIGTERM and must exit with
// code 0 within 10 s, leaving the request pending (not rejected, not
// cancelled). A second process adopts the run; approving the card there
// runs the refund exactly once and finishes the run.
func TestSIGTERMLeavesWaitsDurable(t *testing.T) {
	t.Parallel()
	rig := newServeRig(t, slacksimtest.New(t, slacksim.Options{}))
	bin, ws, cast, sor, st, env, ctx := rig.bin, rig.ws, rig.cast, rig.sor, rig.st, rig.env, context.Background()
	first := startServe(t, bin, env)
	var second *serveProcess // once started: its logs go with a failure too
	wsWait := func(what string, cond func() bool) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := ws.WaitFor(wctx, cond); err != nil {
			logs := first.stderr.String()
			if second != nil {
				logs += "second process:\n" + second.stderr.String()
			}
			t.Fatalf("waiting for %s: %v\nlogs:\n%s", what, err, logs)
		}
	}
	wsWait("the first process's socket", func() bool { return ws.Connections() > 0 })

	root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID,
		"<@"+slacksim.BotUserID+"> order 1234 arrived damaged — look it up and refund the shipping", "")
	if err != nil {
		t.Fatal(err)
	}
	cards := func() []slacksim.Message {
		var out []slacksim.Message
		for _, m := range ws.Messages(cast.Approvals.ID) {
			if m.ThreadTS == "" && strings.Contains(string(m.Blocks), "issue_refund") && strings.Contains(string(m.Blocks), "cs_approve") {
				out = append(out, m)
			}
		}
		return out
	}
	wsWait("the refund card", func() bool { return len(cards()) == 1 })
	var req *approval.Request
	waitUntil(t, "the pending request with its card recorded", func() bool {
		p, err := st.Pending(ctx)
		if err != nil || len(p) != 1 || p[0].Card.TS == "" {
			return false
		}
		req = p[0]
		return true
	})

	took := first.stop(t)
	t.Logf("first process exited %v after SIGTERM", took.Round(time.Millisecond))
	// The workspace drops the closed socket when it reads its end; until
	// then it may hand the click below to it, and the click is lost.
	wsWait("the first process's socket gone", func() bool { return ws.Connections() == 0 })

	got, err := st.Request(ctx, req.ID)
	if err != nil {
		t.Fatalf("Request after shutdown: %v", err)
	}
	if got.Status != approval.StatusPending || got.Decision != nil {
		t.Fatalf("request after SIGTERM is %s (decision %+v), want still pending", got.Status, got.Decision)
	}
	if n := len(sor.Refunds()); n != 0 {
		t.Fatalf("refunds before any approval = %d, want 0", n)
	}
	if strings.Contains(first.stderr.String(), "xoxb-sim") || strings.Contains(first.stderr.String(), "xapp-sim") {
		t.Errorf("logs carry a token")
	}
	stopped := false
	for _, m := range jsonLogs(t, first.stderr.String()) {
		stopped = stopped || m["msg"] == "shutting down: waits stay durable"
	}
	if !stopped {
		t.Errorf("the first process did not log its shutdown:\n%s", first.stderr.String())
	}

	// A second process adopts the run; the card is decidable there.
	second = startServe(t, bin, env)
	wsWait("the second process's socket", func() bool { return ws.Connections() > 0 })
	if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, req.Card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(approve): %v", err)
	}
	wsWait("the run's answer in the task thread", func() bool {
		for _, m := range ws.Replies(cast.Tasks.ID, root) {
			if m.BotID != "" && strings.Contains(strings.ToLower(m.Text), "refund") && len(sor.Refunds()) == 1 {
				if r, err := st.Request(ctx, req.ID); err == nil && r.Status == approval.StatusExecuted {
					return true
				}
			}
		}
		return false
	})
	if rf := sor.Refunds(); len(rf) != 1 {
		t.Errorf("refunds = %+v, want exactly one", rf)
	}
	if n := len(cards()) + countFinalCards(ws, cast.Approvals.ID); n != 1 {
		t.Errorf("refund cards = %d, want the one card (no repost after the restart)", n)
	}
	second.stop(t)

	// The audit chain is intact and never says the request was rejected,
	// cancelled or expired.
	au := rig.audit
	if _, err := au.Verify(ctx); err != nil {
		t.Errorf("audit Verify: %v", err)
	}
	entries, err := au.Range(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.RequestID == req.ID && (e.Event == approval.EventCancelled || e.Event == approval.EventExpired) {
			t.Errorf("audit: %s for the request that was waiting", e.Event)
		}
	}

	// Logs are JSON and carry request and run ids.
	var withIDs int
	for _, m := range jsonLogs(t, second.stderr.String()) {
		if m["request_id"] != nil || m["run_id"] != nil {
			withIDs++
		}
	}
	if withIDs == 0 {
		t.Errorf("no log line of the second process carries request_id or run_id:\n%s", second.stderr.String())
	}
}

// serveRig is what a test running `countersign serve` as a process needs:
// the built binary, a local workspace seeded with the demo's people, the
// demo's order system, the scripted model, a store on a real Redis under a
// fresh prefix, and the environment that points a process at all of them.
type serveRig struct {
	bin    command
	ws     *slacksim.Workspace
	cast   slacksim.DemoCast
	sor    *demosor.Service
	st     *store.Store
	audit  *store.Audit // the stream the processes write
	stream string
	env    []string
}

func newServeRig(t *testing.T, ws *slacksim.Workspace) *serveRig {
	t.Helper()
	storetest.RequireRealRedis(t)
	rdb, prefix := storetest.New(t) // the prefix's keys, audit stream included, are deleted afterwards
	rig := &serveRig{bin: buildBinary(t), ws: ws, cast: ws.SeedDemo(), sor: demosor.New()}
	sorSrv := httptest.NewServer(rig.sor.Handler())
	t.Cleanup(sorSrv.Close)
	model := httptest.NewServer(scripted.New())
	t.Cleanup(model.Close)

	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, demo.Policy, 0o600); err != nil {
		t.Fatal(err)
	}
	rig.stream = prefix + ":{audit}"
	rig.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + t.TempDir(),
		"SLACK_API_URL=" + ws.APIURL(),
		"SLACK_BOT_TOKEN=xoxb-sim",
		"SLACK_APP_TOKEN=xapp-sim",
		"OPENAI_BASE_URL=" + model.URL + "/v1",
		"OPENAI_API_KEY=x",
		"OPENAI_MODEL=scripted",
		"COUNTERSIGN_CONFIG=" + policy,
		"SOR_URL=" + sorSrv.URL,
		"REDIS_URL=" + os.Getenv(storetest.EnvURL),
		"COUNTERSIGN_REDIS_PREFIX=" + prefix,
		"COUNTERSIGN_AUDIT_STREAM=" + rig.stream,
		"COUNTERSIGN_ADDR=127.0.0.1:0",
		"LOG_LEVEL=info",
	}
	rig.st = store.New(rdb, store.Options{Prefix: prefix})
	rig.audit = store.NewAudit(rdb, store.AuditOptions{Stream: rig.stream})
	t.Cleanup(func() { _ = rig.st.Close() })
	return rig
}

// countFinalCards counts top-level refund cards without buttons.
func countFinalCards(ws *slacksim.Workspace, channel string) int {
	n := 0
	for _, m := range ws.Messages(channel) {
		if m.ThreadTS == "" && strings.Contains(string(m.Blocks), "issue_refund") && !strings.Contains(string(m.Blocks), "cs_approve") &&
			strings.Contains(string(m.Blocks), "Request `") {
			n++
		}
	}
	return n
}
