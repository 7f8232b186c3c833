package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/extauthz"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/store"
)

// This file: issue 49's performance acceptance for Envoy's ext_authz, as
// benchmarks (figures in docs/performance.md).

// extBenchRate is the load of BenchmarkExtAuthzAuto: checks a second.
const extBenchRate = 2000

// extBenchPolicy is extPolicy with a rate limit the benchmarks do not
// reach.
func extBenchPolicy() string {
	return strings.Replace(fmt.Sprintf(extPolicy, api.HashKey(extKey)), "rate_per_minute: 100000", "rate_per_minute: 100000000", 1)
}

// floorServer is a gRPC ext_authz server that answers OK without looking
// (hold nil), or holds every check until release is closed, counting them
// on held: what gRPC alone costs, the floor under Countersign's figures.
type floorServer struct {
	authv3.UnimplementedAuthorizationServer
	held    chan struct{}
	release chan struct{}
	// trip, when set, is one Redis round trip each Check makes before it
	// answers OK: the floor of any check that writes or reads Redis once.
	trip func(ctx context.Context) error
}

func (f *floorServer) Check(ctx context.Context, _ *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	if f.trip != nil {
		if err := f.trip(ctx); err != nil {
			return nil, err
		}
	}
	if f.held != nil {
		f.held <- struct{}{}
		select {
		case <-f.release:
		case <-ctx.Done():
		}
	}
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, nil
}

// serveFloor serves f on a loopback port and returns a client of it.
func serveFloor(b *testing.B, f *floorServer) authv3.AuthorizationClient {
	c, _ := serveFloorAt(b, f)
	return c
}

// serveFloorAt is serveFloor, also returning the server's address.
func serveFloorAt(b *testing.B, f *floorServer) (authv3.AuthorizationClient, string) {
	cc := serveGRPC(b, func(g *grpc.Server) { authv3.RegisterAuthorizationServer(g, f) })
	return authv3.NewAuthorizationClient(cc), cc.Target()
}

// serveGRPC serves a gRPC server (its services registered by register)
// on a loopback port and returns a connection to it; both end with b.
func serveGRPC(b *testing.B, register func(*grpc.Server)) *grpc.ClientConn {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	done := make(chan struct{})
	go func() { // ends when g stops
		defer close(done)
		_ = g.Serve(ln)
	}()
	b.Cleanup(func() { g.Stop(); <-done })
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	return cc
}

// openLoop sends the checks of reqs on c at rate a second (each on its
// own goroutine, started on schedule whatever the answers: an open loop,
// as a gateway's clients send) and returns each one's latency, sorted.
func openLoop(b *testing.B, c authv3.AuthorizationClient, reqs []*authv3.CheckRequest, rate int) []time.Duration {
	b.Helper()
	lat, err := sendOpenLoop(c, reqs, rate)
	if err != nil {
		b.Error(err)
	}
	return lat
}

