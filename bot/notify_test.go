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
// breaks make it split into more sections than a reply holds.
func TestLongAnswerSaysItIsTruncated(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	for name, answer := range map[string]string{
		"one long line":   strings.Repeat("a", 40000) + "THE END",
		"many long lines": strings.Repeat(strings.Repeat("a", 1600)+"\n", 30) + "THE END",
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
		})
	}
}
