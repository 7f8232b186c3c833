package bot

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
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

// softHyphen, invisible, goes before a line's leading "&gt;" so that the
// line is not a block quote.
const softHyphen = "\u00ad"

var broadcastWords = regexp.MustCompile(`(?i)@(channel|here|everyone)\b`)

// Text that Countersign did not write — anything from the model, an API
// caller, a tool's output or a system of record — reaches Slack's mrkdwn
// in one of three ways, and in no other (docs/slack.md "Text from the
// model and callers"):
//
//   - lit: in a sentence, shown exactly as typed;
//   - code: a name or a short value, as an inline code span;
//   - codeBlock: a value in a ``` block (the arguments, an edit's diff).
//
// None of them lets the text format (bold, italic, strike, a quote, code
// of its own), mention, broadcast or link. Plain-text objects (headers,
// button labels, modal inputs) need none of them: Slack shows plain text
// as it is.

// entities escapes &, < and > (so no <!channel>, <@U…> or <http://…|…>
// survives as markup) and breaks bare @channel, @here and @everyone with
// a zero-width joiner. It is the part the three ways share.
func entities(s string) string {
	s = strings.ReplaceAll(s, "&", "&amp;")
	s = strings.ReplaceAll(s, "<", "&lt;")
	s = strings.ReplaceAll(s, ">", "&gt;")
	if strings.IndexByte(s, '@') < 0 {
		return s // no broadcast word: the case-blind regexp is most of the cost
	}
	return broadcastWords.ReplaceAllStringFunc(s, func(m string) string { return "@" + zwj + m[1:] })
}

// asTyped is how lit shows *, _ and ~: the fallback text of a date Slack
// cannot format (an unknown token), which Slack always shows as plain
// text. Slack has no escape for them; this is the one way to show them as
// typed without changing the character (jsx-slack's <Escape> does the
// same). Not for a backtick: code spans are found before controls, so a
// backtick inside one would still pair with another.
func asTyped(c byte) string { return "<!date^0^{_}|" + string(c) + ">" }

// lit makes untrusted text safe in a mrkdwn sentence and shows it as
// typed: entities, then each *, _ and ~ that could open or close
// formatting shown through asTyped (one between two letters or digits,
// as in order_id, cannot, so it is left alone), a backtick, which would
// open code, as ˋ (codeSpanTick), and a "&gt;" that begins a line (a
// block quote) preceded by a soft hyphen.
func lit(s string) string {
	s = entities(s)
	if !strings.ContainsAny(s, "*_~`") && !strings.Contains(s, "&gt;") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	lineStart := true // only blanks so far on this line
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '`':
			b.WriteString(codeSpanTick)
			lineStart = false
			continue
		case c == '*' || c == '_' || c == '~':
			if i > 0 && i+1 < len(s) && alnum(s[i-1]) && alnum(s[i+1]) {
				b.WriteByte(c)
			} else {
				b.WriteString(asTyped(c))
			}
			lineStart = false
			continue
		case c == '&' && lineStart && strings.HasPrefix(s[i:], "&gt;"):
			b.WriteString(softHyphen)
		}
		b.WriteByte(c)
		switch c {
		case '\n':
			lineStart = true
		case ' ', '\t':
		default:
			lineStart = false
		}
	}
	return b.String()
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// codeSpanTick (U+02CB) stands for a backtick, which Slack cannot show
// outside a code block: it would open code in a sentence, end a code span
// inside one.
const codeSpanTick = "ˋ"

// code shows untrusted text as an inline code span: a name, an id, a short
// value. Slack formats nothing inside one; a backtick is shown as ˋ
// (codeSpanTick) and a line break as a space (a span is one line).
func code(s string) string {
	s = strings.ReplaceAll(entities(s), "`", codeSpanTick)
	s = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
	if s == "" {
		s = " "
	}
	return "`" + s + "`"
}

// codeBlock shows untrusted text as a mrkdwn code block: entities, and a
// run of three backticks broken with zero-width joiners so that it cannot
// close the block early.
func codeBlock(s string) string {
	s = strings.ReplaceAll(entities(s), "```", "`"+zwj+"`"+zwj+"`")
	if s == "" {
		s = " "
	}
	return "```\n" + s + "\n```"
}