// sendOpenLoop is openLoop, reporting the first check not allowed.
func sendOpenLoop(c authv3.AuthorizationClient, reqs []*authv3.CheckRequest, rate int) ([]time.Duration, error) {
	lat := make([]time.Duration, len(reqs))
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i, req := range reqs {
		<-tick.C
		wg.Go(func() {
			start := time.Now()
			resp, err := c.Check(context.Background(), req)
			lat[i] = time.Since(start)
			if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
				e := fmt.Errorf("check %d = %v, %v; want allowed", i, resp, err)
				failed.CompareAndSwap(nil, &e)
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	if e := failed.Load(); e != nil {
		return lat, *e
	}
	return lat, nil
}

// envExtLoad, set to "address checks rate", makes the test binary the
// client process of BenchmarkExtAuthzAuto's second measure (extLoadChild).
const envExtLoad = "COUNTERSIGN_TEST_EXTLOAD"

// remoteLoop is openLoop from another process, as a gateway is: the test
// binary run as extLoadChild against addr sends 200 checks (a warm-up on
// its own connection), then n, and writes their latencies.
func remoteLoop(b *testing.B, addr string, n, rate int) []time.Duration {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", envExtLoad, addr, n, rate))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("the client process: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	lat := make([]time.Duration, 0, n)
	for f := range strings.FieldsSeq(string(out)) {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("the client process wrote %q: %v", f, err)
		}
		lat = append(lat, time.Duration(ns))
	}
	if len(lat) != n {
		b.Fatalf("the client process wrote %d latencies, want %d", len(lat), n)
	}
	return lat
}

// extLoadChild is remoteLoop's client process: spec is envExtLoad's
// value. It sends the auto-allowed check BenchmarkExtAuthzAuto sends and
// writes each latency in nanoseconds, one a line, sorted.
func extLoadChild(spec string) int {
	var addr string
	var n, rate int
	if _, err := fmt.Sscan(spec, &addr, &n, &rate); err != nil || n <= 0 || rate <= 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want \"address checks rate\"\n", envExtLoad, spec)
		return 2
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	c := authv3.NewAuthorizationClient(cc)
	lat, err := sendOpenLoop(c, extAutoChecks(200, 1_000_000), rate)
	if err == nil {
		lat, err = sendOpenLoop(c, extAutoChecks(n, 0), rate)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	for _, d := range lat {
		fmt.Fprintln(out, int64(d))
	}
	if err := out.Flush(); err != nil {
		return 1
	}
	return 0
}

// extAutoChecks are the n checks BenchmarkExtAuthzAuto sends: tools/calls
// of the lookup tool (review never), as Envoy forwards them, each its own
// call (JSON-RPC ids from first + 1 on, as a gateway carries 2,000
// different calls a second: the same call sent again is a retry, which
// the API takes in turn, under the call's lock).
func extAutoChecks(n, first int) []*authv3.CheckRequest {
	reqs := make([]*authv3.CheckRequest, n)
	for i := range reqs {
		reqs[i] = envoyCheck(toolCall(first+i+1, "lookup", `{"q":"1234"}`), true, extHeaders)
	}
	return reqs
}

func pct(sorted []time.Duration, p float64) float64 {
	i := min(len(sorted)-1, int(float64(len(sorted))*p))
	return float64(sorted[i].Microseconds()) / 1000
}

// BenchmarkExtAuthzAuto: an auto-allowed check (the lookup tool, review
// never: no card, audited through the /v1 API on Redis) from a real gRPC
// client on this machine, b.N checks at 2,000 a second in an open loop,
// against a floor server answering OK without looking, measured in the
// same run (the floor first, then Countersign, each after a warm-up of
// 200 checks), with the collector's settings serve runs with (asServed).
//
// The client is measured twice. In another process, as a gateway is
// (remoteLoop: the test binary run as the client): p50-ms, p99-ms and
// floor-p50-ms, floor-p99-ms, the figures of issue 49's goal (p50 within
// 0.5 ms of the floor's, p99 at most twice the floor's). In this process
// (openLoop, the client sharing the server's scheduler): inproc-p50-ms,
// inproc-p99-ms, inproc-floor-p50-ms, inproc-floor-p99-ms.
// cpu-ms/check and floor-cpu-ms/check are this process's CPU time per
// check of the in-process measure (both ends of the gRPC call), steadier
// than the latencies. trip-p50-ms and trip-p99-ms are those of a floor
// server that makes one Redis round trip (a read that finds nothing)
// before it answers OK, from the other process: what one round trip, the
// least an audited check makes, costs on this machine. audit-p50-ms and
// audit-p99-ms are those of a floor server that writes what the
// auto-allowed check writes (its two audit entries, through the store's
// Ledger.AppendNew: one script call) before it answers OK, from the other
// process: the least an audited check can cost here, with none of the
// check's reading, policy or API. trips/check are
// Countersign's round trips to Redis per check (a pipeline or a script
// call is one), in the in-process measure.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign -run '^$' -bench ExtAuthzAuto -benchtime 6000x
func BenchmarkExtAuthzAuto(b *testing.B) {
	asServed(b)
	w := newExtWorldWith(b, extBenchPolicy(), extauthz.Options{})
	floor, floorAddr := serveFloorAt(b, &floorServer{})
	n := max(b.N, 200)
	warm, reqs := extAutoChecks(200, 2_000_000), extAutoChecks(n, 3_000_000)
	b.ResetTimer()
	_, tripAddr := serveFloorAt(b, &floorServer{trip: func(ctx context.Context) error {
		_, err := w.store.Request(ctx, "no-such-request") // one HGETALL, found empty
		if errors.Is(err, approval.ErrNotFound) {
			err = nil
		}
		return err
	}})
	// The audit floor: each Check writes what an auto-allowed check writes
	// (its two entries, only while no request has the call's id) and
	// answers OK: the least an audited check can do.
	floorAudit := store.NewLedger(w.store, store.NewAudit(w.rdb, store.AuditOptions{Stream: w.prefix + ":{audit-floor}"}))
	_, auditAddr := serveFloorAt(b, &floorServer{trip: func(ctx context.Context) error {
		id := approval.NewID("req")
		callID := extauthz.CallID("extauthz-", []byte(id))
		_, err := floorAudit.AppendNew(ctx, id,
			approval.Record{RequestID: id, RunID: "sess-1", Actor: "gate", Tool: "lookup", Event: approval.EventAssessed, Data: approval.AssessedEvent{CallID: callID, Quorum: 1}},
			approval.Record{RequestID: id, RunID: "sess-1", Actor: "gate", Tool: "lookup", Event: approval.EventAutoApproved, Data: approval.CallEvent{CallID: callID}})
		return err
	}})
	tr := remoteLoop(b, tripAddr, n, extBenchRate)
	rfl := remoteLoop(b, floorAddr, n, extBenchRate)
	rcs := remoteLoop(b, w.addr, n, extBenchRate)
	ta := remoteLoop(b, auditAddr, n, extBenchRate) // after: its allocation is no debt of the others'

	openLoop(b, floor, warm, extBenchRate)
	c0 := processCPU()
	fl := openLoop(b, floor, reqs, extBenchRate)
	c1 := processCPU()
	openLoop(b, w.conn, warm, extBenchRate)
	c2, t2 := processCPU(), w.trips.N.Load()
	cs := openLoop(b, w.conn, reqs, extBenchRate)
	c3, t3 := processCPU(), w.trips.N.Load()
	b.StopTimer()
	if w.cards.Load() != 0 {
		b.Errorf("%d cards went up for an auto-allowed tool", w.cards.Load())
	}
	b.ReportMetric(pct(rcs, 0.50), "p50-ms")
	b.ReportMetric(pct(rcs, 0.99), "p99-ms")
	b.ReportMetric(pct(rfl, 0.50), "floor-p50-ms")
	b.ReportMetric(pct(rfl, 0.99), "floor-p99-ms")
	b.ReportMetric(pct(cs, 0.50), "inproc-p50-ms")
	b.ReportMetric(pct(cs, 0.99), "inproc-p99-ms")
	b.ReportMetric(pct(fl, 0.50), "inproc-floor-p50-ms")
	b.ReportMetric(pct(fl, 0.99), "inproc-floor-p99-ms")
	b.ReportMetric(pct(tr, 0.50), "trip-p50-ms")
	b.ReportMetric(pct(tr, 0.99), "trip-p99-ms")
	b.ReportMetric(pct(ta, 0.50), "audit-p50-ms")
	b.ReportMetric(pct(ta, 0.99), "audit-p99-ms")
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) }
	b.ReportMetric(ms(c3-c2), "cpu-ms/check")
	b.ReportMetric(ms(c1-c0), "floor-cpu-ms/check")
	b.ReportMetric(float64(t3-t2)/float64(n), "trips/check")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkExtAuthzHeld: what a held check costs while a person has not
// decided. n checks of the refund tool (review always) are held from one
// gRPC client connection, and again n on a floor server whose Check only
// blocks; both sides are in this process, so Countersign's cost is the
// difference: extra-goroutines/check (the goal: 0, the gRPC handler's own
// goroutine being the only one, as the floor's), extra-heap-KiB/check and
// extra-stack-KiB/check (the goal: ≤ 8 KiB together), after a GC once all
// are held (and three collections, which shrink the stacks that grew
// while each request was made). held-heap-KiB/check and
// floor-heap-KiB/check are the totals.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign -run '^$' -bench ExtAuthzHeld -benchtime 1x
func BenchmarkExtAuthzHeld(b *testing.B) {
	const n = 2000
	for range b.N {
		f := &floorServer{held: make(chan struct{}, n), release: make(chan struct{})}
		floor := serveFloor(b, f)
		req := envoyCheck(toolCall(7, "lookup", `{}`), true, extHeaders)
		benchHeld(b, n, func(ctx context.Context) func() { return func() { _, _ = floor.Check(ctx, req) } },
			f.held, func() { close(f.release) },
			func(w *extWorld, ctx context.Context, i int) func() {
				req := envoyCheck(toolCall(i, "refund", fmt.Sprintf(`{"order_id":"%d","amount":30}`, i)), true, extHeaders)
				return func() { _, _ = w.conn.Check(ctx, req) }
			})
	}
	b.ReportMetric(0, "ns/op")
}

// benchHeld reports what a held check costs (the held benchmarks'
// metrics): n calls held on a floor (floorCall's, each counted on held
// once it blocks, all ended by release), then n refund calls held by
// Countersign in a test world (call's i-th, i from 1), the difference
// Countersign's: extra-goroutines/check, extra-heap-KiB/check,
// extra-stack-KiB/check, and the totals held-heap-KiB/check,
// floor-heap-KiB/check and floor-goroutines/check.
func benchHeld(b *testing.B, n int, floorCall func(ctx context.Context) func(), held <-chan struct{}, release func(), call func(w *extWorld, ctx context.Context, i int) func()) {
	b.Helper()
	fg, fheap, fstack := holdCalls(b, floorCall, n, func() {
		for range n {
			<-held
		}
	}, release)

	w := newExtWorldWith(b, extBenchPolicy(), extauthz.Options{})
	go func() { // drains the cards' ids; ends when the world's test ends
		for range w.posted {
		}
	}()
	i := 0
	var mu sync.Mutex
	cg, cheap, cstack := holdCalls(b, func(ctx context.Context) func() {
		mu.Lock()
		defer mu.Unlock()
		i++
		return call(w, ctx, i)
	}, n, func() {
		for w.waits.n.Load() < int64(n) {
			time.Sleep(10 * time.Millisecond) // pacing a poll of a counter, not a synchronisation of the code measured
		}
	}, nil)
	b.ReportMetric(float64(cg-fg)/float64(n), "extra-goroutines/check")
	b.ReportMetric((cheap-fheap)/float64(n)/1024, "extra-heap-KiB/check")
	b.ReportMetric((cstack-fstack)/float64(n)/1024, "extra-stack-KiB/check")
	b.ReportMetric(cheap/float64(n)/1024, "held-heap-KiB/check")
	b.ReportMetric(fheap/float64(n)/1024, "floor-heap-KiB/check")
	b.ReportMetric(float64(fg)/float64(n), "floor-goroutines/check")
}

// holdCalls starts n calls, waits until allHeld returns, and measures
// the goroutines, heap and stack they added to the process, then ends
// them (release, or by cancelling them) and waits for their answers.
// call(ctx) prepares one call and returns it, to be made on a goroutine
// of its own.
func holdCalls(b *testing.B, call func(ctx context.Context) func(), n int, allHeld, release func()) (goroutines int, heap, stack float64) {
	b.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(call(ctx))
	}
	allHeld()
	// A held check's stack grew while its request was made; the
	// collector halves an idle goroutine's stack while it uses under a
	// quarter of it, once a cycle: three cycles, as a server running for
	// a while has had by the time a person decides.
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&after)
	goroutines = runtime.NumGoroutine() - g0
	heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
	stack = float64(after.StackInuse) - float64(before.StackInuse)
	if release != nil {
		release()
	}
	cancel()
	wg.Wait()
	return goroutines, heap, stack
}

