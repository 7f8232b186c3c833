// Package storetest gives tests a Redis to run against: the real Redis named
// by the REDIS_URL environment variable when it is set, an in-process
// miniredis otherwise. Every test gets its own key prefix and, on a real
// server, only the keys under that prefix are deleted afterwards — a shared
// server is never flushed.
//
// Typical use:
//
//	rdb, prefix := storetest.New(t)
//	s := store.New(rdb, store.Options{Prefix: prefix})
//
// Tests whose point is real Redis behaviour call RequireRealRedis first.
//
// REDIS_URL may also name a Redis Cluster in the form docs/deploy.md gives
// (several addresses, no master_name): redis://h1:7101,h2:7102,h3:7103.
// New then returns a *redis.ClusterClient, and cleanup scans every master.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/store"
)

// EnvURL names the environment variable with the real Redis URL, e.g.
// redis://127.0.0.1:6379/0, or a Cluster's redis://h1:p1,h2:p2,h3:p3.
const EnvURL = "REDIS_URL"

// Real reports whether tests run against a real Redis (REDIS_URL is set).
func Real() bool { return os.Getenv(EnvURL) != "" }

// Cluster reports whether REDIS_URL names a Redis Cluster (several
// addresses).
func Cluster() bool {
	_, addrs, _ := splitAddrs(os.Getenv(EnvURL))
	return len(addrs) > 1
}

// splitAddrs cuts the address list out of a redis:// or rediss:// URL (net/url
// rejects "h1:1,h2:2" as a host) and returns the URL with the first address
// only, and every address.
func splitAddrs(raw string) (string, []string, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "redis" && scheme != "rediss") {
		return raw, nil, nil
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	userinfo, hosts := "", rest[:end]
	if at := strings.LastIndexByte(hosts, '@'); at >= 0 {
		userinfo, hosts = hosts[:at+1], hosts[at+1:]
	}
	var addrs []string
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			addrs = append(addrs, h)
		}
	}
	if len(addrs) == 0 {
		return "", nil, errors.New("no host")
	}
	return scheme + "://" + userinfo + addrs[0] + rest[end:], addrs, nil
}

// New returns a client and a key prefix unique to this test
// ("cstest:<test name>:<random>"). The client is closed and, on a real
// server, the prefix's keys deleted in tb.Cleanup. Without REDIS_URL each
// call starts its own miniredis.
func New(tb testing.TB) (redis.UniversalClient, string) {
	tb.Helper()
	return NewWith(tb, nil)
}

// NewWith is New with a chance to adjust the client options (pool size,
// timeouts, client name) before the client is made.
func NewWith(tb testing.TB, configure func(*redis.UniversalOptions)) (redis.UniversalClient, string) {
	tb.Helper()
	prefix := Prefix(tb)
	var opts redis.UniversalOptions
	urlDB := 0 // REDIS_URL's database: the one whose prefixes are registered and swept
	url := os.Getenv(EnvURL)
	if url != "" {
		first, addrs, err := splitAddrs(url)
		if err != nil {
			tb.Fatalf("storetest: %s=%q: %v", EnvURL, url, err)
		}
		o, err := redis.ParseURL(first)
		if err != nil {
			tb.Fatalf("storetest: %s=%q: %v", EnvURL, url, err)
		}
		if len(addrs) <= 1 {
			addrs = []string{o.Addr}
		}
		urlDB = o.DB
		opts = redis.UniversalOptions{
			Addrs:    addrs,
			DB:       o.DB,
			Username: o.Username,
			Password: o.Password,
			Protocol: o.Protocol,
		}
		if o.TLSConfig != nil {
			opts.TLSConfig = o.TLSConfig
		}
	} else {
		mr, err := store.StartEmbedded()
		if err != nil {
			tb.Fatalf("storetest: %v", err)
		}
		tb.Cleanup(func() { _ = mr.Close() })
		opts = redis.UniversalOptions{Addrs: []string{mr.Addr()}}
	}
	if configure != nil {
		configure(&opts)
	}
	rdb := redis.NewUniversalClient(&opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		tb.Fatalf("storetest: ping Redis: %v", err)
	}
	if url != "" && opts.DB == urlDB {
		register(tb, opts, rdb, prefix)
	}
	tb.Cleanup(func() {
		if url != "" {
			cleanup(tb, rdb, prefix)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
}

// A test process killed before its cleanups ran (a benchmark stopped
// with ^C, a timeout) leaves its prefixes' keys behind, and every later
// cleanup's SCAN walks them: 375,000 such keys once made a CI run's
// cleanups take seconds each. So each process that uses a real Redis
// keeps a key saying it is alive (ownerKey, refreshed every ownerRefresh
// for ownerTTL), registers each prefix it hands out under it
// (registryKey), and sweeps, before its first test, the keys of every
// registered prefix whose owner is gone (SweepDead).
const (
	registryKey  = "cstest:~prefixes" // hash: prefix → owner
	ownerTTL     = time.Minute
	ownerRefresh = 10 * time.Second
)

var (
	ownerOnce sync.Once
	ownerID   string // this process's, "" until registered
)

func ownerKey(id string) string { return "cstest:~owner:" + id }

// register records prefix as this process's, after (once per process)
// starting the owner key's refresh and sweeping the dead prefixes.
func register(tb testing.TB, opts redis.UniversalOptions, rdb redis.UniversalClient, prefix string) {
	tb.Helper()
	ownerOnce.Do(func() {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		// A client of its own, for the process's life: the tests' are
		// closed with them.
		own := redis.NewUniversalClient(&opts)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := own.Set(ctx, ownerKey(id), "1", ownerTTL).Err(); err != nil {
			tb.Logf("storetest: no owner key (prefixes of this process will not be swept if it dies): %v", err)
			_ = own.Close()
			return
		}
		ownerID = id
		go func() { // for the process's life
			for range time.Tick(ownerRefresh) {
				rctx, cancel := context.WithTimeout(context.Background(), ownerRefresh)
				_ = own.Set(rctx, ownerKey(id), "1", ownerTTL).Err()
				cancel()
			}
		}()
		if n, err := SweepDead(ctx, rdb); err != nil {
			tb.Logf("storetest: sweep the keys of dead test processes: %v", err)
		} else if n > 0 {
			tb.Logf("storetest: swept %d keys left by test processes that died before their cleanups", n)
		}
	})
	if ownerID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.HSet(ctx, registryKey, prefix, ownerID).Err(); err != nil {
		tb.Logf("storetest: register prefix %s: %v", prefix, err)
	}
}

// SweepDead deletes the keys of every registered prefix whose owner (a
// test process) is gone, and their registrations, and returns how many
// keys it deleted. Keys of live processes, and keys under no registered
// prefix, are never touched.
func SweepDead(ctx context.Context, rdb redis.UniversalClient) (int, error) {
	reg, err := rdb.HGetAll(ctx, registryKey).Result()
	if err != nil {
		return 0, err
	}
	alive := map[string]bool{}
	dead := map[string]bool{}
	for prefix, owner := range reg {
		live, seen := alive[owner]
		if !seen {
			n, err := rdb.Exists(ctx, ownerKey(owner)).Result()
			if err != nil {
				return 0, err
			}
			live = n == 1
			alive[owner] = live
		}
		if !live {
			dead[prefix] = true
		}
	}
	if len(dead) == 0 {
		return 0, nil
	}
	deleted := 0
	sweep := func(ctx context.Context, node redis.UniversalClient) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, "cstest:*", 1000).Result()
			if err != nil {
				return err
			}
			var doomed []string
			for _, k := range keys {
				if parts := strings.SplitN(k, ":", 4); len(parts) == 4 && dead[strings.Join(parts[:3], ":")] {
					doomed = append(doomed, k)
				}
			}
			if len(doomed) > 0 {
				_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range doomed {
						p.Del(ctx, k) // one key each: never a cross-slot DEL
					}
					return nil
				})
				if err != nil {
					return err
				}
				deleted += len(doomed)
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			mu.Lock() // deleted is shared; masters are swept one at a time
			defer mu.Unlock()
			return sweep(ctx, node)
		})
	} else {
		err = sweep(ctx, rdb)
	}
	if err != nil {
		return deleted, err
	}
	fields := make([]string, 0, len(dead))
	for p := range dead {
		fields = append(fields, p)
	}
	return deleted, rdb.HDel(ctx, registryKey, fields...).Err()
}

