package main_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// A host-noise meter tells, during a latency benchmark, when the machine
// itself stopped running a CPU: a virtual machine's vCPU can be
// descheduled by its host for milliseconds, and no code of ours can be
// faster than that. On the 2-vCPU machine of docs/performance.md an idle
// vCPU lost 2–5 % of its time that way, 94–112 times a minute for 2.5 ms or more.
//
// With CLICK_HOSTNOISE=1 a benchmark starts one child process per CPU
// (this test binary again, COUNTERSIGN_TEST_HOSTNOISE_CPU set), pinned to
// it and run at real-time priority (SCHED_FIFO, which needs root or
// CAP_SYS_NICE): it sleeps 1 ms at a time and records each wake-up later
// than hostNoiseLate. At that priority nothing in the machine runs before
// it once its timer fires, so a late wake-up is time the CPU was not
// running at all. It costs about a thousand short wake-ups a second per
// CPU, which is why it is off unless asked for.
const (
	hostNoiseTick = time.Millisecond
	hostNoiseLate = 200 * time.Microsecond
)

// stall is an interval, in Unix nanoseconds, during which a CPU did not
// run (one late wake-up of a meter).
type stall struct{ from, to int64 }

// hostNoise is the running meter: one child per CPU.
type hostNoise struct {
	mu     sync.Mutex // guards stalls
	stalls []stall
	kids   []*hostNoiseKid
}

type hostNoiseKid struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{} // closed when its stdout is drained
}

// startHostNoise starts the meter when CLICK_HOSTNOISE is set, else
// returns nil. A meter that cannot run as described (no real-time
// priority) fails the benchmark: its figures would mix the host's stalls
// with our own contention.
func startHostNoise(b testing.TB) *hostNoise {
	b.Helper()
	if os.Getenv(envHostNoise) == "" {
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		b.Fatalf("host-noise meter: %v", err)
	}
	hn := &hostNoise{}
	b.Cleanup(func() { hn.stop() }) // also when a later child fails to start
	for cpu := range runtime.NumCPU() {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), envHostNoiseCPU+"="+strconv.Itoa(cpu), "GOMAXPROCS=1", "GOGC=off")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatalf("host-noise meter: %v", err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatalf("host-noise meter: %v", err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			b.Fatalf("host-noise meter: %v", err)
		}
		kid := &hostNoiseKid{cmd: cmd, stdin: stdin, done: make(chan struct{})}
		hn.kids = append(hn.kids, kid)
		sc := bufio.NewScanner(stdout)
		if !sc.Scan() || sc.Text() != "ready" {
			_ = stdin.Close()
			close(kid.done)
			_ = cmd.Wait()
			kid.stdin = nil // stopped
			b.Fatalf("host-noise meter on CPU %d did not start: %s", cpu, strings.TrimSpace(stderr.String()))
		}
		go func() { // ends when the child closes its stdout (stop)
			defer close(kid.done)
			for sc.Scan() {
				var s stall
				if _, err := fmt.Sscan(sc.Text(), &s.from, &s.to); err == nil {
					hn.mu.Lock()
					hn.stalls = append(hn.stalls, s)
					hn.mu.Unlock()
				}
			}
		}()
	}
	return hn
}

// stop ends the meter (again is harmless) and returns the stalls seen, by
// start.
func (hn *hostNoise) stop() []stall {
	for _, k := range hn.kids {
		if k.stdin != nil {
			_ = k.stdin.Close()
			<-k.done
			_ = k.cmd.Wait()
			k.stdin = nil
		}
	}
	hn.mu.Lock()
	defer hn.mu.Unlock()
	slices.SortFunc(hn.stalls, func(a, b stall) int { return int(a.from - b.from) })
	return slices.Clone(hn.stalls)
}

// stalledIn is how long, summed over CPUs, stalls overlapped [from, to].
func stalledIn(stalls []stall, from, to time.Time) time.Duration {
	f, t := from.UnixNano(), to.UnixNano()
	var sum int64
	for _, s := range stalls {
		if s.from >= t {
			break // sorted by start
		}
		if s.to > f {
			sum += min(s.to, t) - max(s.from, f)
		}
	}
	return time.Duration(sum)
}