// BenchmarkExtAuthzHTTPHeld: BenchmarkExtAuthzHeld for Envoy's HTTP
// variant (http_service): n refund checks held, each on a connection of
// its own as Envoy's HTTP/1.1 client sends them, against a floor HTTP
// server whose handler only blocks; the client is in the process for
// both, so the difference is Countersign's (goal ≤ 8 KiB together, no
// goroutine more than the floor's).
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign -run '^$' -bench ExtAuthzHTTPHeld -benchtime 1x
func BenchmarkExtAuthzHTTPHeld(b *testing.B) {
	const n = 1000
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	post := func(ctx context.Context, url, body string) func() {
		return func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range extHeaders {
				req.Header.Set(k, v)
			}
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
	}
	for range b.N {
		held, release := make(chan struct{}, n), make(chan struct{})
		floor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			held <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		b.Cleanup(floor.Close)
		body := toolCall(7, "refund", `{"order_id":"7","amount":30}`)
		benchHeld(b, n, func(ctx context.Context) func() { return post(ctx, floor.URL+"/mcp", body) },
			held, func() { close(release) },
			func(w *extWorld, ctx context.Context, i int) func() {
				return post(ctx, w.base+server.PathExtAuthz+"mcp", toolCall(i, "refund", fmt.Sprintf(`{"order_id":"%d","amount":30}`, i)))
			})
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkExtAuthzSerial: one auto-allowed check at a time (the lookup
// tool, as BenchmarkExtAuthzAuto sends it, each a different call), from a
// gRPC client in this process, against the floor server: what a check
// costs with nothing queued. B/op and allocs/op are both ends of the gRPC
// call (the client's are the floor's), ns/op the round trip; Countersign's
// cost is cs less floor. reads/check and writes/check are this process's
// system calls (both ends of the gRPC call, and the Redis client's; Linux
// only): on a virtual machine each write to a socket wakes its reader on
// another vCPU, among a check's dearest steps. Steadier than the open
// loop's latencies, it shows a change of a few microseconds, a kilobyte
// or a system call a check.
//
//	REDIS_URL=redis://127.0.0.1:6379/0 go test ./cmd/countersign -run '^$' -bench ExtAuthzSerial -benchtime 5000x
func BenchmarkExtAuthzSerial(b *testing.B) {
	asServed(b)
	w := newExtWorldWith(b, extBenchPolicy(), extauthz.Options{})
	floor := serveFloor(b, &floorServer{})
	for _, tt := range []struct {
		name string
		c    authv3.AuthorizationClient
	}{{"floor", floor}, {"cs", w.conn}} {
		first := 5_000_000
		b.Run(tt.name, func(b *testing.B) {
			reqs := extAutoChecks(b.N, first)
			first += b.N // never the same call twice: a retry waits its turn
			b.ReportAllocs()
			b.ResetTimer()
			r0, w0, ok0 := processSyscalls()
			for _, req := range reqs {
				res, err := tt.c.Check(context.Background(), req)
				if err != nil || res.GetStatus().GetCode() != int32(codes.OK) {
					b.Fatalf("Check = %v, %v; want allowed", res.GetStatus(), err)
				}
			}
			b.StopTimer()
			if r1, w1, ok1 := processSyscalls(); ok0 && ok1 {
				b.ReportMetric(float64(r1-r0)/float64(b.N), "reads/check")
				b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/check")
			}
		})
	}
}
