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
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// EnvURL names the environment variable with the real Redis URL, e.g.
// redis://127.0.0.1:6379/0.
const EnvURL = "REDIS_URL"

// Real reports whether tests run against a real Redis (REDIS_URL is set).
func Real() bool { return os.Getenv(EnvURL) != "" }

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
	url := os.Getenv(EnvURL)
	if url != "" {
		o, err := redis.ParseURL(url)
		if err != nil {
			tb.Fatalf("storetest: %s=%q: %v", EnvURL, url, err)
		}
		opts = redis.UniversalOptions{
			Addrs:    []string{o.Addr},
			DB:       o.DB,
			Username: o.Username,
			Password: o.Password,
			Protocol: o.Protocol,
		}
		if o.TLSConfig != nil {
			opts.TLSConfig = o.TLSConfig
		}
	} else {
		mr := miniredis.RunT(tb)
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
	tb.Cleanup(func() {
		if url != "" {
			cleanup(tb, rdb, prefix)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
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

// cleanup deletes every key under prefix (SCAN MATCH prefix*), never more.
func cleanup(tb testing.TB, rdb redis.UniversalClient, prefix string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
