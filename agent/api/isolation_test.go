package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store/storetest"
	"github.com/redis/go-redis/v9"
)

// awaitSubscribed waits until some connection of the server listens on a
// channel (plain or sharded) of request id: the waiter's hub is ready to
// hear a hint. The hub's own hooks are internal to the store; Redis is the
// only shared witness here.
func awaitSubscribed(tb testing.TB, rdb redis.UniversalClient, id string) {
	tb.Helper()
	ctx := context.Background()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(30 * time.Second)
	for {
		chans, err := rdb.PubSubChannels(ctx, "*{"+id+"}*").Result()
		if err != nil {
			tb.Fatalf("PUBSUB CHANNELS: %v", err)
		}
		shard, _ := rdb.PubSubShardChannels(ctx, "*{"+id+"}*").Result()
		if len(chans)+len(shard) > 0 {
			return
		}
		select {
		case <-tick.C:
		case <-timeout:
			tb.Fatalf("nobody subscribed to a channel of %s within 30s", id)
		}
	}
}

// TestDeploymentsIsolated: two deployments (staging and production, say)
// on two databases of one Redis server, with the same prefix, the same API
// key and the same call ids, but other tools and arguments. Each caller's
// long poll gets only its own deployment's decision: request ids differ
// across deployments, hint channels are scoped to the database, and a
// waiter takes no record from a hint that is not its own.
func TestDeploymentsIsolated(t *testing.T) {
	storetest.RequireRealRedis(t)
	if storetest.Cluster() {
		t.Skip("a Redis Cluster has one database: deployments there differ by prefix, which every key and channel carries")
	}
	rdbA, prefix := storetest.New(t)
	db := rdbA.(*redis.Client).Options().DB
	rdbB := storetest.NewDB(t, (db+1)%16, prefix) // REDIS_URL's database and the next one

	pol := approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"Write": {Risk: approval.RiskMedium, Review: approval.ReviewAlways, Quorum: 1,
			Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}},
		"Bash": {Risk: approval.RiskHigh, Review: approval.ReviewAlways, Quorum: 1,
			Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}},
	}}
	staging := newHarness(t, harnessOptions{rdb: rdbA, prefix: prefix, policy: &pol})
	production := newHarness(t, harnessOptions{rdb: rdbB, prefix: prefix, policy: &pol})
	ctx := staging.ctx

	for i := range 3 {
		callID := fmt.Sprintf("toolu_%02d", i)
		t.Run(callID, func(t *testing.T) {
			write, err := staging.client(fullKey).Request(ctx, client.Call{Tool: "Write", CallID: callID,
				Arguments: json.RawMessage(`{"file_path":"/srv/app/README.md","content":"hello"}`)})
			if err != nil {
				t.Fatalf("staging Write: %v", err)
			}
			bash, err := production.client(fullKey).Request(ctx, client.Call{Tool: "Bash", CallID: callID,
				Arguments: json.RawMessage(`{"command":"rm -rf /var/lib/app"}`)})
			if err != nil {
				t.Fatalf("production Bash: %v", err)
			}
			if write.ID == bash.ID {
				t.Errorf("call id %s names request %s in both deployments; want ids no other deployment can compute", callID, write.ID)
			}

			type polled struct {
				r   *client.Request
				err error
			}
			waitOn := func(h *harness, id string) <-chan polled {
				ch := make(chan polled, 1)
				go func() {
					r, err := h.client(fullKey).Wait(ctx, id)
					ch <- polled{r, err}
				}()
				return ch
			}
			gotWrite := waitOn(staging, write.ID)
			gotBash := waitOn(production, bash.ID)
			staging.waitPolls(1)
			production.waitPolls(1)
			awaitSubscribed(t, rdbA, write.ID)
			awaitSubscribed(t, rdbB, bash.ID)

			// Production decides its Bash call first; staging's Write is
			// still waiting for its own approver.
			production.decide(bash.ID, approval.VerdictReject, "U0PRODOPS", "not on a Friday")
			b := <-gotBash
			if b.err != nil || b.r.Tool != "Bash" || b.r.Status != client.Rejected || b.r.Approver != "U0PRODOPS" {
				t.Fatalf("production's poll = %+v, %v; want its Bash call rejected by U0PRODOPS", b.r, b.err)
			}
			staging.decide(write.ID, approval.VerdictApprove, "U0STAGING", "")
			w := <-gotWrite
			if w.err != nil {
				t.Fatalf("staging's poll: %v", w.err)
			}
			if w.r.Tool != "Write" || w.r.Status != client.Approved || w.r.Approver != "U0STAGING" || w.r.ID != write.ID {
				t.Errorf("staging's poll = %s %s %s by %s, want %s Write approved by U0STAGING (another deployment's decision must never answer it)",
					w.r.ID, w.r.Tool, w.r.Status, w.r.Approver, write.ID)
			}
		})
	}
}
