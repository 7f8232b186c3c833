package bot

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Budgets of the plain "What will happen" sentence.
const (
	sentenceArgsMax   = 5  // arguments named in it
	sentenceValue     = 60 // runes of each argument's value
	sentenceDescLimit = 300
)

// whatWillHappen is the card's "What will happen" when no system of record
// previews r's tool: a plain sentence built from the policy's description
// of the tool and r's arguments, labelled as such. It never holds text the
// model wrote (its reason is shown apart, as the model's). Escaped mrkdwn.
func whatWillHappen(r *approval.Request, description string) string {
	what := strings.TrimSpace(strings.Join(strings.Fields(description), " "))
	what = strings.TrimRight(what, ".")
	if what == "" {
		what = "Runs *" + esc(clip.Runes(r.Tool, 100)) + "*"
	} else {
		what = esc(plainFit(what, sentenceDescLimit))
	}
	if args := sentenceArgs(r.Args, r.Formats); args != "" {
		what += " — " + esc(args)
	}
	return what + ".\n_From the tool's description and its arguments: no system of record previews this tool._"
}

// sentenceArgs names r's arguments in a sentence ("customer_id C-300,
// amount $64.00, note “Sent today.”"): words and ids as they are, text in
// quotes, on one line, values cut with a note, at most sentenceArgsMax of
// them. Not escaped.
func sentenceArgs(args json.RawMessage, formats map[string]approval.ValueFormat) string {
	items := argItems(args)
	parts := make([]string, 0, min(len(items), sentenceArgsMax)+1)
	for i, it := range items {
		if i == sentenceArgsMax {
			parts = append(parts, fmt.Sprintf("and %d more", len(items)-i))
			break
		}
		v := it.value
		var s string
		if json.Unmarshal(it.raw, &s) == nil {
			// A word or an id reads as it is; text is quoted, so its
			// own punctuation does not run into the sentence's.
			v = plainFit(oneLine(s), sentenceValue)
			if strings.Contains(v, " ") {
				v = "“" + v + "”"
			}
		} else {
			v = plainFit(oneLine(v), sentenceValue)
		}
		if f := formatted(it, formats); f != "" {
			v = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(f), "="))
		}
		parts = append(parts, clip.Runes(it.name, 60)+" "+v)
	}
	return strings.Join(parts, ", ")
}

// oneLine folds s's runs of white space (newlines too) into single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// plumbingKey matches result fields that are plumbing, not what happened:
// the idempotency key Countersign sent with the call.
var plumbingKey = regexp.MustCompile(`(?i)^idempotency[-_]?key$`)

// resultSummary is r's result for people, on one line of escaped mrkdwn:
// a JSON object as its scalar fields ("id EM-1 · subject Sorry · to
// dana@example.com"), a list as its length, text as it is. It leaves out
// the idempotency key and long values that only repeat an argument the
// card already shows (an email's body); every value is cut to
// resultValueLimit and the line to resultLimit, each with a note. A field
// named like an argument the policy formats reads in that format
// ("amount $64.00").
func resultSummary(r *approval.Request) string {
	s := strings.TrimSpace(r.Result)
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return escFit(oneLine(s), resultLimit)
	}
	switch v := v.(type) {
	case map[string]any:
		args := argValues(r.Args)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var parts []string
		for _, k := range keys {
			var text string
			switch x := v[k].(type) {
			case string:
				text = x
				if f, ok := r.Formats[k]; ok && f.Kind != "" {
					text = f.Apply(x)
				}
			case json.Number:
				text = x.String()
				if f, ok := r.Formats[k]; ok && f.Kind != "" {
					text = f.Apply(x)
				}
			case bool:
				text = fmt.Sprint(x)
			default:
				continue
			}
			if plumbingKey.MatchString(k) {
				continue
			}
			if a, ok := args[k]; ok && a == v[k] && (runes(text) > resultValueLimit || strings.Contains(text, "\n")) {
				continue // the card shows it among the arguments
			}
			parts = append(parts, argName(k)+" "+plainFit(oneLine(text), resultValueLimit))
		}
		if len(parts) == 0 {
			return "done"
		}
		return escFit(strings.Join(parts, " · "), resultLimit)
	case []any:
		return fmt.Sprintf("%d items", len(v))
	case string:
		return escFit(oneLine(v), resultLimit)
	}
	return escFit(oneLine(s), resultLimit)
}

// argValues is args' top-level values by name.
func argValues(args json.RawMessage) map[string]any {
	var obj map[string]any
	if json.Unmarshal(args, &obj) != nil {
		return nil
	}
	return obj
}

// whoDecides names who may decide r, for a person refused as not one of
// them: user mentions and group handles (Slack shows names, not ids) and
// the approvals channel when its members decide (approval.Authorize).
func whoDecides(r *approval.Request, approvalsChannel string) string {
	a := r.Approvers
	who := mentionList(a)
	if a.ChannelMembers || (len(a.Users) == 0 && len(a.Usergroups) == 0) {
		who = append(who, "members of "+channelRef(approvalsChannel))
	}
	s := "Who decides: "
	switch len(who) {
	case 1:
		s += who[0]
	default:
		s += strings.Join(who[:len(who)-1], ", ") + " or " + who[len(who)-1]
	}
	if askers := askerNames(r, "or", true); !a.AllowSelf && askers != "" {
		s += " (not " + askers + ", who asked)"
	}
	return s + "."
}
