package bot_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
)

// approversGroup is a user group of approvers seeded by the tests below.
const approversGroup = "S0APPROV1"

// publicApprovalsID is a public approvals channel.
const publicApprovalsID = "C0APPROV2"

func publicApprovals(pf *policyfile.File) { pf.Slack.ApprovalsChannel = publicApprovalsID }

// waitEventAcked waits until the app has acknowledged an event of type typ:
// a membership event drops the cached list before the ack.
func (h *harness) waitEventAcked(typ string) {
	h.t.Helper()
	h.waitWS(typ+" acknowledged", func() bool {
		for _, e := range h.ws.Envelopes() {
			var outer struct {
				Event struct {
					Type string `json:"type"`
				} `json:"event"`
			}
			if e.Type == "events_api" && e.Acked && json.Unmarshal(e.Payload, &outer) == nil && outer.Event.Type == typ {
				return true
			}
		}
		return false
	})
}

// voteThenRemove posts a two-approver card, lets carol approve (the bot
// reads the member list, bob in it), then removes bob with remove and
// waits for the bot to acknowledge Slack's event of type event.
func voteThenRemove(t *testing.T, h *harness, mod func(*approval.Request), remove func(), event string) *approval.Request {
	t.Helper()
	r := h.request(func(r *approval.Request) {
		r.Quorum = 2
		if mod != nil {
			mod(r)
		}
	})
	if err := h.ws.Click(carol, r.Card.Channel, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "carol's approval", h.audit.changed, func() bool { return len(h.audit.Records(approval.EventApprovalVote)) == 1 })
	remove()
	h.waitEventAcked(event)
	return r
}

// TestRemovedApproverRefusedOnNextClick (issue 28, point 2): bob, removed
// from the approvals channel or from the tool's user group after the card
// was posted (and after the bot had read the list with him in it), is
// refused on his very next click, over Socket Mode and HTTP: the
// membership event drops the cached list at once, no TTL waited.
func TestRemovedApproverRefusedOnNextClick(t *testing.T) {
	for _, mode := range []struct {
		name     string
		delivery slacksim.Delivery
	}{{"socket mode", slacksim.SocketMode}, {"http", slacksim.HTTP}} {
		t.Run(mode.name+"/channel", func(t *testing.T) {
			// A public approvals channel: bob, no longer a member, still
			// sees it and its buttons.
			h := newHarness(t, harnessConfig{delivery: mode.delivery, policy: publicApprovals})
			h.ws.AddChannel(slacksim.Channel{ID: publicApprovalsID, Name: "approvals-public", Members: []string{bob, carol, slacksim.BotUserID}})
			r := voteThenRemove(t, h, nil, func() { h.ws.LeaveChannel(publicApprovalsID, bob) }, "member_left_channel")
			h.assertRefused(r)
		})
		t.Run(mode.name+"/usergroup", func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: mode.delivery})
			h.ws.AddUsergroup(slacksim.Usergroup{ID: approversGroup, Handle: "approvers", Users: []string{bob, carol}})
			r := voteThenRemove(t, h, func(r *approval.Request) { r.Approvers = approval.Approvers{Usergroups: []string{approversGroup}} },
				func() {
					if err := h.ws.SetUsergroupUsers(approversGroup, []string{carol}); err != nil {
						t.Fatal(err)
					}
				}, "subteam_members_changed")
			h.assertRefused(r)
		})
	}
}

// assertRefused clicks Approve as bob and checks he is told he is not an
// approver and that r is still pending with carol's vote alone.
func (h *harness) assertRefused(r *approval.Request) {
	h.t.Helper()
	seen := len(h.audit.all())
	if err := h.ws.Click(bob, r.Card.Channel, r.Card.TS, "cs_approve"); err != nil {
		h.t.Fatal(err)
	}
	waitCh(h.t, "bob's click handled", h.audit.changed, func() bool {
		for _, rec := range h.audit.all()[seen:] {
			if rec.Event == approval.EventDecisionRefuse || rec.Event == approval.EventDecided || rec.Event == approval.EventApprovalVote {
				return true
			}
		}
		return false
	})
	if got := h.load(r.ID); got.Status != approval.StatusPending || len(got.Approvals) != 1 {
		h.t.Fatalf("after the removed approver's click: status %s with %d approvals, want pending with carol's alone", got.Status, len(got.Approvals))
	}
	h.ephemeralContaining(bob, "not one of the approvers")
}

// TestMemberListServesBursts: N approvals in a row cost one
// conversations.members (or one usergroups.users.list) call, not N.
func TestMemberListServesBursts(t *testing.T) {
	const n = 5
	for _, c := range []struct {
		name, method string
		mod          func(*approval.Request)
	}{
		{"channel", "conversations.members", nil},
		{"usergroup", "usergroups.users.list", func(r *approval.Request) {
			r.Approvers = approval.Approvers{Usergroups: []string{approversGroup}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
			h.ws.AddUsergroup(slacksim.Usergroup{ID: approversGroup, Handle: "approvers", Users: []string{bob, carol}})
			var rs []*approval.Request
			for range n {
				rs = append(rs, h.request(c.mod))
			}
			for _, r := range rs {
				if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_approve"); err != nil {
					t.Fatal(err)
				}
				h.waitStatus(r.ID, approval.StatusApproved)
			}
			if got := h.ws.Calls(c.method); got != 1 {
				t.Errorf("%s calls for %d approvals in a row = %d, want 1", c.method, n, got)
			}
		})
	}
}

// TestDecisionRereadsStaleMembers: Slack promises no order between a
// membership event and a click, and another replica gets the event: a
// decision trusts a member list at most 2 s old. Bob, removed from the
// approvals channel with no event reaching this process, is refused 3 s
// later, although the list is cached for 30 s.
func TestDecisionRereadsStaleMembers(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: publicApprovals})
	h.ws.AddChannel(slacksim.Channel{ID: publicApprovalsID, Name: "approvals-public", Members: []string{bob, carol, slacksim.BotUserID}})
	r := h.request(func(r *approval.Request) { r.Quorum = 2 })
	if err := h.ws.Click(carol, r.Card.Channel, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	waitCh(t, "carol's approval", h.audit.changed, func() bool { return len(h.audit.Records(approval.EventApprovalVote)) == 1 })
	// Bob leaves, and the event goes to another replica: this process
	// sees only the workspace's new state (AddChannel sends no event).
	h.ws.AddChannel(slacksim.Channel{ID: publicApprovalsID, Name: "approvals-public", Members: []string{carol, slacksim.BotUserID}})
	h.clock.Advance(3 * time.Second)
	h.assertRefused(r)
}
