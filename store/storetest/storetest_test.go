package storetest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/store/storetest"
)

func TestPrefixIsUniqueAndSafe(t *testing.T) {
	a, b := storetest.Prefix(t), storetest.Prefix(t)
	if a == b {
		t.Errorf("Prefix() twice = %q, want different prefixes", a)
	}
	if strings.ContainsAny(a, "{}*?[] ") {
		t.Errorf("Prefix() = %q, want no glob or hash-tag characters", a)
	}
}

// TestCleanupOnlyOwnPrefix: after a test, its keys are gone and nobody
// else's are touched.
func TestCleanupOnlyOwnPrefix(t *testing.T) {
	storetest.RequireRealRedis(t)
	ctx := context.Background()
	rdb, outside := storetest.New(t)
	if err := rdb.Set(ctx, outside+":keep", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var inner string
	t.Run("inner", func(t *testing.T) {
		r, prefix := storetest.New(t)
		inner = prefix
		for _, k := range []string{":a", ":req:{x}", ":req:{x}:wake"} {
			if err := r.Set(ctx, prefix+k, "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, k := range []string{":a", ":req:{x}", ":req:{x}:wake"} {
		// one key per EXISTS: on a Cluster they are in different slots
		if n, err := rdb.Exists(ctx, inner+k).Result(); err != nil || n != 0 {
			t.Errorf("key %s%s after cleanup: exists = %d, %v; want 0", inner, k, n, err)
		}
	}
	if n, err := rdb.Exists(ctx, outside+":keep").Result(); err != nil || n != 1 {
		t.Errorf("key outside the inner prefix: exists = %d, %v; want 1", n, err)
	}
}

// TestSweepDead: the keys of a prefix registered by a test process that
// is gone (its owner key expired: killed before its cleanups) are swept,
// with the registration; a live process's prefix and keys under no
// registered prefix are left alone.
func TestSweepDead(t *testing.T) {
	storetest.RequireRealRedis(t)
	ctx := context.Background()
	rdb, mine := storetest.New(t) // registers this process as alive
	deadPrefix, livePrefix := storetest.Prefix(t), storetest.Prefix(t)
	unregistered := mine + ":unregistered"
	deadOwner, liveOwner := "dead-"+strings.TrimPrefix(deadPrefix, "cstest:"), "live-"+strings.TrimPrefix(livePrefix, "cstest:")
	deadOwner, liveOwner = strings.ReplaceAll(deadOwner, ":", "_"), strings.ReplaceAll(liveOwner, ":", "_")
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), "cstest:~owner:"+liveOwner).Err()
		for _, p := range []string{deadPrefix, livePrefix} {
			for _, k := range []string{":a", ":req:{x}", ":req:{x}:wake"} {
				_ = rdb.Del(context.Background(), p+k).Err()
			}
			_ = rdb.HDel(context.Background(), "cstest:~prefixes", p).Err()
		}
	})
	if err := rdb.Set(ctx, "cstest:~owner:"+liveOwner, "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "cstest:~prefixes", deadPrefix, deadOwner, livePrefix, liveOwner).Err(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{deadPrefix, livePrefix} {
		for _, k := range []string{":a", ":req:{x}", ":req:{x}:wake"} {
			if err := rdb.Set(ctx, p+k, "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rdb.Set(ctx, unregistered, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := storetest.SweepDead(ctx, rdb)
	if err != nil || n < 3 {
		t.Fatalf("SweepDead = %d, %v; want at least the dead prefix's 3 keys", n, err)
	}
	for _, k := range []string{":a", ":req:{x}", ":req:{x}:wake"} {
		if got, _ := rdb.Exists(ctx, deadPrefix+k).Result(); got != 0 {
			t.Errorf("key %s%s of a dead process survived the sweep", deadPrefix, k)
		}
		if got, _ := rdb.Exists(ctx, livePrefix+k).Result(); got != 1 {
			t.Errorf("key %s%s of a live process was swept", livePrefix, k)
		}
	}
	if got, _ := rdb.Exists(ctx, unregistered).Result(); got != 1 {
		t.Error("a key under no registered prefix was swept")
	}
	if owner, _ := rdb.HGet(ctx, "cstest:~prefixes", deadPrefix).Result(); owner != "" {
		t.Errorf("the dead prefix is still registered (to %q)", owner)
	}
	if owner, _ := rdb.HGet(ctx, "cstest:~prefixes", mine).Result(); owner == "" {
		t.Error("this test's own prefix is not registered")
	}
}
