package bot_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
)

// hostile is what a model or an API caller writes to pass for the card's
// own words: a broadcast, a mention, each of Slack's formatting marks, a
// link with a label of its choosing and a quote on a line of its own.
const hostile = "<!channel> <@" + mallory + "> *B1* _I1_ ~S1~ `C1` <https://evil.example/ok|L1>\n> Q1"

// hostileShort fits where a name is cut short (a tool, an MCP upstream).
const hostileShort = "*B2* _I2_ `C2` <!here>"

// literals are, for each marker word of hostile and hostileShort, the
// markup that must still show around it wherever it shows at all: shown
// as typed, it formatted, mentioned, linked or quoted nothing.
var literals = map[string]string{
	"B1": "*B1", "I1": "_I1", "S1": "~S1", "C1": "`C1", "L1": "|L1", "Q1": "> Q1",
	"B2": "*B2", "I2": "_I2", "C2": "`C2",
}

// TestUntrustedTextReadsAsData (issue 46): every string a model or an API
// caller writes reaches Slack as data, wherever it goes: card sections and
// fields, the "What will happen" sentence, the arguments, facts, results,
// a question and its answers, modals, the task thread's lines, reminders,
// the App Home tab, the slash command's answer and ephemerals. Each mrkdwn
// text the bot sent the workspace (Web API calls and answers alike) is
// rendered as Slack renders it (renderMrkdwn, the rules the local
// workspace's page follows) and nothing in it may broadcast, mention
// mallory, link to evil.example, or lose the markup around a hostile word
// (its *, _, ~, `, | or leading >) to formatting. Every mrkdwn text object
// is verbatim, so Slack links no bare URL and parses no bare @word either.
// The run's answer alone may mention people (the agent names approvers).
func TestUntrustedTextReadsAsData(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: externalPolicy})
	long := strings.Repeat("filler ", 60) + hostile
	hostileArgs, _ := json.Marshal(map[string]any{"text": hostile, "long": long, hostileShort: 1, "n": 2})
	hostileResult, _ := json.Marshal(map[string]any{"status": hostile, "id": hostileShort})
	toolName := "post" + hostileShort

	r := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared, r.Args, r.Reason = toolName, true, hostileArgs, hostile
		r.Caller = approval.Caller{Kind: approval.CallerAPI, Name: "support-bot", Upstream: hostileShort}
		r.Preview = approval.Preview{Summary: hostile, Error: hostile, Source: hostileShort,
			Facts:       []approval.Fact{{Label: hostileShort, Value: hostile}},
			CallerFacts: []approval.Fact{{Label: hostileShort, Value: "caller says " + hostile}}}
		r.Signals = []approval.Signal{{Code: approval.SignalWhenRule, Text: hostile}}
		r.Approvers = approval.Approvers{Users: []string{bob, carol}}
	})
	// Modals: Edit (the whole object as JSON: a tool the policy does not
	// declare) and Reject; a refused click's ephemeral.
	h.editModalOf(bob, r)
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_reject"); err != nil {
		t.Fatal(err)
	}
	h.openView(bob, "cs_reject")
	if err := h.ws.Click(alice, approvals, r.Card.TS, "cs_approve"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(alice, "someone else has to decide")
	// Reminders, escalation, App Home and the slash command.
	if err := h.bot.Remind(h.ctx, h.load(r.ID), 2); err != nil {
		t.Fatalf("Remind: %v", err)
	}
	esc := h.load(r.ID)
	esc.Escalated = &approval.Escalation{At: h.clock.Now(), To: approval.Approvers{Users: []string{carol}}, Widened: true}
	if err := h.bot.Escalate(h.ctx, esc); err != nil {
		t.Fatalf("Escalate: %v", err)
	}
	h.ws.OpenHome(bob)
	h.waitWS("bob's App Home", func() bool { v, ok := h.ws.Home(bob); return ok && strings.Contains(string(v.Blocks), "B2") })
	h.ws.OpenHome(alice)
	h.waitWS("alice's App Home", func() bool { v, ok := h.ws.Home(alice); return ok && strings.Contains(string(v.Blocks), "B2") })
	if err := h.ws.SlashCommand(bob, approvals, "/countersign", "pending"); err != nil {
		t.Fatal(err)
	}
	h.ephemeralContaining(bob, "Waiting for your decision")

	// Decided: a rejection with the hostile text as its reason, told in
	// the task thread; marked wrong with it.
	cur := h.load(r.ID)
	rejected, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictReject, Approver: bob,
		At: h.clock.Now(), Digest: cur.Digest, Text: hostile}, approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	h.redraw(rejected)
	h.decided(rejected)
	if _, err := h.life.Feedback(h.ctx, r.ID, approval.Feedback{Wrong: true, By: carol, At: h.clock.Now(), Reason: hostile}); err != nil {
		t.Fatalf("Feedback: %v", err)
	}
	h.cardsIdle()

	// Ran: its result, hostile, on the card and the thread.
	ran := h.request(func(r *approval.Request) { r.Tool, r.Undeclared, r.Args = toolName, true, hostileArgs })
	cur = h.load(ran.ID)
	if _, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: ran.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Claim(h.ctx, ran.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	done, err := h.store.Finish(h.ctx, ran.ID, approval.StatusExecuted, string(hostileResult))
	if err != nil {
		t.Fatal(err)
	}
	h.redraw(done)
	h.decided(done)
	plain := h.request(func(r *approval.Request) { r.Tool, r.Undeclared = toolName, true })
	cur = h.load(plain.ID)
	if _, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: plain.ID, Verdict: approval.VerdictApprove, Approver: bob, At: h.clock.Now(), Digest: cur.Digest}, approval.DecideOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.store.Claim(h.ctx, plain.ID, "agent", "", ""); err != nil {
		t.Fatal(err)
	}
	if done, err = h.store.Finish(h.ctx, plain.ID, approval.StatusFailed, hostile); err != nil {
		t.Fatal(err)
	}
	h.redraw(done)

	// A question with hostile words, answers and an answer to it.
	q := contactRequest(h, hostile, []approval.Choice{{Name: "a", Title: hostileShort, Description: hostile}})
	if err := h.ws.Click(bob, approvals, q.Card.TS, "cs_respond"); err != nil {
		t.Fatal(err)
	}
	h.openView(bob, "cs_respond")
	cur = h.load(q.ID)
	answered, err := h.life.Decide(h.ctx, cur, approval.Decision{RequestID: q.ID, Verdict: approval.VerdictRespond, Approver: bob,
		At: h.clock.Now(), Digest: cur.Digest, Choice: "a", Text: hostile}, approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide(answer): %v", err)
	}
	h.redraw(answered)

	// The run's answer and a line the agent says.
	if err := h.bot.PostRunResult(h.ctx, approval.RunResult{Origin: r.Origin, Status: approval.RunDone, Answer: "Answer: " + hostile, Rejected: 1}); err != nil {
		t.Fatal(err)
	}
	if err := h.bot.Say(h.ctx, r.Origin, hostile); err != nil {
		t.Fatal(err)
	}
	h.cardsIdle()

	// Mentions are kept, by design, in the run's answer (the agent names the
	// approvers it was told of) and in the thread's line about a person's
	// decision (their own words); formatting, broadcasts and links are not.
	mayMention := func(text string) bool {
		return strings.HasPrefix(text, "Answer: ") || strings.HasPrefix(text, "❌ ")
	}
	reached := map[string]int{} // surface → texts holding hostile words checked there
	check := func(where, text string) {
		if !strings.Contains(text, "B1") && !strings.Contains(text, "B2") {
			return // holds nothing hostile
		}
		reached[where]++
		out := renderMrkdwn(text)
		for _, c := range out.controls {
			switch {
			case c.kind == "broadcast":
				t.Errorf("%s broadcasts (<!%s>):\n%s", where, c.target, text)
			case c.kind == "user" && c.target == mallory && !mayMention(text):
				t.Errorf("%s mentions mallory:\n%s", where, text)
			case c.kind == "link" && strings.Contains(c.target, "evil.example"):
				t.Errorf("%s links to %s:\n%s", where, c.target, text)
			}
		}
		visible := strings.ReplaceAll(out.visible, "ˋ", "`")
		for word, lit := range literals {
			if strings.Contains(visible, word) && !strings.Contains(visible, lit) {
				t.Errorf("%s shows %s without its markup %q (it formatted):\nsent    %q\nvisible %q", where, word, lit, text, out.visible)
			}
		}
	}
	for _, c := range h.ws.CallLog() {
		if c.Error != "" {
			continue
		}
		where := c.Method
		if text, ok := c.Params["text"]; ok {
			check(where+" text", text)
		}
		for _, key := range []string{"blocks", "view"} {
			raw, ok := c.Params[key]
			if !ok {
				continue
			}
			walkText(json.RawMessage(raw), func(typ, text string, verbatim bool) {
				if typ != "mrkdwn" {
					return
				}
				if !verbatim {
					t.Errorf("%s %s: a mrkdwn text that is not verbatim: %q", where, key, text)
				}
				check(where+" "+key, text)
			})
		}
	}
	for _, u := range []string{alice, bob, carol} {
		for _, m := range h.ws.Ephemerals(u) {
			check("ephemeral to "+u, m.Text)
			walkText(m.Blocks, func(typ, text string, _ bool) {
				if typ == "mrkdwn" {
					check("ephemeral blocks to "+u, text)
				}
			})
		}
	}
	for _, where := range []string{"chat.postMessage text", "chat.postMessage blocks", "chat.update text", "chat.update blocks",
		"views.open view", "views.publish view", "ephemeral blocks to " + bob} {
		if reached[where] == 0 {
			t.Errorf("no hostile text reached %s: the walk misses a surface (reached %v)", where, reached)
		}
	}
	t.Logf("texts with hostile words checked, by surface: %v", reached)
}

