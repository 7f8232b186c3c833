package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// requireBinaries skips the test naming what is missing, or fails under
// CI=true, where nothing may be skipped for want of a tool.
func requireBinaries(tb testing.TB, names ...string) {
	tb.Helper()
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("this test starts its own Redis processes and needs %s on PATH (Debian: apt-get install redis-server redis-sentinel)", strings.Join(missing, ", "))
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg + " — required under CI=true")
	}
	tb.Skip("SKIPPED: " + msg)
}

// freePort returns a TCP port nobody listened on a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis runs bin with a config file in its own temp dir and returns
// its port; the process is killed (by its pid) in tb.Cleanup.
func startRedis(tb testing.TB, bin, config string) int {
	tb.Helper()
	return startRedisOn(tb, bin, freePort(tb), config)
}

// startRedisOn is startRedis on a port chosen by the caller.
func startRedisOn(tb testing.TB, bin string, port int, config string) int {
	tb.Helper()
	dir := tb.TempDir()
	conf := filepath.Join(dir, "redis.conf")
	full := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsave \"\"\nappendonly no\nlogfile %s\n%s\n",
		port, dir, filepath.Join(dir, "log"), config)
	if err := os.WriteFile(conf, []byte(full), 0o600); err != nil {
		tb.Fatal(err)
	}
	args := []string{conf}
	if bin == "redis-sentinel" {
		args = append(args, "--sentinel")
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if tb.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "log")); err == nil {
				tb.Logf("%s on %d log:\n%s", bin, port, b)
			}
		}
	})
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	defer c.Close()
	eventually(tb, 20*time.Second, bin+" answers PING", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
	return port
}

// eventually polls an outside process's state until ok or the bound. It
// waits on other processes (Redis, Sentinel), never on this test's own
// goroutines.
func eventually(tb testing.TB, bound time.Duration, what string, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %s", bound, what)
		}
		<-tick.C
	}
}

// sentinelSetup is 1 master, 1 replica and 3 sentinels on spare ports.
type sentinelSetup struct {
	master, replica int
	sentinels       []string
	name            string
}

func startSentinels(tb testing.TB) sentinelSetup {
	tb.Helper()
	requireBinaries(tb, "redis-server", "redis-sentinel")
	ctx := context.Background()
	su := sentinelSetup{name: "cstest"}
	const fastSync = "repl-diskless-sync-delay 0" // a replica (re)syncs at once
	su.master = startRedis(tb, "redis-server", fastSync)
	su.replica = startRedis(tb, "redis-server", fmt.Sprintf("%s\nreplicaof 127.0.0.1 %d", fastSync, su.master))
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(su.replica)})
	defer rc.Close()
	eventually(tb, 20*time.Second, "replica in sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	// Each sentinel is told its id, the replica and the other two (the
	// lines Sentinel writes into its own config once it has found them):
	// otherwise they find each other through hello messages every 2 s.
	ports := []int{freePort(tb), freePort(tb), freePort(tb)}
	ids := make([]string, len(ports))
	for i := range ids {
		ids[i] = fmt.Sprintf("%040x", i+1)
	}
	for i, port := range ports {
		conf := fmt.Sprintf("sentinel myid %s\nsentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %[2]s 1000\n"+
			"sentinel failover-timeout %[2]s 5000\nsentinel parallel-syncs %[2]s 1\nsentinel known-replica %[2]s 127.0.0.1 %[4]d",
			ids[i], su.name, su.master, su.replica)
		for j, other := range ports {
			if j != i {
				conf += fmt.Sprintf("\nsentinel known-sentinel %s 127.0.0.1 %d %s", su.name, other, ids[j])
			}
		}
		startRedisOn(tb, "redis-sentinel", port, conf)
		su.sentinels = append(su.sentinels, "127.0.0.1:"+strconv.Itoa(port))
	}
	for _, addr := range su.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		eventually(tb, 30*time.Second, "sentinel "+addr+" knows the replica and the other sentinels", func() bool {
			reps, err1 := sc.Replicas(ctx, su.name).Result()
			sens, err2 := sc.Sentinels(ctx, su.name).Result()
			return err1 == nil && err2 == nil && len(reps) == 1 && len(sens) == 2
		})
		_ = sc.Close()
	}
	return su
}

