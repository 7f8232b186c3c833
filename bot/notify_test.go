package bot_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestLongAnswerSaysItIsTruncated: an agent answer too long for one reply
// is cut with the visible "truncated, N chars" note, also when its line
// breaks make it split into more sections than a reply holds, or when
// showing its formatting marks as typed makes it many times longer; it
// still shows most of what a reply holds, and no section ends in half of
// a control (<…>) that shows a mark as typed.
func TestLongAnswerSaysItIsTruncated(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	for name, answer := range map[string]string{
		"one long line":   strings.Repeat("a", 40000) + "THE END",
		"many long lines": strings.Repeat(strings.Repeat("a", 1600)+"\n", 30) + "THE END",
		"marks":           strings.Repeat("a *b* _c_ ", 4000) + "THE END",
	} {
		t.Run(name, func(t *testing.T) {
			thread, err := h.ws.PostMessage(alice, tasks, "do it", "")
			if err != nil {
				t.Fatal(err)
			}
			if err := h.bot.PostRunResult(h.ctx, approval.RunResult{Origin: approval.Origin{Channel: tasks, ThreadTS: thread}, Status: approval.RunDone, Answer: answer}); err != nil {
				t.Fatalf("PostRunResult: %v", err)
			}
			replies := h.ws.Replies(tasks, thread)
			if len(replies) == 0 {
				t.Fatal("no answer posted")
			}
			text := allText(replies[len(replies)-1].Blocks)
			if want := "truncated, " + strconv.Itoa(len([]rune(answer))) + " chars"; !strings.Contains(text, want) {
				t.Errorf("answer of %d chars shown as %d chars without %q", len([]rune(answer)), len([]rune(text)), want)
			}
			if n := len([]rune(text)); n < 10000 {
				t.Errorf("answer cut to %d chars, want most of the 29,800 a reply holds", n)
			}
			for _, section := range blockTexts(replies[len(replies)-1].Blocks) {
				if strings.Count(section, "<") != strings.Count(section, ">") {
					t.Errorf("a section of the answer cuts a control in half: …%s", section[max(0, len(section)-80):])
				}
			}
		})
	}
}

// TestRunAnswerReadsAsNames: people the answer names (the agent writes
// approvers as <@U…>) are real mentions, which Slack shows as names; any
// other markup stays escaped; the counts line says who pre-authorised what
// ran without a card, and tells a policy refusal from an invalid call; it
// does not repeat a rejection's reason, which the rejection's own line in
// the thread gave.
func TestRunAnswerReadsAsNames(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	thread, err := h.ws.PostMessage(alice, tasks, "do it", "")
	if err != nil {
		t.Fatal(err)
	}
	res := approval.RunResult{Origin: approval.Origin{Channel: tasks, ThreadTS: thread}, Status: approval.RunDone,
		Answer:   "- send_email: Not run: <@" + bob + "> answered instead of running send_email. <!channel> <http://evil.example|click>",
		Rejected: 1, RejectionReasons: []string{"issue_refund: already refunded (<@" + bob + ">)"},
		Preauthorized: 1, PreauthorizedBy: []string{carol}, Denied: 1, Refused: 1, Responded: 1}
	if err := h.bot.PostRunResult(h.ctx, res); err != nil {
		t.Fatalf("PostRunResult: %v", err)
	}
	replies := h.ws.Replies(tasks, thread)
	if len(replies) == 0 {
		t.Fatal("no answer posted")
	}
	text := allText(replies[len(replies)-1].Blocks)
	for _, want := range []string{
		"<@" + bob + "> answered instead of running", "&lt;!channel&gt;", "&lt;http://evil.example|click&gt;",
		"1 ran under a pre-authorisation by <@" + carol + ">", "1 refused by policy", "1 refused as invalid",
		"1 answered by a person instead of running",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("answer lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "&lt;@") {
		t.Errorf("answer shows a raw mention:\n%s", text)
	}
	if strings.Contains(text, "already refunded") {
		t.Errorf("counts repeat the rejection's reason:\n%s", text)
	}
}

// TestRunCountsAreTrue: a call that ran because its cancel window ended is
// not counted as approved (nobody approved it); one run now in its window
// was, by whoever clicked Run now.
func TestRunCountsAreTrue(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	for _, tt := range []struct {
		name     string
		res      approval.RunResult
		want     string
		unwanted string
	}{
		{"window ended", approval.RunResult{AfterWindow: 1}, "1 ran when its cancel window ended", "approved"},
		{"run now", approval.RunResult{Approved: 1}, "1 approved", "cancel window"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			thread, err := h.ws.PostMessage(alice, tasks, "rush order 1234", "")
			if err != nil {
				t.Fatal(err)
			}
			tt.res.Origin, tt.res.Status, tt.res.Answer = approval.Origin{Channel: tasks, ThreadTS: thread}, approval.RunDone, "Done."
			if err := h.bot.PostRunResult(h.ctx, tt.res); err != nil {
				t.Fatalf("PostRunResult: %v", err)
			}
			replies := h.ws.Replies(tasks, thread)
			counts := blockTexts(replies[len(replies)-1].Blocks)
			got := counts[len(counts)-1]
			if !strings.Contains(got, tt.want) || strings.Contains(got, tt.unwanted) {
				t.Errorf("counts = %q, want %q and no %q", got, tt.want, tt.unwanted)
			}
		})
	}
}
