package bot_test

import (
	"testing"

	"github.com/countersign/countersign/bot"
)

// TestEscNeutralisesMarkup: text from the model or a requester can neither
// broadcast nor form a link or mention, whatever its case, and text with
// nothing to escape comes back as it was.
func TestEscNeutralisesMarkup(t *testing.T) {
	const zwj = "\u200d"
	for in, want := range map[string]string{
		"refund $120 on order 1234":     "refund $120 on order 1234",
		"ping @channel now":             "ping @" + zwj + "channel now",
		"@HERE and @Everyone":           "@" + zwj + "HERE and @" + zwj + "Everyone",
		"<!channel> <@U123> <http://x>": "&lt;!channel&gt; &lt;@U123&gt; &lt;http://x&gt;",
		"a & b":                         "a &amp; b",
		"mail ops@example.com":          "mail ops@example.com",
		"@channels is not a broadcast":  "@channels is not a broadcast",
	} {
		if got := bot.Esc(in); got != want {
			t.Errorf("esc(%q) = %q, want %q", in, got, want)
		}
	}
}