// escapedMention is a user mention (<@U…>, <@W…> on Enterprise Grid) after
// lit.
var escapedMention = regexp.MustCompile(`&lt;@([UW][A-Z0-9]{2,32})&gt;`)

// keepMentions turns the user mentions lit escaped back into mentions, so
// that people named in an answer (the agent writes approvers as <@U…>)
// read as their names; nothing else lit escaped comes back.
func keepMentions(escaped string) string {
	return escapedMention.ReplaceAllString(escaped, "<@$1>")
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

// wholeMarkup drops what a cut left of a mrkdwn control (<…>) or entity
// (&amp;…) at the end of s, so that a cut never leaves half of one for
// Slack to show raw. Text that is not mrkdwn yet loses at most a few
// characters before the truncation note.
func wholeMarkup(s string) string {
	if i := strings.LastIndexByte(s, '<'); i >= 0 && strings.IndexByte(s[i:], '>') < 0 {
		s = s[:i]
	}
	if i := strings.LastIndexByte(s, '&'); i >= 0 && len(s)-i < 6 && strings.IndexByte(s[i:], ';') < 0 {
		s = s[:i]
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
	// The longest prefix whose rendering fits, found by halving: render
	// may make text many times longer (lit shows a formatting mark in 15
	// characters), so how far over one try is says little of the next.
	best, found := "", false
	for lo, hi := 0, min(total, limit); lo <= hi; {
		keep := (lo + hi) / 2
		if out := render(wholeMarkup(firstRunes(raw, keep)) + note); runes(out) <= limit {
			best, found, lo = out, true, keep+1
		} else {
			hi = keep - 1
		}
	}
	if found {
		return best
	}
	return clip.Runes(render(""), limit)
}

// plainFit cuts plain (already safe) text to limit runes with a note.
func plainFit(s string, limit int) string { return fit(s, limit, func(s string) string { return s }) }

// litFit is lit(s) within limit runes.
func litFit(s string, limit int) string { return fit(s, limit, lit) }

// slackDate renders t with Slack's date formatting (each reader sees their
// own time zone) and a UTC fallback.
func slackDate(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return fmt.Sprintf("<!date^%d^{date_short_pretty} at {time}|%s>", t.Unix(), t.UTC().Format("2006-01-02 15:04 UTC"))
}

var slackIDRe = regexp.MustCompile(`^[A-Z0-9]{2,32}$`)

// slackTS matches a message timestamp ("1700000000.000100").
var slackTS = regexp.MustCompile(`^[0-9]{1,12}\.[0-9]{6}$`)

// mention renders a user id as a mention; anything that is not a plain
// Slack id is shown escaped instead.
func mention(user string) string {
	if slackIDRe.MatchString(user) {
		return "<@" + user + ">"
	}
	if user == "" {
		return "someone"
	}
	return lit(user)
}

// channelRef renders a channel id as a link.
func channelRef(ch string) string {
	if slackIDRe.MatchString(ch) {
		return "<#" + ch + ">"
	}
	return lit(ch)
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

// maxMentions bounds how many people and groups one reminder pings.
const maxMentions = 20

// mentions pings the users and usergroups a. Ids that are not plain Slack
// ids are shown escaped (never as a broadcast); the list is bounded.
func mentions(a approval.Approvers) string {
	return strings.Join(mentionList(a), " ")
}

// mentionList is mentions, one entry per user or usergroup.
func mentionList(a approval.Approvers) []string {
	var parts []string
	for _, u := range a.Users {
		parts = append(parts, mention(u))
	}
	for _, g := range a.Usergroups {
		if slackIDRe.MatchString(g) {
			parts = append(parts, "<!subteam^"+g+">")
		} else {
			parts = append(parts, lit(g))
		}
	}
	if len(parts) > maxMentions {
		parts = append(parts[:maxMentions], fmt.Sprintf("and %d more", len(parts)-maxMentions))
	}
	return parts
}
