package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// longPollClientEnv, set in a child process's environment, makes the test
// binary run as the long-poll client of BenchmarkLongPoll (longPollClient)
// instead of running tests: see TestMain.
const longPollClientEnv = "COUNTERSIGN_BENCH_LONGPOLL_CLIENT"

func TestMain(m *testing.M) {
	if os.Getenv(longPollClientEnv) == "1" {
		os.Exit(longPollClient(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// BenchmarkLongPoll holds API long polls (GET ?wait=60s, each on its own
// HTTP/1.1 connection) on the store's wake hub, then decides each request
// through the lifecycle owner and measures from the start of each decision
// to its long poll's answer read whole by the client (p50, p99, max; the
// decision alone, decide-p50/p99: the floor, since the answer cannot come
// before the decision's wake-up; written-p50/p99: until the server has
// written the answer on the connection, the server's part).
//
// in-turn decides one request at a time, each after the previous
// decision's answer was read by the client, as the wake hub's
// BenchmarkWakeLatency times its wake-ups and as people click: the
// latency of an answer, with no other decision sharing the machine's two
// cores. deciders=1 decides back to back, the next decision starting as
// soon as the previous returns, while the previous answer is still on its
// way: the decisions' own queue on 2 cores (three processes: this one,
// Redis, the client) is in its tail. deciders=16 keeps 16 decisions in
// flight, the figure before issue 33: it times the queue of decisions
// (Little's law: 16 in flight over the lifecycle's throughput) more than
// the answer.
//
// The client runs in a child process (this test binary, started with
// COUNTERSIGN_BENCH_LONGPOLL_CLIENT=1: longPollClient), on raw TCP
// connections with one goroutine each, so the server's figures are the
// server's alone: server-heap-KiB/poll, server-stack-KiB/poll and
// server-goroutines/poll are measured in this process (the HTTP server,
// the API, the wake hub) with every poll parked (park.go: the connection
// taken from net/http, one goroutine reading it). The client's figures,
// measured in the child, are client-heap-KiB/poll and
// client-goroutines/poll. polls=10000/net-http-floor holds as many polls
// from the same client on a bare net/http handler that only blocks
// (benchLongPollFloor): what a poll held by net/http costs, its two
// goroutines per connection (the connection's, and the background read
// that notices a caller going away) and its buffers. Both processes raise
// their file-descriptor limit to the hard limit (10,000 connections each).
// The setup's garbage (creating the requests, holding the polls) is
// collected before the memory is read (collect: two cycles, for what sat
// in sync.Pools); what the decisions and answers allocate in this process
// while timed is timed-alloc-KiB/decision (the deciders' read of each
// request included, as a bot reads the request it decides), and
// timed-gc-cycles counts the collections that ran meanwhile: the samples
// a cycle's mark phase overlaps make the p99, and their share follows the
// garbage per decision (a smaller live heap marks faster but more often).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./agent/api -run '^$' -bench LongPoll -benchtime 1x -timeout 20m
func BenchmarkLongPoll(b *testing.B) {
	for _, c := range []struct{ polls, deciders int }{{1000, 16}, {1000, 1}, {10000, 1}, {10000, inTurn}} {
		name := fmt.Sprintf("polls=%d/deciders=%d", c.polls, c.deciders)
		if c.deciders == inTurn {
			name = fmt.Sprintf("polls=%d/in-turn", c.polls)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				benchLongPoll(b, c.polls, c.deciders)
			}
		})
	}
	b.Run("polls=10000/net-http-floor", func(b *testing.B) {
		for range b.N {
			benchLongPollFloor(b, 10000)
		}
	})
}

// BenchmarkDecideAnswer is BenchmarkLongPoll's timed path, one decision at
// a time, as bytes and allocations per decision (B/op, allocs/op): figures
// that another process on the machine cannot move, so a change to the
// garbage of a decision is seen in one run. Each op is what the long poll
// benchmark times in the server's process: the decider's read of the
// request, its decision through the lifecycle owner (record, audit,
// wake-up, card redraw), the wake hub's delivery and the API's answer
// written to the held poll's connection. Its b.N polls are held before
// the timer starts (raw TCP connections in this process, each read into
// a buffer of its own, so the client side allocates nothing while timed),
// and each decision waits for its answer before the next starts.
//
// BENCH_DECIDE_ALLOCPROFILE=file writes heap profiles to file.before and
// file.after, around the timed decisions: with -memprofilerate 1,
// go tool pprof -sample_index=alloc_space -diff_base file.before file.after
// shows where the decisions' garbage comes from, without the setup's.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./agent/api -run '^$' -bench DecideAnswer -benchtime 1000x -count 5
func BenchmarkDecideAnswer(b *testing.B) {
	raiseFileLimit(b)
	h := newHarness(b, harnessOptions{maxWait: 60 * time.Second, rate: 1_000_000})
	c := client.New(h.url, fullKey)
	c.HTTP = &http.Client{Transport: &http.Transport{}}
	n := b.N
	ids := make([]string, n)
	for i := range n {
		r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: fmt.Sprintf("bench-%d", i), Arguments: json.RawMessage(fmt.Sprintf(`{"amount":%d.%02d}`, 1+i%1000, i/1000))})
		if err != nil {
			b.Fatalf("Request %d: %v", i, err)
		}
		ids[i] = r.ID
	}
	c.HTTP.CloseIdleConnections()
	u, err := url.Parse(h.url)
	if err != nil {
		b.Fatal(err)
	}
	answered := make([]chan []byte, n)
	for i, id := range ids {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			b.Fatalf("dial: %v", err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		req := "GET /v1/requests/" + id + "?wait=60s HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + fullKey + "\r\nConnection: close\r\n\r\n"
		if _, err := io.WriteString(conn, req); err != nil {
			b.Fatalf("send: %v", err)
		}
		answered[i] = make(chan []byte, 1)
		buf := make([]byte, 16<<10)
		go func() { // ends when the server closes the connection after its answer
			m := 0
			for m < len(buf) {
				k, err := conn.Read(buf[m:])
				m += k
				if err != nil {
					break
				}
			}
			answered[i] <- buf[:m]
		}()
	}
	h.waitPolls(n)
	profile := os.Getenv("BENCH_DECIDE_ALLOCPROFILE")
	if profile != "" {
		runtime.GC()
		writeHeapProfile(b, profile+".before")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		r, err := h.store.Request(h.ctx, ids[i])
		if err != nil {
			b.Fatalf("Request: %v", err)
		}
		if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
			Approver: "U0BOB0001", At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{}); err != nil {
			b.Fatalf("Decide: %v", err)
		}
		if got := <-answered[i]; !bytes.HasPrefix(got, []byte("HTTP/1.1 200 ")) || !bytes.Contains(got, []byte(`"status":"approved"`)) {
			b.Fatalf("answer for %s = %q, want 200 approved", ids[i], got)
		}
	}
	b.StopTimer()
	if profile != "" {
		runtime.GC()
		writeHeapProfile(b, profile+".after")
	}
}