// reportHostNoise adds the meter's figures to b's: host-stall-% (the share
// of the CPUs' time, from the first click to the last hit, the host took),
// quiet-samples (samples no stall overlapped) and their p99, quiet-p99-ms.
// It sets each sample's stalled.
func reportHostNoise(b *testing.B, hn *hostNoise, samples []stageSample) {
	if hn == nil || len(samples) == 0 {
		return
	}
	stalls := hn.stop()
	first, last := samples[0].click, samples[len(samples)-1].hit
	span := last.Sub(first) * time.Duration(len(hn.kids))
	b.ReportMetric(100*float64(stalledIn(stalls, first, last))/float64(span), "host-stall-%")
	var quiet []time.Duration
	for i, s := range samples {
		samples[i].stalled = stalledIn(stalls, s.click, s.hit)
		if samples[i].stalled == 0 {
			quiet = append(quiet, s.hit.Sub(s.click))
		}
	}
	b.ReportMetric(float64(len(quiet)), "quiet-samples")
	if len(quiet) > 0 {
		slices.Sort(quiet)
		b.ReportMetric(float64(quiet[len(quiet)*99/100])/float64(time.Millisecond), "quiet-p99-ms")
	}
}

// hostNoiseChild is the meter's child process on CPU cpu: it pins its
// thread to the CPU, takes real-time priority, says "ready", then writes
// each stall as "from to" (Unix nanoseconds) until its stdin closes.
func hostNoiseChild(cpu string) int {
	n, err := strconv.Atoi(cpu)
	if err != nil || n < 0 || n >= 1024 {
		fmt.Fprintf(os.Stderr, "%s=%q: not a CPU number\n", envHostNoiseCPU, cpu)
		return 2
	}
	runtime.LockOSThread()
	var mask [1024 / 64]uint64
	mask[n/64] = 1 << (n % 64)
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask))); errno != 0 {
		fmt.Fprintf(os.Stderr, "pin to CPU %d: %v\n", n, errno)
		return 2
	}
	const schedFIFO = 1
	param := struct{ priority int32 }{50}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETSCHEDULER, 0, schedFIFO, uintptr(unsafe.Pointer(&param))); errno != 0 {
		fmt.Fprintf(os.Stderr, "real-time priority (SCHED_FIFO) on CPU %d: %v; the meter needs root or CAP_SYS_NICE\n", n, errno)
		return 2
	}
	go func() { // the parent closes stdin to stop the meter
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	_ = out.Flush()
	tick := syscall.NsecToTimespec(int64(hostNoiseTick))
	for {
		t0 := time.Now()
		_ = syscall.Nanosleep(&tick, nil)
		t1 := time.Now()
		if late := t1.Sub(t0) - hostNoiseTick; late > hostNoiseLate {
			fmt.Fprintf(out, "%d %d\n", t1.Add(-late).UnixNano(), t1.UnixNano())
			_ = out.Flush()
		}
	}
}

func TestStalledIn(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(0, ms*int64(time.Millisecond)) }
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	stalls := []stall{{ms(1), ms(3)}, {ms(2), ms(4)}, {ms(10), ms(11)}} // two CPUs at once, then one
	for _, c := range []struct {
		from, to int64
		want     time.Duration
	}{
		{0, 1, 0},                    // before
		{0, 2, time.Millisecond},     // the first one's start
		{0, 5, 4 * time.Millisecond}, // both, whole
		{3, 10, time.Millisecond},    // the second one's end; the third starts as it ends
		{4, 10, 0},                   // between
		{10, 20, time.Millisecond},   // the last
		{12, 20, 0},                  // after
	} {
		if got := stalledIn(stalls, at(c.from), at(c.to)); got != c.want {
			t.Errorf("stalledIn(%d ms, %d ms) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

// TestHostNoiseMeter starts the meter as a benchmark does and stops it:
// one child per CPU, each ready at real-time priority, each gone with
// status 0 once stopped. Without CAP_SYS_NICE a child refuses to measure
// (its late wake-ups would then include our own contention) and says why.
func TestHostNoiseMeter(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(self, "-test.run=^$")
	probe.Env = append(os.Environ(), envHostNoiseCPU+"=0")
	if out, err := probe.CombinedOutput(); err != nil { // stdin is empty: it stops at once
		skipOrFail(t, "the host-noise meter cannot run here (%v): %s", err, out)
	}
	t.Setenv(envHostNoise, "1")
	hn := startHostNoise(t)
	if len(hn.kids) != runtime.NumCPU() {
		t.Fatalf("%d meters for %d CPUs", len(hn.kids), runtime.NumCPU())
	}
	hn.stop()
	for i, k := range hn.kids {
		if !k.cmd.ProcessState.Success() {
			t.Errorf("the meter of CPU %d ended %v", i, k.cmd.ProcessState)
		}
	}

	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Log("setpriv not found: the refusal without CAP_SYS_NICE is not tried")
		return
	}
	bare := exec.Command(setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", self, "-test.run=^$")
	bare.Env = append(os.Environ(), envHostNoiseCPU+"=0")
	out, err := bare.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CAP_SYS_NICE") {
		t.Errorf("a meter without CAP_SYS_NICE: %v, %q; want it to refuse and say why", err, out)
	}
}
