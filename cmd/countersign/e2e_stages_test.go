package main_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// roundTrips is a go-redis hook that records, while on, each command or
// pipeline sent to Redis (one round trip each) and each dial, with when it
// started and ended: the round trips a click costs, counted whatever the
// machine's load, and where its time goes between them.
type roundTrips struct {
	prefix string // the deployment's key prefix, cut from the labels

	mu      sync.Mutex // guards on, trips and clicked
	on      bool
	trips   []trip
	clicked string // the request clicked: labelled {id}, any other {other}
}

// trip is one round trip (or dial) seen by roundTrips.
type trip struct {
	what       string
	start, end time.Time
}

var _ redis.Hook = (*roundTrips)(nil)

func (rt *roundTrips) record(what string, start time.Time) {
	end := time.Now()
	rt.mu.Lock()
	if rt.on {
		rt.trips = append(rt.trips, trip{what: what, start: start, end: end})
	}
	rt.mu.Unlock()
}

// start turns recording on with nothing recorded; stop turns it off and
// returns what was recorded.
func (rt *roundTrips) start(clicked string) {
	rt.mu.Lock()
	rt.on, rt.trips, rt.clicked = true, rt.trips[:0], clicked
	rt.mu.Unlock()
}

func (rt *roundTrips) stop() []trip {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.on = false
	return slices.Clone(rt.trips)
}

func (rt *roundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		t := time.Now()
		c, err := next(ctx, network, addr)
		rt.record("dial", t)
		return c, err
	}
}

func (rt *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t := time.Now()
		err := next(ctx, cmd)
		rt.record(rt.label(cmd)+caller(), t)
		return err
	}
}

func (rt *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t := time.Now()
		err := next(ctx, cmds)
		labels := make([]string, len(cmds))
		for i, c := range cmds {
			labels[i] = rt.label(c)
		}
		rt.record("pipe("+strings.Join(labels, ",")+")"+caller(), t)
		return err
	}
}

// label names a command by its name and first key, the key's prefix and
// request id cut ("evalsha req", "evalsha {audit}").
func (rt *roundTrips) label(cmd redis.Cmder) string {
	args := cmd.Args()
	name := strings.ToLower(cmd.Name())
	key := ""
	switch name {
	case "evalsha", "eval", "evalsha_ro", "eval_ro":
		if len(args) > 3 {
			key, _ = args[3].(string)
		}
	default:
		if len(args) > 1 {
			key, _ = args[1].(string)
		}
	}
	key = strings.TrimPrefix(key, rt.prefix+":")
	if strings.HasSuffix(key, "{audit}") {
		// An audit append: about which request (its request_id field)?
		for i := 4; i+1 < len(args); i++ {
			if f, _ := args[i].(string); f == "request_id" {
				id, _ := args[i+1].(string)
				key += " " + rt.which(id)
				break
			}
		}
	}
	if i := strings.Index(key, "{run_"); i >= 0 {
		if j := strings.IndexByte(key[i:], '}'); j > 0 {
			key = key[:i] + "{run}" + key[i+j+1:] // any run: not the click's path
		}
	}
	if i := strings.Index(key, "{req_"); i >= 0 {
		if j := strings.IndexByte(key[i:], '}'); j > 0 {
			key = key[:i] + rt.which(key[i+1:i+j]) + key[i+j+1:]
		}
	}
	return name + " " + key
}

// which names request id in a label: {id} for the request clicked,
// {other} for any other, {} for none.
func (rt *roundTrips) which(id string) string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	switch id {
	case "":
		return "{}"
	case rt.clicked:
		return "{id}"
	}
	return "{other}"
}

