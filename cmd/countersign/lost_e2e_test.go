package main_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/store"
)

// TestDemoLostRequestFailsClosedVisibly (issue 10, point 6): Redis loses
// its data while a run waits for approval (a restart without
// persistence). Through the production wiring: the card loses its buttons
// and says the request was lost and nothing ran, the task thread is told,
// the loss is audited once Redis answers again, nothing runs, and no
// process keeps adopting the vanished run (its adoption hint goes, and a
// resume then finds nothing).
func TestDemoLostRequestFailsClosedVisibly(t *testing.T) {
	t.Parallel()
	d := startDemo(t, true)
	ws, cast := d.Workspace, d.Cast
	root, err := ws.PostMessage(cast.Requester.ID, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> refund $60 on order 1234", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the refund card", func() bool { _, ok := cardFor(d, "issue_refund"); return ok })
	card, _ := cardFor(d, "issue_refund")

	ctx := context.Background()
	loseRedisData(t, d)

	waitWS(t, d, "the card to say the request was lost", func() bool {
		m, ok := ws.Message(cast.Approvals.ID, card.TS)
		return ok && strings.Contains(string(m.Blocks), "Lost") && !strings.Contains(string(m.Blocks), "cs_approve")
	})
	waitBotReply(t, d, "the thread to be told", root, nil, "was lost", "nothing ran")
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, e := range entries {
		if e.Event == approval.EventLost {
			lost++
		}
	}
	if lost != 1 {
		t.Errorf("lost entries in the audit = %d, want 1", lost)
	}
	if n := len(d.SoR.Refunds()); n != 0 {
		t.Errorf("refunds = %d, want none", n)
	}
	// No resume loop spins on the vanished run: its adoption hint goes (the
	// process's own resume loop may adopt it once meanwhile, and forgets it
	// on its first load), and a resume afterwards finds nothing to adopt.
	runs := store.NewRuns(d.Main.Redis, store.RunsOptions{Prefix: d.Prefix})
	waitUntil(t, "no adoption hint left", func() bool {
		ids, err := runs.Active(ctx)
		return err == nil && len(ids) == 0
	})
	if n, err := d.Main.Agent.Resume(ctx); err != nil || n != 0 {
		t.Errorf("Resume = %d, %v; want nothing to adopt", n, err)
	}
}

// loseRedisData makes Redis forget everything of demo d at once, as a
// restart without persistence does: requests, runs, leases, indexes and
// the audit stream (its name is under d's prefix) go in one script, so no
// write of the process lands between two deletions (a run record saved
// again after its deletion but before its lease's would outlive the loss).
// On a Cluster each master forgets its own keys at once, the audit
// stream's master first: nothing else is gone yet, so the process cannot
// have noticed the loss, and the entry it writes about it (lost) lands
// after the stream forgot, as after a restart — never in a stream a later
// master's turn then wipes.
func loseRedisData(t *testing.T, d *main.Demo) {
	t.Helper()
	ctx := context.Background()
	var err error
	if cc, ok := d.Main.Redis.(*redis.ClusterClient); ok {
		audit, aerr := cc.MasterForKey(ctx, d.Main.Config.AuditStream)
		if aerr != nil {
			t.Fatal(aerr)
		}
		if err := forgetScript.Run(ctx, audit, nil, d.Prefix+"*").Err(); err != nil {
			t.Fatal(err)
		}
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if c.Options().Addr == audit.Options().Addr {
				return nil // forgot first
			}
			return forgetScript.Run(ctx, c, nil, d.Prefix+"*").Err()
		})
	} else {
		err = forgetScript.Run(ctx, d.Main.Redis, nil, d.Prefix+"*").Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// forgetScript deletes every key matching ARGV[1], atomically (the node's
// share of them, on a Cluster).
var forgetScript = redis.NewScript(`
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end
return 0`)
