package main_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClickToToolProcess is BenchmarkClickToTool with the product in
// a process of its own, as it is deployed: `countersign serve` (the
// binary $COUNTERSIGN_TEST_BINARY names, else this test binary run as the
// command), while the demo's world — the local workspace delivering the
// signed HTTP click, the scripted model, the system of record — and the
// benchmark stay in this process. Its cpu-ms/op is the product's own CPU
// per click: the serve process's CPU-time clock read just before the
// click and by the system of record's handler when the approved call
// reaches it (processCPUOf), so neither the fake workspace's work (signing
// and posting the click, answering the card's redraw and the thread's
// line) nor the benchmark's is in it, as it is in BenchmarkClickToTool's,
// which times the same window in one process. CLICK_SERVE_CPUPROFILE=file
// writes the serve process's CPU profile, the whole run's; CLICK_WINDOWS=file
// the click windows, for a profile of them alone (windowsFile). click-p50-ms and
// click-p99-ms are the same window's latency, black-box. It needs a real,
// single Redis (REDIS_URL): the process and the benchmark share it.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign/ -run '^$' -bench 'ClickToToolProcess' -benchtime 1000x -timeout 20m
func BenchmarkClickToToolProcess(b *testing.B) {
	for _, pending := range []int{0, 10000} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) { benchClickProcess(b, pending) })
	}
}

// processHit is the approved call reaching the system of record: when,
// and the serve process's CPU clock then.
type processHit struct {
	at        time.Time
	cpu, mono time.Duration // mono: CLOCK_MONOTONIC (monotonicNow)
}

