package storetest_test

import (
	"context"
	"strings"
	"testing"

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