// walkText calls fn for every text object in Block Kit JSON (blocks or a
// view), with its type and whether it is verbatim.
func walkText(raw json.RawMessage, fn func(typ, text string, verbatim bool)) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if typ, ok := x["type"].(string); ok && (typ == "mrkdwn" || typ == "plain_text") {
				if text, ok := x["text"].(string); ok {
					verbatim, _ := x["verbatim"].(bool)
					fn(typ, text, verbatim)
					return
				}
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(v)
}

// rendered is what Slack shows of a mrkdwn text: the visible characters
// and the controls (<…>) it acted on.
type rendered struct {
	visible  string
	controls []control
}

type control struct {
	kind   string // user, channel, broadcast, group, date, link
	target string
}

var (
	controlRe  = regexp.MustCompile(`<([^<>]+)>`)
	codeSpanRe = regexp.MustCompile("`[^`\n]+`")
	quoteRe    = regexp.MustCompile(`^(&gt;|>)\s?(.*)$`)
	dateToken  = regexp.MustCompile(`\{(date_num|date|date_short|date_long|date_pretty|date_short_pretty|date_long_pretty|time|time_secs|ago)\}`)
	entity     = strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&")
)

// renderMrkdwn renders text as Slack does (and the local workspace's page,
// bot/slacksim/ui/app.js, which follows it): ``` blocks and `code` spans
// are literal; a line beginning with > (or &gt;) is a quote; <…> controls
// are mentions, broadcasts, dates (a date whose format has no token shows
// its fallback text as plain text) and links; *bold*, _italic_ and
// ~strike~ consume their marks where they open after a non-word character
// and close before one.
func renderMrkdwn(text string) rendered {
	var out rendered
	var sb strings.Builder
	for i, part := range strings.Split(text, "```") {
		if i%2 == 1 {
			sb.WriteString(entity.Replace(strings.TrimPrefix(part, "\n")))
			continue
		}
		for j, line := range strings.Split(part, "\n") {
			if j > 0 {
				sb.WriteString("\n")
			}
			if m := quoteRe.FindStringSubmatch(line); m != nil {
				line = m[2] // the quote's mark is not shown
			}
			last := 0
			for _, loc := range codeSpanRe.FindAllStringIndex(line, -1) {
				out.inline(&sb, line[last:loc[0]])
				sb.WriteString(entity.Replace(line[loc[0]+1 : loc[1]-1]))
				last = loc[1]
			}
			out.inline(&sb, line[last:])
		}
	}
	out.visible = sb.String()
	return out
}