func benchClickProcess(b *testing.B, pending int) {
	storetest.RequireRealRedis(b)
	if storetest.Cluster() {
		b.Skip("the process benchmark watches one Redis server (MONITOR): REDIS_URL names a Cluster")
	}
	rdb, prefix := storetest.New(b)
	var pid atomic.Int64 // the serve process's, once started
	hits := make(chan processHit, 16)
	file := refundEndpoint(b, func(*http.Request) func() {
		h := processHit{cpu: processCPUOf(int(pid.Load())), at: time.Now(), mono: monotonicNow()}
		return func() { hits <- h }
	})
	w := &demo.World{HTTPDelivery: true, PolicyFile: file, Redis: rdb, Prefix: prefix,
		Addr: "127.0.0.1:0", Manifest: slacksimtest.Manifest(b)}
	if err := w.Start(); err != nil {
		_ = w.Close()
		b.Fatalf("the demo's world: %v", err)
	}
	b.Cleanup(func() { _ = w.Close() })
	s := w.Settings
	// The process listens where the workspace delivers; the world reserved
	// the port for a process of its own, so it is given back first.
	if err := w.TakeListener().Close(); err != nil {
		b.Fatal(err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + b.TempDir(),
		"SLACK_API_URL=" + s.SlackAPIURL,
		"SLACK_BOT_TOKEN=" + s.SlackBotToken,
		"SLACK_SIGNING_SECRET=" + s.SlackSigningSecret,
		"OPENAI_BASE_URL=" + s.ModelURL,
		"OPENAI_API_KEY=" + s.ModelKey,
		"OPENAI_MODEL=" + s.ModelName,
		"COUNTERSIGN_CONFIG=" + file,
		"SOR_URL=" + w.Env("SOR_URL"), // the demo's order system, for the other tools; the refund's URL is sor's
		"REDIS_URL=" + os.Getenv(storetest.EnvURL),
		"COUNTERSIGN_REDIS_PREFIX=" + prefix,
		"COUNTERSIGN_AUDIT_STREAM=" + prefix + ":{audit}",
		"COUNTERSIGN_ADDR=" + s.Addr,
		"LOG_LEVEL=warn",
	}
	bin := buildBinary(b)
	if file := os.Getenv("CLICK_SERVE_CPUPROFILE"); file != "" {
		if os.Getenv(envTestBinary) != "" {
			b.Fatalf("CLICK_SERVE_CPUPROFILE profiles this test binary run as the command: unset %s", envTestBinary)
		}
		abs, err := filepath.Abs(file)
		if err != nil {
			b.Fatal(err)
		}
		env = append(env, envCPUProfile+"="+abs)
	}
	p := startServe(b, bin, env)
	b.Cleanup(func() { p.stop(b) }) // SIGTERM: the process writes its profile as it exits
	pid.Store(int64(p.cmd.Process.Pid))
	ready(b, "http://"+s.Addr+"/readyz", p)
	if processCPUOf(p.cmd.Process.Pid) == 0 { // it has run by now
		b.Log("cpu-ms/op reads 0: this system cannot read another process's CPU clock")
	}

	ws, cast := w.Workspace, w.Cast
	st := store.New(rdb, store.Options{Prefix: prefix})
	b.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	drain := parkPending(b, ctx, st, cast.Requester.ID, pending)
	b.Cleanup(func() { cancel(); drain() })
	recs := benchRecords{rdb: rdb, prefix: prefix, st: st}
	wait := func(what string, cond func() bool) {
		b.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := ws.WaitFor(wctx, cond); err != nil {
			b.Fatalf("waiting for %s: %v\nthe process's logs:\n%s", what, err, p.stderr.String())
		}
	}

	windows := windowsFile(b)
	var fromClick []time.Duration
	var cpu time.Duration
	after := "" // the last card clicked
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		// Watched from before the task: the process parks its wait on the
		// request soon after the card is up, maybe before the card is seen.
		mon := watchParking(b, rdb, prefix)
		task := fmt.Sprintf("<@%s> refund $%s on order 1234", slacksim.BotUserID, benchAmount(i))
		if _, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, task, ""); err != nil {
			b.Fatalf("PostMessage: %v", err)
		}
		card, id := refundCard(ctx, st, ws, cast.Approvals.ID, after, wait)
		after = card.TS
		if !mon.parked(id, 30*time.Second) {
			b.Fatalf("the process never parked its run on %s\nits logs:\n%s", id, p.stderr.String())
		}
		mon.close() // before the click: MONITOR costs Redis a copy of every command
		if !recs.batchIdle(ctx, id) {
			b.Fatalf("the other calls of the batch of %s never finished", id)
		}
		b.StartTimer()
		m0 := monotonicNow()
		c0 := processCPUOf(p.cmd.Process.Pid)
		t0 := time.Now()
		if err := ws.Click(cast.Approver.ID, cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
			b.Fatalf("Click(approve): %v", err)
		}
		var h processHit
		select {
		case h = <-hits:
		case <-time.After(30 * time.Second):
			b.Fatalf("the approved refund never reached the system of record\nthe process's logs:\n%s", p.stderr.String())
		}
		cpu += h.cpu - c0
		fromClick = append(fromClick, h.at.Sub(t0))
		if windows != nil {
			fmt.Fprintf(windows, "%d %d %d\n", p.cmd.Process.Pid, m0, h.mono)
		}
		b.StopTimer()
		recs.ran(b, ctx, ws, card, id, wait)
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(fromClick)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(fromClick[len(fromClick)/2]), "click-p50-ms")
	b.ReportMetric(ms(fromClick[len(fromClick)*99/100]), "click-p99-ms")
	b.ReportMetric(ms(cpu)/float64(b.N), "cpu-ms/op")
	b.ReportMetric(0, "ns/op")
}

