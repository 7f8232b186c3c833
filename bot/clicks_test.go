package bot_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/store"
	"github.com/redis/go-redis/v9"
)

// postInteraction delivers payload to the bot's /slack/interactive as a
// correctly signed request (what Slack would send) and returns the status.
func postInteraction(tb testing.TB, h *harness, payload map[string]any) int {
	tb.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		tb.Fatal(err)
	}
	body := "payload=" + url.QueryEscape(string(b))
	return post(tb, h.bot.HTTPHandler(), "/slack/interactive", sign(secret, h.clock.Now().Unix(), body), body).Code
}

// clickPayload is a block_actions payload for a button with value pressed
// by user on the message at channel/ts.
func clickPayload(user, channel, ts, actionID, value string) map[string]any {
	return map[string]any{
		"type": "block_actions", "trigger_id": "1.2.3",
		"team":      map[string]any{"id": slacksim.TeamID, "domain": "countersign-sim"},
		"user":      map[string]any{"id": user, "team_id": slacksim.TeamID},
		"channel":   map[string]any{"id": channel},
		"container": map[string]any{"type": "message", "channel_id": channel, "message_ts": ts},
		"message":   map[string]any{"ts": ts},
		"actions":   []any{map[string]any{"action_id": actionID, "block_id": "cs_actions", "value": value}},
	}
}

// TestClickNotOnTheCardRefused: a signed click counts only when it comes
// from the request's own card. A button pressed in another channel, or on
// another request's card carrying this request's id|digest, changes
// nothing, tells the clicker why and is audited.
func TestClickNotOnTheCardRefused(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP})
	r := h.request(nil)
	other := h.request(nil)
	value := r.ID + "|" + r.Digest
	cases := []struct {
		name, channel, ts string
	}{
		{"task channel", tasks, r.Origin.ThreadTS},
		{"task channel, card ts", tasks, r.Card.TS},
		{"another request's card", approvals, other.Card.TS},
		{"unknown message in approvals", approvals, "1772442000.999999"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := postInteraction(t, h, clickPayload(bob, tc.channel, tc.ts, "cs_approve", value)); code != http.StatusOK {
				t.Fatalf("POST /slack/interactive = %d, want 200", code)
			}
			waitCh(t, "refusal audit", h.audit.changed, func() bool {
				for _, rec := range h.audit.Records(approval.EventDecisionRefuse) {
					if rec.RequestID == r.ID && strings.Contains(fmt.Sprint(rec.Data), "not_on_card") {
						return true
					}
				}
				return false
			})
			if got := h.load(r.ID); got.Status != approval.StatusPending || len(got.Approvals) != 0 {
				t.Fatalf("request after click %s = %s with %d approvals, want pending with none", tc.name, got.Status, len(got.Approvals))
			}
		})
	}
	h.ephemeralContaining(bob, "not on this request's approval card")
	// Reject from elsewhere opens no modal either.
	if code := postInteraction(t, h, clickPayload(bob, tasks, r.Origin.ThreadTS, "cs_reject", value)); code != http.StatusOK {
		t.Fatalf("POST /slack/interactive = %d, want 200", code)
	}
	// The same click on the card itself counts.
	if code := postInteraction(t, h, clickPayload(bob, approvals, r.Card.TS, "cs_approve", value)); code != http.StatusOK {
		t.Fatalf("POST /slack/interactive = %d, want 200", code)
	}
	h.waitStatus(r.ID, approval.StatusApproved)
	_ = h.bot.Close()
	if v := h.ws.OpenViews(bob); len(v) != 0 {
		t.Errorf("modal opened for a click outside the card: %+v", v)
	}
	if got := h.load(other.ID); got.Status != approval.StatusPending {
		t.Errorf("the other request = %s, want pending", got.Status)
	}
}

// TestDecisionNotConfirmedByReplica: with WaitReplicas and no replica to
// confirm it (the Redis here has none), an approval is recorded but the
// clicker is told it is not confirmed and to decide again, instead of
// being told nothing as if it surely stood; it is not audited as refused.
// On a Cluster, where WaitReplicas is ignored, the approval is told as
// usual.
func TestDecisionNotConfirmedByReplica(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, store: func(o *store.Options) {
		o.WaitReplicas, o.WaitReplicasTimeout = 1, time.Millisecond
	}})
	r := h.request(nil)
	if code := postInteraction(t, h, clickPayload(bob, approvals, r.Card.TS, "cs_approve", r.ID+"|"+r.Digest)); code != http.StatusOK {
		t.Fatalf("POST /slack/interactive = %d, want 200", code)
	}
	if _, cluster := h.rdb.(*redis.ClusterClient); cluster {
		// WaitReplicas is ignored on a Cluster (store.Options: WAIT cannot
		// follow a key to its node): the approval stands and its card says
		// so, with no word of a replica to the clicker.
		h.waitWS("the card redrawn approved", func() bool {
			m, ok := h.ws.Message(r.Card.Channel, r.Card.TS)
			return ok && !strings.Contains(string(m.Blocks), "cs_approve")
		})
		for _, m := range h.ws.Ephemerals(bob) {
			if strings.Contains(m.Text, "replica") {
				t.Errorf("on a Cluster the clicker was told %q; WaitReplicas is ignored there", m.Text)
			}
		}
	} else {
		h.ephemeralContaining(bob, "could not yet confirm a copy on its replica")
	}
	if got := h.load(r.ID); got.Status != approval.StatusApproved {
		t.Errorf("request after the click = %s, want approved (recorded)", got.Status)
	}
	if refused := h.audit.Records(approval.EventDecisionRefuse); len(refused) != 0 {
		t.Errorf("decision_refused entries = %+v, want none", refused)
	}
}