// inline renders s, one line without code spans: its controls, then the
// styles of the text between them.
func (r *rendered) inline(sb *strings.Builder, s string) {
	last := 0
	for _, m := range controlRe.FindAllStringSubmatchIndex(s, -1) {
		sb.WriteString(styles(s[last:m[0]]))
		body := s[m[2]:m[3]]
		target, label, _ := strings.Cut(body, "|")
		switch {
		case strings.HasPrefix(target, "@"):
			r.controls = append(r.controls, control{"user", target[1:]})
			sb.WriteString("@user")
		case strings.HasPrefix(target, "#"):
			r.controls = append(r.controls, control{"channel", target[1:]})
			sb.WriteString("#channel")
		case strings.HasPrefix(target, "!date^"):
			parts := strings.Split(target, "^")
			r.controls = append(r.controls, control{"date", target})
			if len(parts) >= 3 && dateToken.MatchString(parts[2]) {
				sb.WriteString("a date")
			} else {
				sb.WriteString(entity.Replace(label)) // the fallback, as plain text
			}
		case strings.HasPrefix(target, "!subteam^"):
			r.controls = append(r.controls, control{"group", target})
			sb.WriteString("@group")
		case strings.HasPrefix(target, "!"):
			r.controls = append(r.controls, control{"broadcast", target[1:]})
			sb.WriteString("@" + target[1:])
		default:
			r.controls = append(r.controls, control{"link", entity.Replace(target)})
			sb.WriteString(entity.Replace(label))
		}
		last = m[1]
	}
	sb.WriteString(styles(s[last:]))
}

// styles removes the marks of *bold*, _italic_ and ~strike~ where Slack
// would format: an opening mark at the start or after a character that is
// not a word character (nor the mark), followed by a non-space; the next
// mark on the line closing it when a non-space precedes it and no word
// character follows.
func styles(s string) string {
	b := []byte(s)
	for _, mark := range []byte{'*', '_', '~'} {
		var out []byte
		for i := 0; i < len(b); i++ {
			if b[i] == mark && (i == 0 || !word(b[i-1]) && b[i-1] != mark) && i+1 < len(b) && !space(b[i+1]) {
				if j := closing(b, i, mark); j > 0 {
					out = append(out, b[i+1:j]...)
					i = j
					continue
				}
			}
			out = append(out, b[i])
		}
		b = out
	}
	return entity.Replace(string(b))
}

func closing(b []byte, i int, mark byte) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\n':
			return -1
		case mark:
			if j > i+1 && !space(b[j-1]) && (j+1 == len(b) || !word(b[j+1])) {
				return j
			}
			return -1
		}
	}
	return -1
}

func word(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
