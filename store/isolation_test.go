package store_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/redis/go-redis/v9"
)

// forge publishes msg on every channel (plain or sharded) whose name
// holds tag, as anyone who can reach the server could: channels are
// server-wide.
var forge = redis.NewScript(`
if pcall(redis.call, 'SPUBLISH', KEYS[1], ARGV[1]) then return 1 end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
`)

// channelsOf returns the channels (plain and sharded) whose name holds tag.
func channelsOf(ctx context.Context, tb testing.TB, rdb redis.UniversalClient, tag string) []string {
	tb.Helper()
	var chans []string
	var mu sync.Mutex // guards chans
	of := func(ctx context.Context, c redis.UniversalClient) error {
		got, err := c.PubSubChannels(ctx, "*"+tag+"*").Result()
		if err != nil {
			return err
		}
		if shard, err := c.PubSubShardChannels(ctx, "*"+tag+"*").Result(); err == nil {
			got = append(got, shard...)
		}
		mu.Lock()
		chans = append(chans, got...)
		mu.Unlock()
		return nil
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// Each node lists only the channels subscribed on it.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return of(ctx, c) })
	} else {
		err = of(ctx, rdb)
	}
	if err != nil {
		tb.Fatalf("PUBSUB CHANNELS: %v", err)
	}
	slices.Sort(chans)
	return slices.Compact(chans)
}

// encodeSnapshot writes fields as a hint carries a record (luaHint's
// snapshot: "*", then each field and value as its length, ":" and bytes).
func encodeSnapshot(fields map[string]string) string {
	var b strings.Builder
	b.WriteString("*")
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		fmt.Fprintf(&b, "%d:%s%d:%s", len(k), k, len(fields[k]), fields[k])
	}
	return b.String()
}

// TestWaitTrustsNoForeignHint: a wake-up is only a hint. A hint carrying
// another record under the waited id — another deployment's approved
// request with the same id, published on the waited channel — is not
// handed to the waiter: it gets its own record's decision, made after.
func TestWaitTrustsNoForeignHint(t *testing.T) {
	ctx := context.Background()
	live := make(chan int, 100)
	f := mustStore(t, store.Options{})
	store.SetHubHooks(f.s, store.HubHooks{Round: func(_, keys int) {
		select {
		case live <- keys:
		default:
		}
	}})
	r := f.mustCreate(t, nil)

	// The other deployment: the same id, another tool, approved.
	other := mustStoreOn(t, f.rdb, f.prefix+":other", store.Options{})
	o := other.mustCreate(t, func(o *approval.Request) {
		o.ID, o.Tool, o.Requester = r.ID, "delete_everything", "U_MALLORY"
	})
	if _, err := decide(ctx, other.s, decision(o, approval.VerdictApprove, "U_MALLORY")); err != nil {
		t.Fatalf("decide the other deployment's request: %v", err)
	}
	forged, ok, err := store.Snapshot(ctx, other.s, o.ID)
	if err != nil || !ok {
		t.Fatalf("Snapshot = %v, %v", ok, err)
	}

	got := goWait(ctx, f.s, r.ID)
	timeout := time.After(30 * time.Second)
	for n := 0; n < 1; {
		select {
		case n = <-live:
		case <-timeout:
			t.Fatal("the waiter's hint subscription was not confirmed within 30s")
		}
	}
	chans := channelsOf(ctx, t, f.rdb, "{"+r.ID+"}")
	if len(chans) == 0 {
		t.Fatalf("no channel subscribed for %s", r.ID)
	}
	for _, ch := range chans {
		if err := forge.Run(ctx, f.rdb, []string{ch}, encodeSnapshot(forged)).Err(); err != nil {
			t.Fatalf("publish on %s: %v", ch, err)
		}
	}
	// Published after the forged hint on the same channel: the waiter has
	// seen the forged one first.
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictReject, "U_ALICE")); err != nil {
		t.Fatalf("decide: %v", err)
	}
	res := receive(t, got, 30*time.Second)
	if res.err != nil {
		t.Fatalf("Wait(%s) = %v", r.ID, res.err)
	}
	if res.r.Tool != r.Tool || res.r.Status != approval.StatusRejected || res.r.Decision == nil || res.r.Decision.Approver != "U_ALICE" {
		t.Errorf("Wait(%s) = %s %s by %v, want %s rejected by U_ALICE (its own record, not the forged hint's)",
			r.ID, res.r.Tool, res.r.Status, res.r.Decision, r.Tool)
	}
}

// TestSecret: a deployment's secret is created once and read by every
// process of it, racing or not; another deployment (another prefix here,
// another database in agent/api's TestDeploymentsIsolated) has its own.
func TestSecret(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	replica := mustStoreOn(t, f.rdb, f.prefix, store.Options{})
	other := mustStoreOn(t, f.rdb, f.prefix+":other", store.Options{})
	secrets := make(chan []byte, 8)
	errs := make(chan error, 8)
	for i := range 8 {
		s := f.s
		if i%2 == 1 {
			s = replica.s
		}
		go func() {
			b, err := s.Secret(ctx)
			secrets <- b
			errs <- err
		}()
	}
	var first []byte
	for range 8 {
		b := <-secrets
		if err := <-errs; err != nil {
			t.Fatalf("Secret = %v", err)
		}
		if first == nil {
			first = b
		}
		if len(b) != 32 || string(b) != string(first) {
			t.Fatalf("Secret = %x, want the same 32 bytes as %x in every process", b, first)
		}
	}
	theirs, err := other.s.Secret(ctx)
	if err != nil {
		t.Fatalf("other Secret = %v", err)
	}
	if string(theirs) == string(first) {
		t.Errorf("two deployments share the secret %x", first)
	}
}