// stageReport prints to stderr, when CLICK_STAGES is set, the p50/p90/p99
// of every gap between consecutive events of the samples whose path (the
// round trips about the clicked request and the audit stream) is the
// commonest one, then the median and the slowest 1% of samples event by
// event (every round trip, path or not), as ms from the click, and when
// metered (CLICK_HOSTNOISE) the slowest 1% of the samples no host stall
// touched:
//
//	CLICK_STAGES=1 REDIS_URL=… /tmp/cmd.test -test.run '^$' -test.bench 'ClickToTool/pending=0$' -test.benchtime 1000x
func stageReport(name string, samples []stageSample, metered bool) {
	if os.Getenv("CLICK_STAGES") == "" || len(samples) == 0 {
		return
	}
	w := os.Stderr
	seqs := map[string]int{}
	for _, s := range samples {
		seqs[s.sequence()]++
	}
	common, n := "", 0
	for s, c := range seqs {
		if c > n {
			common, n = s, c
		}
	}
	fmt.Fprintf(w, "\n== %s: %d samples, %d distinct sequences; commonest (%d): %s\n", name, len(samples), len(seqs), n, common)
	for s, c := range seqs {
		if s != common {
			fmt.Fprintf(w, "   other (%d): %s\n", c, s)
		}
	}
	// Gaps of the commonest sequence.
	var gaps [][]time.Duration
	var names []string
	for _, s := range samples {
		if s.sequence() != common {
			continue
		}
		ev := s.events(false)
		if gaps == nil {
			gaps = make([][]time.Duration, len(ev)-1)
			for i := 1; i < len(ev); i++ {
				names = append(names, ev[i].name)
			}
		}
		for i := 1; i < len(ev); i++ {
			gaps[i-1] = append(gaps[i-1], ev[i].at.Sub(ev[i-1].at))
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Fprintf(w, "%-60s %8s %8s %8s\n", "gap ending at", "p50", "p90", "p99")
	var sum50 float64
	for i, g := range gaps {
		slices.Sort(g)
		sum50 += ms(g[len(g)/2])
		fmt.Fprintf(w, "%-60s %8.3f %8.3f %8.3f\n", clipTo(names[i], 60), ms(g[len(g)/2]), ms(g[len(g)*9/10]), ms(g[len(g)*99/100]))
	}
	fmt.Fprintf(w, "sum of p50s %.3f\n", sum50)
	// Samples whose window (click to hit) held round trips off the path:
	// other work of the process sharing the machine with the click.
	var quiet, busy []time.Duration
	others := map[string]int{}
	for _, s := range samples {
		n := 0
		for _, t := range s.trips {
			if !t.start.After(s.hit) && !t.onPath() {
				others[t.what]++
				n++
			}
		}
		if n == 0 {
			quiet = append(quiet, s.hit.Sub(s.click))
		} else {
			busy = append(busy, s.hit.Sub(s.click))
		}
	}
	for _, g := range []struct {
		name string
		ds   []time.Duration
	}{{"without other round trips", quiet}, {"with other round trips", busy}} {
		if len(g.ds) > 0 {
			slices.Sort(g.ds)
			fmt.Fprintf(w, "samples %s in their window: %d, p50 %.3f, p99 %.3f ms\n", g.name, len(g.ds), ms(g.ds[len(g.ds)/2]), ms(g.ds[len(g.ds)*99/100]))
		}
	}
	for what, n := range others {
		fmt.Fprintf(w, "   %4d × %s\n", n, what)
	}
	// The slowest samples, event by event.
	byTotal := slices.Clone(samples)
	slices.SortFunc(byTotal, func(a, b stageSample) int { return int(a.hit.Sub(a.click) - b.hit.Sub(b.click)) })
	show := func(s stageSample, label string) {
		fmt.Fprintf(w, "-- %s: %.3f ms", label, ms(s.hit.Sub(s.click)))
		if s.stalled > 0 {
			fmt.Fprintf(w, " (the host stalled CPUs %.3f ms in it)", ms(s.stalled))
		}
		fmt.Fprintln(w)
		for _, e := range s.events(true) {
			fmt.Fprintf(w, "   %8.3f %s\n", ms(e.at.Sub(s.click)), e.name)
		}
	}
	show(byTotal[len(byTotal)/2], "median sample")
	for i := len(byTotal) - 1; i >= 0 && i >= len(byTotal)-len(byTotal)/100-1; i-- {
		show(byTotal[i], "slow sample")
	}
	if !metered {
		return
	}
	// With the host-noise meter, the slowest of the samples no host stall
	// touched: what is left to our code and the guest.
	var still []stageSample
	for _, s := range byTotal {
		if s.stalled == 0 {
			still = append(still, s)
		}
	}
	for i := len(still) - 1; i >= 0 && i >= len(still)-len(still)/100-1; i-- {
		show(still[i], "slow sample no host stall touched")
	}
}

func clipTo(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// stageSample is one click: when it started, was acked, hit the system of
// record, and the round trips in between.
type stageSample struct {
	click, ack, hit time.Time
	trips           []trip
	stalled         time.Duration // the host's stalls in the window, with CLICK_HOSTNOISE (reportHostNoise)
}

type stageEvent struct {
	name string
	at   time.Time
}

// events are the sample's instants in order: the click, Click's return,
// each round trip's start and end (only the path's unless all), the hit;
// round trips starting after the hit are left out.
func (s stageSample) events(all bool) []stageEvent {
	ev := []stageEvent{{"click", s.click}, {"Click returned", s.ack}, {"sor hit", s.hit}}
	for _, t := range s.trips {
		if t.start.After(s.hit) || !all && !t.onPath() {
			continue
		}
		ev = append(ev, stageEvent{"> " + t.what, t.start}, stageEvent{"< " + t.what, t.end})
	}
	slices.SortStableFunc(ev, func(a, b stageEvent) int { return a.at.Compare(b.at) })
	return ev
}

// sequence names the sample's path events in order.
func (s stageSample) sequence() string {
	var names []string
	for _, e := range s.events(false) {
		names = append(names, e.name)
	}
	return strings.Join(names, " | ")
}

// pathTrips counts the round trips on the path started before the hit.
func (s stageSample) pathTrips() int {
	n := 0
	for _, t := range s.trips {
		if !t.start.After(s.hit) && t.onPath() {
			n++
		}
	}
	return n
}

// onPath reports whether t is about the clicked request (its reads and
// transitions, its audit entries): the other requests' reads and entries,
// run leases and the expiry sweep are not the click's, and neither is the
// wake hub's re-read of the clicked request once its subscription is
// confirmed (a pipeline of HGET and EXISTS), which may still be under way
// when parkedOn sees the subscription.
func (t trip) onPath() bool {
	return strings.Contains(t.what, "{id}") && !strings.HasPrefix(t.what, "pipe(hget ")
}

// traceCallers: with CLICK_STAGES set, each round trip is labelled with
// the function of ours that made it.
var traceCallers = os.Getenv("CLICK_STAGES") != ""

// caller names the first function of ours outside the store (and the
// benchmark) that led to a command, when traceCallers.
func caller() string {
	if !traceCallers {
		return ""
	}
	pc := make([]uintptr, 40)
	n := runtime.Callers(3, pc)
	frames := runtime.CallersFrames(pc[:n])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "countersign/countersign/") && !strings.Contains(f.Function, "countersign/store.") && !strings.Contains(f.Function, "main_test.") {
			return " @" + f.Function[strings.LastIndex(f.Function, "/")+1:]
		}
		if !more {
			return ""
		}
	}
}
