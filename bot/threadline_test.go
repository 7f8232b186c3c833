package bot_test

import (
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestThreadLineShowsMentions: a request cancelled because the run stopped
// at another's rejection tells the thread who rejected as a mention (Slack
// shows the name), not as escaped text or a bare id.
func TestThreadLineShowsMentions(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode})
	r := h.request(nil)
	if _, err := h.life.Cancel(h.ctx, r.ID, "countersign", "the run stopped: send_email was rejected by <@"+bob+">: not today"); err != nil {
		t.Fatal(err)
	}
	h.decided(r)
	var line string
	for _, m := range h.ws.Replies(tasks, r.Origin.ThreadTS) {
		if strings.Contains(m.Text, "was cancelled") {
			line = m.Text
		}
	}
	if !strings.Contains(line, "rejected by <@"+bob+">: not today") {
		t.Errorf("cancel line = %q, want the rejecting approver as a mention", line)
	}
	if got := h.load(r.ID).Status; got != approval.StatusCancelled {
		t.Errorf("status = %s, want cancelled", got)
	}
}
