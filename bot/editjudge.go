package bot

// This file: an edit is a new proposal. The Edit modal's fields come from
// the policy's schema of a declared tool, or are one JSON object for a
// tool the policy does not declare (an API or MCP caller's); a submitted
// edit is judged by the lifecycle (Lifecycle.Judge: schema, deny rules,
// review, quorum) before Slack is answered, so each problem shows on its
// field. The lifecycle judges it again when it records the decision.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/policyfile"
)

// editFieldsOf returns the Edit modal's typed fields for r: one per
// property of the policy's schema for a tool the policy declares; none
// (the whole arguments object as JSON) for a tool it does not declare.
func (b *Bot) editFieldsOf(r *approval.Request) []field {
	if _, declared := b.policy.Tool(r.Tool); !declared {
		return nil
	}
	return editFields(toolSchema(b.policy, r.Tool))
}

// judgeEdit reads the submitted edit of r (values) into arguments and has
// the lifecycle judge them as a new proposal. Problems come back keyed by
// block_id, ready for response_action "errors": a schema violation on the
// field it concerns, a deny rule on the field it reads. An edit whose call
// needs more approvals than r asks for is no problem: it is recorded as
// one approval, and the card asks for the rest.
func (b *Bot) judgeEdit(r *approval.Request, fields []field, values map[string]map[string]inputValue) (json.RawMessage, map[string]string) {
	args, errs := applyEdit(r.Args, fields, values)
	if len(errs) > 0 {
		return nil, errs
	}
	as, err := b.lifecycle.Judge(approval.EditedCall(r, args), r.InputSchema, r.Requester, r.Caller.External())
	switch {
	case err == nil && as.Denied != nil:
		return nil, map[string]string{deniedBlock(as.Denied, fields, values): plainFit("The policy refuses this: "+as.Denied.Reason, maxErrorText)}
	case err == nil:
		return args, nil
	case errors.Is(err, approval.ErrInvalidArgs):
		if _, ok := errors.AsType[*policyfile.ArgsError](err); ok {
			return nil, schemaErrors(err, fields, values)
		}
		return nil, map[string]string{firstBlock(fields, values): plainFit(invalidText(err), maxErrorText)}
	case errors.Is(err, approval.ErrUnknownTool):
		return nil, map[string]string{firstBlock(fields, values): "This tool is no longer in the policy, so its call cannot be edited."}
	}
	b.log.Error("edit not judged; refused", "request_id", r.ID, "tool", r.Tool, "err", err)
	return nil, map[string]string{firstBlock(fields, values): "Internal error: the edit could not be checked, so nothing changed."}
}

// invalidText is what an approver reads about arguments that are not
// valid for a reason no schema field names (not a JSON object, a
// caller's schema that cannot be used): the explanation after the
// sentinel's text.
func invalidText(err error) string {
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, approval.ErrInvalidArgs.Error()+": "); ok && after != "" {
		msg = after
	} else {
		return "Those arguments are not valid."
	}
	return "Not valid: " + msg + "."
}

// editQuorumLine says, on the card of a pending request an approver
// edited, how many approvals its edited call still needs and why: the edit
// counts as its author's approval, and one approver can never supply the
// approvals an edit made necessary. Empty when nothing more is needed.
func editQuorumLine(r *approval.Request) string {
	ed := approval.EditOf(r)
	q := max(r.Quorum, 1)
	if r.Status != approval.StatusPending || ed == nil || len(r.Approvals) >= q {
		return ""
	}
	left := q - len(r.Approvals)
	s := fmt.Sprintf("*%d more %s needed:* the edited call needs %d", left, plural(left, "approval"), q)
	var why []string
	for _, sg := range ed.Signals {
		if sg.Code == approval.SignalQuorumRule {
			why = append(why, lit(clip.Runes(sg.Text, 150)))
		}
	}
	if len(why) > 0 {
		s += " (" + strings.Join(why, "; ") + ")"
	}
	return s + "; " + mention(ed.Approver) + "'s edit counts as one."
}

// cardSignals are the signals a card lists: those of the proposed call,
// then those that fired for an approver's edit of it and not for the
// proposal.
func cardSignals(r *approval.Request) []approval.Signal {
	ed := approval.EditOf(r)
	if ed == nil || len(ed.Signals) == 0 {
		return r.Signals
	}
	out := slices.Clone(r.Signals)
	for _, sg := range ed.Signals {
		if !slices.Contains(out, sg) {
			out = append(out, sg)
		}
	}
	return out
}

// deniedBlock is the modal field a deny rule's refusal is shown on: the
// first field the rule reads, else the first field.
func deniedBlock(d *approval.Denial, fields []field, values map[string]map[string]inputValue) string {
	if refs, err := approval.ArgRefs(d.Rule); err == nil {
		for _, f := range fields {
			if _, shown := values[f.blockID]; shown && slices.Contains(refs, f.name) {
				return f.blockID
			}
		}
	}
	return firstBlock(fields, values)
}
