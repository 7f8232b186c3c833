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

// sentenceDescLimit bounds the policy's description in the plain "What
// will happen" sentence.
const sentenceDescLimit = 300

// whatWillHappen is the card's "What will happen" when no system of record
// summarises r's call: the policy's description of the tool, labelled as
// such, or the tool's name when the policy has none. It names none of the
// arguments (their block, right below, shows them exactly, once) and never
// holds text the model wrote (its reason is shown apart, as the model's).
// Safe mrkdwn.
func whatWillHappen(r *approval.Request, description string) string {
	what := strings.TrimSpace(strings.Join(strings.Fields(description), " "))
	what = strings.TrimRight(what, ".")
	if what == "" {
		return "Runs " + code(clip.Runes(r.Tool, 100)) + " with the arguments below."
	}
	return lit(plainFit(what, sentenceDescLimit)) + ".\n_The policy's description of the tool; its arguments are below._"
}

// oneLine folds s's runs of white space (newlines too) into single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// plumbingKey matches result fields that are plumbing, not what happened:
// the idempotency key Countersign sent with the call.
var plumbingKey = regexp.MustCompile(`(?i)^idempotency[-_]?key$`)

// resultSummary is r's result for people, on one line of safe mrkdwn (lit):
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
		return litFit(oneLine(s), resultLimit)
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
		return litFit(strings.Join(parts, " · "), resultLimit)
	case []any:
		return fmt.Sprintf("%d items", len(v))
	case string:
		return litFit(oneLine(v), resultLimit)
	}
	return litFit(oneLine(s), resultLimit)
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
