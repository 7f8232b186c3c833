package bot

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/countersign/countersign/approval/clip"
)

// Block Kit limits (Slack's documented values) the bot renders within.
const (
	maxMessageBlocks = 50
	maxViewBlocks    = 100
	maxSectionText   = 3000
	maxSectionFields = 10
	maxFieldText     = 2000
	maxHeaderText    = 150
	maxContextText   = 3000
	maxButtonValue   = 2000
	maxModalTitle    = 24
	maxPrivateMeta   = 3000
	maxInitialValue  = 3000
	maxInputLabel    = 2000
	maxInputHint     = 2000
	maxOptionText    = 75
	maxSelectOptions = 100
	maxFallbackText  = 3000 // far below the 40,000 limit; it only feeds notifications
)

// zwj is inserted to break words Slack would otherwise treat specially.
const zwj = "\u200d"

var broadcastWords = regexp.MustCompile(`(?i)@(channel|here|everyone)\b`)

// esc makes untrusted text safe inside mrkdwn: &, < and > are escaped, so no
// <!channel>, <@U…> or <http://…|…> survives as markup, and bare @channel,
// @here and @everyone are broken with a zero-width joiner.
func esc(s string) string {
	s = strings.ReplaceAll(s, "&", "&amp;")
	s = strings.ReplaceAll(s, "<", "&lt;")
	s = strings.ReplaceAll(s, ">", "&gt;")
	if strings.IndexByte(s, '@') < 0 {
		return s // no broadcast word: the case-blind regexp is most of esc's cost
	}
	return broadcastWords.ReplaceAllStringFunc(s, func(m string) string { return "@" + zwj + m[1:] })
}

// escapedMention is a user mention (<@U…>, <@W…> on Enterprise Grid) after
// esc.
var escapedMention = regexp.MustCompile(`&lt;@([UW][A-Z0-9]{2,32})&gt;`)

// keepMentions turns the user mentions esc escaped back into mentions, so
// that people named in an answer (the agent writes approvers as <@U…>)
// read as their names; nothing else esc escaped comes back.
func keepMentions(escaped string) string {
	return escapedMention.ReplaceAllString(escaped, "<@$1>")
}

// escCode is esc for text shown inside a ``` code block: a run of three
// backticks cannot close the block early.
func escCode(s string) string {
	return strings.ReplaceAll(esc(s), "```", "`"+zwj+"`"+zwj+"`")
}

// codeBlock renders s as a mrkdwn code block. s must already be escaped.
func codeBlock(s string) string {
	if s == "" {
		s = " "
	}
	return "```\n" + s + "\n```"
}

// runes is the length Slack counts.
func runes(s string) int { return utf8.RuneCountInString(s) }

// firstRunes returns the first n runes of s (all of s when shorter): a
// prefix, not a cut. chunks splits with it, and fit follows it with
// truncNote, which begins with clip's marker; everything else that cuts
// text for Slack uses clip.Runes.
func firstRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if runes(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// truncNote is the visible note that a value was cut: clip's marker, then
// how long the value was, so an approver knows how much the card hides.
func truncNote(total int) string { return clip.Marker + fmt.Sprintf(" (truncated, %d chars)", total) }

// fit renders raw with render so the result has at most limit runes. When
// raw must be cut, the kept prefix is followed by a visible "… (truncated, N
// chars)" note before rendering, N being raw's full length.
func fit(raw string, limit int, render func(string) string) string {
	if out := render(raw); runes(out) <= limit {
		return out
	}
	total := runes(raw)
	note := truncNote(total)
	keep := min(total, limit)
	for keep > 0 {
		out := render(firstRunes(raw, keep) + note)
		over := runes(out) - limit
		if over <= 0 {
			return out
		}
		keep -= max(over, keep/8, 1)
	}
	if out := render(note); runes(out) <= limit {
		return out
	}
	return clip.Runes(render(""), limit)
}

// plainFit cuts plain (already safe) text to limit runes with a note.
func plainFit(s string, limit int) string { return fit(s, limit, func(s string) string { return s }) }

// escFit escapes s for mrkdwn within limit runes.
func escFit(s string, limit int) string { return fit(s, limit, esc) }

// slackDate renders t with Slack's date formatting (each reader sees their
// own time zone) and a UTC fallback.
func slackDate(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return fmt.Sprintf("<!date^%d^{date_short_pretty} at {time}|%s>", t.Unix(), t.UTC().Format("2006-01-02 15:04 UTC"))
}

var slackIDRe = regexp.MustCompile(`^[A-Z0-9]{2,32}$`)

// mention renders a user id as a mention; anything that is not a plain
// Slack id is shown escaped instead.
func mention(user string) string {
	if slackIDRe.MatchString(user) {
		return "<@" + user + ">"
	}
	if user == "" {
		return "someone"
	}
	return esc(user)
}

// channelRef renders a channel id as a link.
func channelRef(ch string) string {
	if slackIDRe.MatchString(ch) {
		return "<#" + ch + ">"
	}
	return esc(ch)
}

// safeURL reports whether u may be put inside <u|text>.
func safeURL(u string) bool {
	return (strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")) &&
		!strings.ContainsAny(u, "<>| \n\t") && len(u) < 2000
}

// link renders <url|text> when url is safe, else text alone.
func link(url, text string) string {
	if safeURL(url) {
		return "<" + url + "|" + text + ">"
	}
	return text
}

// slackID reports whether s has the shape of a Slack id (user, team,
// enterprise, channel; event ids too): 1 to 64 letters, digits, '_' or
// '-'. A payload naming an id of another shape is refused before the id
// reaches a lookup, a log line or the audit stream.
func slackID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// slackIDs reports whether each of ids is empty or has the shape of a
// Slack id (slackID).
func slackIDs(ids ...string) bool {
	for _, id := range ids {
		if id != "" && !slackID(id) {
			return false
		}
	}
	return true
}

// plural is noun for n of them ("call", "calls"); the nouns the card
// counts take an s.
func plural(n int, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}
