package slacksim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot/slacksim"
)

// BenchmarkLongChannel: the bot updates the first message of a channel
// holding n messages (chat.update through slack-go, the way the bot redraws
// a card). The workspace finds messages by timestamp in a map, so the cost
// does not grow with the channel: a benchmark clicking 1,000 cards leaves
// thousands of messages behind, and a scan of them all on every call of the
// fake Slack was CPU in the very process whose latency it measures.
//
//	go test ./bot/slacksim -run '^$' -bench LongChannel
func BenchmarkLongChannel(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			_, api := mustWorkspace(b, slacksim.Options{})
			ctx := context.Background()
			first := ""
			for i := range n {
				_, ts, err := api.PostMessageContext(ctx, tasks, slack.MsgOptionText(fmt.Sprintf("message %d", i), false))
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					first = ts
				}
			}
			b.ResetTimer()
			for i := range b.N {
				if _, _, _, err := api.UpdateMessageContext(ctx, tasks, first, slack.MsgOptionText(fmt.Sprintf("edited %d", i), false)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