// NewDB returns a client on database db of REDIS_URL's server, whose keys
// under prefix (a prefix from New, say) are deleted in tb.Cleanup: a
// second deployment on the same server, for tests of what deployments
// must not share. It needs a real single-node Redis: call RequireRealRedis
// first (a Cluster has one database).
func NewDB(tb testing.TB, db int, prefix string) redis.UniversalClient {
	tb.Helper()
	if !Real() || Cluster() {
		tb.Fatalf("storetest: NewDB needs %s naming one real Redis server", EnvURL)
	}
	rdb, _ := NewWith(tb, func(o *redis.UniversalOptions) { o.DB = db })
	tb.Cleanup(func() { cleanup(tb, rdb, prefix) }) // before NewWith's: it closes rdb
	return rdb
}

// RequireRealRedis skips the test, saying why, when REDIS_URL is unset;
// under CI=true it fails instead, so CI never passes without real Redis.
func RequireRealRedis(tb testing.TB) {
	tb.Helper()
	if Real() {
		return
	}
	const msg = "storetest: this test needs a real Redis: set REDIS_URL (e.g. redis://127.0.0.1:6379/0)"
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg + " — required under CI=true")
	}
	tb.Skip(msg)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Prefix returns a key prefix unique to this test. Glob and hash-tag
// characters are replaced so SCAN MATCH and Redis Cluster slots stay safe.
func Prefix(tb testing.TB) string {
	tb.Helper()
	name := unsafeChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 60 {
		name = name[:60]
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "cstest:" + strings.Trim(name, "_") + ":" + hex.EncodeToString(b[:])
}

// cleanup deletes every key under prefix (SCAN MATCH prefix*), never more;
// on a Cluster on every master.
func cleanup(tb testing.TB, rdb redis.UniversalClient, prefix string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer unregister(ctx, rdb, prefix)
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			cleanNode(ctx, tb, node, prefix)
			return nil
		})
		if err != nil {
			tb.Errorf("storetest: clean up keys %s:*: %v", prefix, err)
		}
		return
	}
	cleanNode(ctx, tb, rdb, prefix)
}

// unregister forgets prefix, whose keys are gone.
func unregister(ctx context.Context, rdb redis.UniversalClient, prefix string) {
	if ownerID != "" {
		_ = rdb.HDel(ctx, registryKey, prefix).Err()
	}
}

func cleanNode(ctx context.Context, tb testing.TB, rdb redis.UniversalClient, prefix string) {
	tb.Helper()
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+":*", 1000).Result()
		if err != nil {
			tb.Errorf("storetest: clean up keys %s:*: %v", prefix, err)
			return
		}
		if len(keys) > 0 {
			// one key per DEL so a Cluster client never sends a cross-slot DEL
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Del(ctx, k)
				}
				return nil
			})
			if err != nil {
				tb.Errorf("storetest: clean up keys %s:*: %v", prefix, err)
				return
			}
		}
		if next == 0 {
			return
		}
		cursor = next
	}
}