// benchLongPollFloor holds n polls from the same client on a bare net/http
// server whose handler only blocks until released, then answers as the API
// would: what net/http alone costs per held poll (server-heap-KiB/poll,
// server-stack-KiB/poll, server-goroutines/poll), the floor under
// BenchmarkLongPoll's figures.
func benchLongPollFloor(b *testing.B, n int) {
	b.StopTimer()
	raiseFileLimit(b)
	held := make(chan struct{}, n)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"approved"}`+"\n")
	}))
	b.Cleanup(srv.Close)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("req_floor%d", i)
	}
	u, err := url.Parse(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	collect()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()
	line := startLongPollClient(b, u.Host, "none", ids)
	if f := line(); len(f) != 3 || f[0] != "held" {
		b.Fatalf("client said %q, want held", f)
	}
	for range n {
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			b.Fatalf("fewer than %d polls held after 30s", n)
		}
	}
	collect()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	goroutines := runtime.NumGoroutine() - goroutinesBefore
	close(release)
	for range n {
		if f := line(); len(f) != 3 || f[0] != "answered" {
			b.Fatalf("client said %q, want answered", f)
		}
	}
	reportPerPoll(b, before, during, goroutines, n)
	b.ReportMetric(0, "ns/op")
}

// inTurn, as benchLongPoll's deciders, decides one request at a time, each
// after the client read the previous answer.
const inTurn = 0

func benchLongPoll(b *testing.B, n, deciders int) {
	b.StopTimer()
	raiseFileLimit(b)
	h := newHarness(b, harnessOptions{maxWait: 60 * time.Second, rate: 1_000_000})
	c := client.New(h.url, fullKey)
	c.HTTP = &http.Client{Transport: &http.Transport{}}
	ids := make([]string, n)
	for i := range n {
		r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: fmt.Sprintf("bench-%d", i), Arguments: json.RawMessage(fmt.Sprintf(`{"amount":%d.%02d}`, 1+i%1000, i/1000)) /* under the $2,000 deny rule */})
		if err != nil {
			b.Fatalf("Request %d: %v", i, err)
		}
		if r.ID == "" || r.Status != client.Pending {
			b.Fatalf("Request %d = %s %q, want a pending request", i, r.Status, r.ID)
		}
		ids[i] = r.ID
	}
	c.HTTP.CloseIdleConnections()
	index := make(map[string]int, n)
	for i, id := range ids {
		index[id] = i
	}
	u, err := url.Parse(h.url)
	if err != nil {
		b.Fatal(err)
	}

	collect()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	line := startLongPollClient(b, u.Host, fullKey, ids)
	// "held HEAP GOROUTINES": the client sent every request.
	f := line()
	if len(f) != 3 || f[0] != "held" {
		b.Fatalf("client said %q, want held", f)
	}
	clientHeap, _ := strconv.ParseFloat(f[1], 64)
	clientGoroutines, _ := strconv.ParseFloat(f[2], 64)
	h.waitPolls(n)
	h.waitParked(n)
	held := h.server.Waiting()
	collect()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	goroutines := runtime.NumGoroutine() - goroutinesBefore
	if file := os.Getenv("BENCH_LONGPOLL_HEAPPROFILE"); file != "" {
		writeHeapProfile(b, file)
	}

	started := make([]time.Time, n)
	decided := make([]time.Duration, n)
	// When the server wrote each answer (parked polls): the server's part,
	// apart from the client process's and the kernel's.
	written := make([]time.Time, n)
	api.OnAnswer(h.server, func(id string) {
		if i, ok := index[id]; ok {
			written[i] = time.Now()
		}
	})
	decide := func(i int) {
		r, err := h.store.Request(h.ctx, ids[i])
		if err != nil {
			b.Errorf("Request: %v", err)
			return
		}
		started[i] = time.Now()
		if _, err := h.life.Decide(h.ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
			Approver: "U0BOB0001", At: h.clock.Now(), Digest: r.Digest}, approval.DecideOptions{}); err != nil {
			b.Errorf("Decide: %v", err)
		}
		decided[i] = time.Since(started[i])
	}
	// "answered ID UNIXNANO": one line per long poll answered with the decision.
	answered := make([]time.Time, n)
	readAnswer := func() (i int) {
		f := line()
		if len(f) != 3 || f[0] != "answered" {
			b.Fatalf("client said %q, want answered", f)
		}
		i, ok := index[f[1]]
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if !ok || err != nil {
			b.Fatalf("client said %q", f)
		}
		answered[i] = time.Unix(0, ns)
		return i
	}
	work := make(chan int)
	var dw sync.WaitGroup
	for range deciders {
		dw.Add(1)
		go func() { // ends when work is closed
			defer dw.Done()
			for i := range work {
				decide(i)
			}
		}()
	}
	// The timed phase's garbage and collections in this process (the
	// server and the deciders; the client is another process): a
	// collection that overlaps the decisions is most of their tail.
	var timedBefore, timedAfter runtime.MemStats
	runtime.ReadMemStats(&timedBefore)
	b.StartTimer()
	if deciders == inTurn {
		for i := range n {
			decide(i)
			if got := readAnswer(); got != i {
				b.Fatalf("the client read the answer of %s after deciding %s", ids[got], ids[i])
			}
		}
	} else {
		for i := range n {
			work <- i
		}
		close(work)
		dw.Wait()
		for range n {
			readAnswer()
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&timedAfter)

	lat := make([]float64, 0, n)
	wrote := make([]float64, 0, n)
	for i := range n {
		lat = append(lat, float64(answered[i].Sub(started[i]).Microseconds())/1000)
		wrote = append(wrote, float64(written[i].Sub(started[i]).Microseconds())/1000)
	}
	slices.Sort(lat)
	slices.Sort(wrote)
	slices.Sort(decided)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(lat[n/2], "p50-ms")
	b.ReportMetric(lat[n*99/100], "p99-ms")
	b.ReportMetric(lat[n-1], "max-ms")
	b.ReportMetric(wrote[n/2], "written-p50-ms")
	b.ReportMetric(wrote[n*99/100], "written-p99-ms")
	b.ReportMetric(ms(decided[n/2]), "decide-p50-ms")
	b.ReportMetric(ms(decided[n*99/100]), "decide-p99-ms")
	b.ReportMetric(float64(held), "polls-held")
	b.ReportMetric(float64(timedAfter.TotalAlloc-timedBefore.TotalAlloc)/float64(n)/1024, "timed-alloc-KiB/decision")
	b.ReportMetric(float64(timedAfter.NumGC-timedBefore.NumGC), "timed-gc-cycles")
	reportPerPoll(b, before, during, goroutines, n)
	b.ReportMetric(clientHeap/float64(n)/1024, "client-heap-KiB/poll")
	b.ReportMetric(clientGoroutines/float64(n), "client-goroutines/poll")
	b.ReportMetric(0, "ns/op")
}

// reportPerPoll reports what each of n held polls costs this process:
// the heap and stack in use (during less before) and goroutines.
func reportPerPoll(b *testing.B, before, during runtime.MemStats, goroutines, n int) {
	b.ReportMetric(float64(int64(during.HeapInuse)-int64(before.HeapInuse))/float64(n)/1024, "server-heap-KiB/poll")
	b.ReportMetric(float64(int64(during.StackInuse)-int64(before.StackInuse))/float64(n)/1024, "server-stack-KiB/poll")
	b.ReportMetric(float64(goroutines)/float64(n), "server-goroutines/poll")
}

// collect runs two garbage collections: what was put in a sync.Pool
// (net/http's buffers of the connections whose polls were parked) stays in
// the pool's victim cache until the second, and is no poll's memory.
func collect() {
	runtime.GC()
	runtime.GC()
}

// startLongPollClient starts longPollClient in a child process, polling
// host for ids with key; line returns the next line it writes, split in
// fields. The client is the measuring instrument, not the product: it runs
// without garbage collection (GOGC=off; it allocates ~10 KiB per answer),
// so its own collections of 10,000 goroutine stacks do not land in the
// figures (they did: its p99 was 2-6x the server's written-p99).
func startLongPollClient(b *testing.B, host, key string, ids []string) (line func() []string) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), longPollClientEnv+"=1", "GOGC=off")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the client process: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out := bufio.NewScanner(outPipe)
	go func() { // ends once every id is written, or the child is gone
		defer in.Close()
		w := bufio.NewWriter(in)
		fmt.Fprintf(w, "%s %s\n", host, key)
		for _, id := range ids {
			fmt.Fprintln(w, id)
		}
		_ = w.Flush()
	}()
	return func() []string {
		if !out.Scan() {
			b.Fatalf("the client process stopped: %v", out.Err())
		}
		return strings.Fields(out.Text())
	}
}

// writeHeapProfile writes the heap profile to file, for
// BENCH_LONGPOLL_HEAPPROFILE=file: what the held polls keep (go tool pprof
// -sample_index=inuse_space).
func writeHeapProfile(tb testing.TB, file string) {
	f, err := os.Create(file)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}

// longPollClient is BenchmarkLongPoll's client, run in a child process. It
// reads "HOST:PORT KEY" and then one request id a line from in; opens one
// TCP connection per id and sends its long poll (HTTP/1.1, ?wait=60s); then
// writes "held HEAP GOROUTINES" (its heap in use and goroutines for all the
// polls, after a GC) and, as each answer arrives whole, "answered ID
// UNIXNANO" (an answer that is not 200 with a final request is an error,
// and the process exits 1). One goroutine per connection, blocked in Read:
// no HTTP transport's reader and writer goroutines.
func longPollClient(in io.Reader, out io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "long-poll client: "+format+"\n", args...)
		return 1
	}
	_ = raiseOpenFiles() // as the parent did; without it the client fails on its own connections
	sc := bufio.NewScanner(in)
	if !sc.Scan() {
		return fail("no address")
	}
	addr, key, _ := strings.Cut(sc.Text(), " ")
	var ids []string
	for sc.Scan() {
		ids = append(ids, sc.Text())
	}
	collect()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	var mu sync.Mutex // guards w and failed
	w := bufio.NewWriter(out)
	failed := false
	var wg sync.WaitGroup
	for _, id := range ids {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return fail("dial: %v", err)
		}
		req := "GET /v1/requests/" + id + "?wait=60s HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + key + "\r\n\r\n"
		if _, err := io.WriteString(conn, req); err != nil {
			return fail("send: %v", err)
		}
		wg.Add(1)
		go func() { // ends when the answer is read (or the connection fails)
			defer wg.Done()
			defer conn.Close()
			var first [1]byte
			if _, err := io.ReadFull(conn, first[:]); err != nil {
				mu.Lock()
				failed = true
				mu.Unlock()
				fmt.Fprintf(os.Stderr, "long-poll client: read %s: %v\n", id, err)
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(first[:]), conn)), nil)
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
			}
			at := time.Now().UnixNano()
			var v client.Request
			if err == nil {
				err = json.Unmarshal(body, &v)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil || resp.StatusCode != http.StatusOK || !v.Status.Final() {
				failed = true
				fmt.Fprintf(os.Stderr, "long-poll client: answer for %s: %v %s\n", id, err, body)
				return
			}
			fmt.Fprintf(w, "answered %s %d\n", id, at)
			_ = w.Flush()
		}()
	}
	collect()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	mu.Lock()
	fmt.Fprintf(w, "held %d %d\n", int64(during.HeapInuse)-int64(before.HeapInuse), runtime.NumGoroutine()-g0)
	_ = w.Flush()
	mu.Unlock()
	wg.Wait()
	if failed {
		return 1
	}
	return 0
}