// client is a failover client through the sentinels, built the way
// cmd/countersign builds one from a Sentinel REDIS_URL (UniversalOptions
// with MasterName).
func (su sentinelSetup) client(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: su.sentinels, MasterName: su.name})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSentinelFailoverWhileWaiting: requests wait in two processes on a
// Sentinel-managed master; half are decided before SENTINEL FAILOVER, half
// while it runs (retried until acknowledged: recorded and, with
// WaitReplicas, on the replica). Every wait resumes with its decision, no
// acknowledged decision is lost, and every approved request is claimed
// exactly once across the two processes.
func TestSentinelFailoverWhileWaiting(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	su := startSentinels(t)
	ctx := context.Background()
	prefix := storetest.Prefix(t)
	const n = 20
	type process struct {
		s     *store.Store
		watch *hubWatch
	}
	var procs []process
	logs := &warnings{}
	for range 2 {
		watch := newHubWatch(n)
		// As a Sentinel deployment runs (docs/deploy.md): a claim counts
		// once the replica has it, so a failover cannot lose one.
		s := store.New(su.client(t), store.Options{Prefix: prefix, BlockTimeout: 200 * time.Millisecond, Logger: slog.New(logs),
			WaitReplicas: 1})
		store.SetHubHooks(s, watch.hooks())
		t.Cleanup(func() { _ = s.Close() })
		procs = append(procs, process{s, watch})
	}
	// The clicker's replica records decisions and waits for the replica.
	clicker := store.New(su.client(t), store.Options{Prefix: prefix, WaitReplicas: 1})
	t.Cleanup(func() { _ = clicker.Close() })

	rs := make([]*approval.Request, n)
	for i := range rs {
		rs[i] = request(t, func(r *approval.Request) { r.Deadline = time.Now().Add(time.Hour) })
		if err := clicker.CreateRequest(ctx, rs[i]); err != nil {
			t.Fatalf("CreateRequest = %v", err)
		}
	}
	type result struct {
		proc int
		waitResult
	}
	results := make(chan result, 2*n)
	var claims atomic.Int64
	var wg sync.WaitGroup
	for pi, p := range procs {
		for _, r := range rs {
			wg.Go(func() {
				wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				got, err := p.s.Wait(wctx, r.ID)
				// approved, or executing when the other process claimed first
				if err == nil && got.Decision != nil && got.Decision.Verdict == approval.VerdictApprove {
					// What the agent does next: claim the execution. Retried
					// through the failover (a claim the replica did not
					// confirm is withdrawn: ErrClaimNotConfirmed, claim
					// again); at most one process may win.
					for {
						_, cerr := p.s.Claim(wctx, r.ID, fmt.Sprintf("proc%d", pi), "", "")
						if cerr == nil {
							claims.Add(1)
							break
						}
						if errors.Is(cerr, approval.ErrAlreadyClaimed) || wctx.Err() != nil {
							break
						}
						time.Sleep(50 * time.Millisecond) // Redis is failing over: back off
					}
				}
				results <- result{pi, waitResult{got, err}}
			})
		}
	}
	for _, p := range procs {
		p.watch.await(t, time.Minute)
	}

	// acknowledge decides r until the decision is recorded and replicated
	// (Decide, then the wake-up with WAIT), as the clicker would be told.
	var retries atomic.Int64
	acknowledge := func(r *approval.Request) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			_, err := decide(dctx, clicker, decision(r, approval.VerdictApprove, "U1"))
			if err == nil || errors.Is(err, approval.ErrAlreadyDecided) {
				if err = store.PushWake(dctx, clicker, r.ID, approval.StatusApproved); err == nil {
					return
				}
			}
			if dctx.Err() != nil {
				t.Fatalf("decision on %s never acknowledged: %v", r.ID, err)
			}
			retries.Add(1)
			time.Sleep(50 * time.Millisecond) // Redis is failing over: back off
		}
	}
	for _, r := range rs[:n/2] {
		acknowledge(r)
	}

	sc := redis.NewSentinelClient(&redis.Options{Addr: su.sentinels[0]})
	defer sc.Close()
	if err := sc.Failover(ctx, su.name).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER = %v", err)
	}
	// Sentinel turns the old master into a replica of the new one only
	// when its 10-second INFO poll notices it, and until then no write
	// reaches WaitReplicas. Do what an operator's failover hook does:
	// point the old master at the new one as soon as Sentinel has
	// switched. (Sentinel's own REPLICAOF later is the same command.)
	demoted := make(chan error, 1)
	pctx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go func() { // exits once it has demoted the old master, or when the test ends
		old := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(su.master)})
		defer old.Close()
		poll := time.NewTicker(50 * time.Millisecond)
		defer poll.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-poll.C:
			}
			addr, err := sc.GetMasterAddrByName(ctx, su.name).Result()
			if err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(su.replica) {
				demoted <- old.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(su.replica)).Err()
				return
			}
		}
	}()
	// Spread the other half over the failover (about a second here), so
	// some land before the switch, some during it, some after.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for _, r := range rs[n/2:] {
		<-tick.C
		acknowledge(r)
	}
	select {
	case err := <-demoted:
		if err != nil {
			t.Fatalf("REPLICAOF on the old master after the failover = %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("not within 1m0s: the replica is the new master")
	}

	for range 2 * n {
		select {
		case res := <-results:
			if res.err != nil || res.r.Decision == nil || res.r.Decision.Verdict != approval.VerdictApprove {
				t.Errorf("process %d: Wait = %+v, %v; want approved", res.proc, res.r, res.err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("waits did not resume after the failover")
		}
	}
	wg.Wait()
	t.Logf("decisions retried during the failover: %d; hub log: %q", retries.Load(), logs.all())
	if got := claims.Load(); got != n {
		t.Errorf("claims won across both processes = %d, want %d (each request exactly once)", got, n)
	}
	// Every acknowledged decision is on the new master.
	for _, r := range rs {
		got, err := clicker.Request(ctx, r.ID)
		if err != nil || got.Decision == nil || got.Decision.Approver != "U1" {
			t.Errorf("Request(%s) after the failover = %+v, %v; want U1's approval", r.ID, got, err)
		}
	}
}

// TestClaimSplitBrainAtMostOnce is the failover that can run a request
// twice, step by step: a replica is promoted (as Sentinel does, REPLICAOF
// NO ONE) while a process still reaches the old master and claims there;
// the old master is then demoted and its writes lost; a process on the
// new master claims too. With WaitReplicas the first claim is not
// confirmed (the replica that would confirm it is gone) and is withdrawn,
// so exactly one claim wins: before claims waited for replicas, both won.
func TestClaimSplitBrainAtMostOnce(t *testing.T) {
	t.Parallel() // waits on other processes
	requireBinaries(t, "redis-server")
	ctx := context.Background()
	const fastSync = "repl-diskless-sync-delay 0"
	master := startRedis(t, "redis-server", fastSync)
	replica := startRedis(t, "redis-server", fmt.Sprintf("%s\nreplicaof 127.0.0.1 %d", fastSync, master))
	mc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(master)})
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(replica)})
	t.Cleanup(func() { _, _ = mc.Close(), rc.Close() })
	info := func(c *redis.Client, want string) func() bool {
		return func() bool {
			s, err := c.Info(ctx, "replication").Result()
			return err == nil && strings.Contains(s, want)
		}
	}
	eventually(t, 20*time.Second, "replica in sync", info(rc, "master_link_status:up"))

	// The replica confirms what it has within the WAIT's timeout
	// (generous: the machine may be loaded); the old master's claim has
	// nobody to confirm it, so its WAITs run out (short: they always do).
	prefix := storetest.Prefix(t)
	confirmed := store.Options{Prefix: prefix, WaitReplicas: 1, WaitReplicasTimeout: 5 * time.Second}
	clicker, onNew := store.New(mc, confirmed), store.New(rc, confirmed)
	onOld := store.New(mc, store.Options{Prefix: prefix, WaitReplicas: 1, WaitReplicasTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _, _, _ = clicker.Close(), onOld.Close(), onNew.Close() })
	r := request(t, func(r *approval.Request) { r.Created, r.Deadline = time.Now(), time.Now().Add(time.Hour) })
	if err := clicker.CreateRequest(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := decide(ctx, clicker, decision(r, approval.VerdictApprove, "U1")); err != nil {
		t.Fatal(err)
	}
	if err := store.PushWake(ctx, clicker, r.ID, approval.StatusApproved); err != nil {
		t.Fatalf("the approval confirmed by the replica: %v", err)
	}

	if err := rc.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil { // promoted
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the old master has lost its replica", info(mc, "connected_slaves:0"))
	won := 0
	claim := func(s *store.Store, owner string) {
		t.Helper()
		_, err := s.Claim(ctx, r.ID, owner, "", "")
		switch {
		case err == nil:
			won++
		case errors.Is(err, approval.ErrClaimNotConfirmed), errors.Is(err, approval.ErrAlreadyClaimed):
		default:
			t.Fatalf("Claim by %s = %v", owner, err)
		}
	}
	claim(onOld, "proc-old") // the old master, not yet told

	if err := mc.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(replica)).Err(); err != nil { // demoted
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the old master replicates the new one", info(mc, "master_link_status:up"))
	eventually(t, 20*time.Second, "the new master has its replica", info(rc, "connected_slaves:1"))
	claim(onNew, "proc-new")
	if won != 1 {
		t.Errorf("claims won across the failover = %d, want 1 (at most once, and the request still runs)", won)
	}
	if owner, _, err := onNew.Claimant(ctx, r.ID); err != nil || owner != "proc-new" {
		t.Errorf("Claimant on the new master = %q, %v; want proc-new", owner, err)
	}
}
