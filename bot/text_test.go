package bot_test

import (
	"testing"

	"github.com/countersign/countersign/bot"
)

// TestLitNeutralisesMarkup: text from the model or a caller can neither
// broadcast nor form a link, a mention, formatting or a quote, whatever its
// case, in a sentence (lit), a code span (code) or a code block
// (codeBlock); text with nothing to neutralise comes back as it was, and a
// formatting character inside a word (order_id) is left alone.
func TestLitNeutralisesMarkup(t *testing.T) {
	const (
		zwj  = "\u200d"
		shy  = "\u00ad"
		star = "<!date^0^{_}|*>"
		low  = "<!date^0^{_}|_>"
	)
	tests := []struct {
		name string
		fn   func(string) string
		in   string
		want string
	}{
		{"lit plain", bot.Lit, "refund $120 on order 1234", "refund $120 on order 1234"},
		{"lit broadcast", bot.Lit, "ping @channel now", "ping @" + zwj + "channel now"},
		{"lit broadcast case", bot.Lit, "@HERE and @Everyone", "@" + zwj + "HERE and @" + zwj + "Everyone"},
		{"lit controls", bot.Lit, "<!channel> <@U123> <http://x>", "&lt;!channel&gt; &lt;@U123&gt; &lt;http://x&gt;"},
		{"lit ampersand", bot.Lit, "a & b", "a &amp; b"},
		{"lit address", bot.Lit, "mail ops@example.com", "mail ops@example.com"},
		{"lit not a broadcast", bot.Lit, "@channels is not a broadcast", "@channels is not a broadcast"},
		{"lit bold", bot.Lit, "*APPROVED by CFO*", star + "APPROVED by CFO" + star},
		{"lit italic strike code", bot.Lit, "_a_ ~b~ `c`", low + "a" + low + " <!date^0^{_}|~>b<!date^0^{_}|~> ˋcˋ"},
		{"lit inside a word", bot.Lit, "order_id and 2*3", "order_id and 2*3"},
		{"lit quote first line", bot.Lit, "> quoted", shy + "&gt; quoted"},
		{"lit quote later line", bot.Lit, "one\n  > two", "one\n  " + shy + "&gt; two"},
		{"lit arrow mid-line", bot.Lit, "a > b", "a &gt; b"},
		{"code plain", bot.Code, "issue_refund", "`issue_refund`"},
		{"code markup", bot.Code, "a`b *c* <!here>\nd", "`aˋb *c* &lt;!here&gt; d`"},
		{"code empty", bot.Code, "", "` `"},
		{"code block fence", bot.CodeBlock, "x```y <@U1>", "```\nx`" + zwj + "`" + zwj + "`y &lt;@U1&gt;\n```"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.fn(tt.in); got != tt.want {
				t.Errorf("%s(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
			}
		})
	}
}