// windowsFile opens the file CLICK_WINDOWS names, when it does: the
// benchmark writes there, a line per click, the serve process's pid and
// the window's start and end on CLOCK_MONOTONIC in nanoseconds, so that
// the samples of `perf record -k CLOCK_MONOTONIC` in the windows can be
// told from the rest (docs/performance.md, "The click's CPU, sampled in
// its windows").
func windowsFile(b *testing.B) *os.File {
	name := os.Getenv("CLICK_WINDOWS")
	if name == "" {
		return nil
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	return f
}

// ready waits until url (the process's /readyz) answers 200, or fails
// with the process's logs when it exits or 30 s pass.
func ready(tb testing.TB, url string, p *serveProcess) {
	tb.Helper()
	bound := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			tb.Fatalf("the process exited before it was ready: %v\nits logs:\n%s", err, p.stderr.String())
		case <-tick.C:
		}
		if time.Now().After(bound) {
			tb.Fatalf("%s not ready after 30 s\nthe process's logs:\n%s", url, p.stderr.String())
		}
	}
}

// parkingWatch follows, through Redis's MONITOR on a connection of its
// own, the wake hub's re-reads of requests after it subscribed to their
// hint channel (store/wait.go, lane.reread: HGET of the record's status,
// then EXISTS of its wake list, in one pipeline): the last step of a wait
// before it is parked, which parkedOn sees through a hook in one process.
type parkingWatch struct {
	conn    net.Conn
	prefix  string
	reread  chan string // ids re-read
	stopped chan struct{}
}

// watchParking opens a MONITOR on the Redis rdb talks to.
func watchParking(tb testing.TB, rdb redis.UniversalClient, prefix string) *parkingWatch {
	tb.Helper()
	c, ok := rdb.(*redis.Client)
	if !ok {
		tb.Fatalf("watchParking needs one Redis server, not a %T", rdb)
	}
	o := c.Options()
	conn, err := net.DialTimeout("tcp", o.Addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	if o.Password != "" {
		user := o.Username
		if user == "" {
			user = "default"
		}
		_, _ = fmt.Fprintf(conn, "AUTH %s %s\r\n", user, o.Password)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		tb.Fatal(err)
	}
	w := &parkingWatch{conn: conn, prefix: prefix + ":req:{", reread: make(chan string, 64), stopped: make(chan struct{})}
	go w.read() // exits when close closes conn
	tb.Cleanup(w.close)
	return w
}

// read parses MONITOR's lines (`+1700000000.123456 [0 127.0.0.1:5000]
// "HGET" "key" "status"`) and sends the id of each HGET of a record's
// status followed, from the same client, by EXISTS of its wake list.
func (w *parkingWatch) read() {
	defer close(w.reread)
	r := bufio.NewReader(w.conn)
	last := map[string]string{} // client → the record its last command read the status of
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if strings.HasPrefix(line, "-") {
			return // MONITOR (or AUTH) refused
		}
		lb, rb := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
		if lb < 0 || rb < lb {
			continue
		}
		client := line[lb+1 : rb]
		args := strings.Fields(strings.TrimSpace(line[rb+1:]))
		cmd, key := "", ""
		if len(args) >= 2 {
			cmd, key = strings.ToUpper(strings.Trim(args[0], `"`)), strings.Trim(args[1], `"`)
		}
		rest, ok := strings.CutPrefix(key, w.prefix)
		switch {
		case ok && cmd == "HGET" && strings.HasSuffix(rest, "}"):
			last[client] = strings.TrimSuffix(rest, "}")
			continue
		case ok && cmd == "EXISTS" && strings.HasSuffix(rest, "}:wake"):
			if id := strings.TrimSuffix(rest, "}:wake"); last[client] == id {
				select {
				case w.reread <- id:
				case <-w.stopped:
					return
				}
			}
		}
		delete(last, client)
	}
}

// parked reports whether the process re-read request id after
// subscribing (its wait is parked) within bound.
func (w *parkingWatch) parked(id string, bound time.Duration) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		select {
		case got, ok := <-w.reread:
			if !ok {
				return false
			}
			if got == id {
				return true
			}
		case <-t.C:
			return false
		}
	}
}

// close ends the MONITOR; it may be called more than once.
func (w *parkingWatch) close() {
	select {
	case <-w.stopped:
	default:
		close(w.stopped)
		_ = w.conn.Close()
	}
}
