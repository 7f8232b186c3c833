package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/countersign/countersign/store"
)

// TestPolls: every process counts the polls of a request in one place
// (two stores on one Redis, as two replicas), each count is kept
// PollCountTTL after the last poll began, and a request never polled
// counts 0.
func TestPolls(t *testing.T) {
	ctx := context.Background()
	a := mustStore(t, store.Options{})
	b := mustStoreOn(t, a.rdb, a.prefix, store.Options{})
	for i, p := range []*store.Polls{a.s.Polls(), b.s.Polls(), a.s.Polls()} {
		n, err := p.Begin(ctx, "req_1")
		if err != nil || n != int64(i+1) {
			t.Fatalf("Begin #%d = %d, %v; want %d", i+1, n, err, i+1)
		}
	}
	if n, err := b.s.Polls().Count(ctx, "req_1"); err != nil || n != 3 {
		t.Errorf("Count(req_1) = %d, %v; want 3", n, err)
	}
	if n, err := a.s.Polls().Count(ctx, "req_never"); err != nil || n != 0 {
		t.Errorf("Count(req_never) = %d, %v; want 0", n, err)
	}
	ttl, err := a.rdb.PTTL(ctx, a.prefix+":polls:{req_1}").Result()
	if err != nil || ttl <= store.PollCountTTL-time.Minute || ttl > store.PollCountTTL {
		t.Errorf("TTL of the count = %v, %v; want about %v", ttl, err, store.PollCountTTL)
	}
}
