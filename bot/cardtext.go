package bot

import (
	"encoding/json"
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
