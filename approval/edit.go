package approval

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ErrDenied refuses an edit whose arguments one of the tool's deny rules
// refuses: the approver cannot take a call into refused ground. The
// error is a *DenialError, which names the rule.
var ErrDenied = errors.New("approval: refused by a deny rule")

// DenialError is the refusal of an edit by a deny rule: the rule and the
// policy author's reason, so a form can show it on the field the rule
// reads. It wraps ErrDenied.
type DenialError struct {
	Tool   string
	Denial Denial
}

func (e *DenialError) Error() string {
	return fmt.Sprintf("%s: %s refused by deny rule %s: %s", ErrDenied, e.Tool, e.Denial.Rule, e.Denial.Reason)
}

// Unwrap makes errors.Is(err, ErrDenied) hold.
func (e *DenialError) Unwrap() error { return ErrDenied }

// judgeEdit judges an edit of r as a new proposal for the edited
// arguments (Judge: schema, deny rules, review, quorum_when) and records
// the judgement on d: the approvals the edited call needs (Quorum) and the
// signals that fired for it. The store raises r's quorum to d.Quorum,
// never lowers it, and counts the edit as one approval: one approver can
// never edit a call into one that needs more approvers than they are.
//
// Errors: ErrInvalidArgs (the message says what is wrong; the schema's
// *policyfile.ArgsError is reachable with errors.As), *DenialError,
// ErrUnknownTool, all wrapped; anything else means the judgement could not
// be made. Nothing is recorded on any error.
func (l *Lifecycle) judgeEdit(r *Request, d *Decision) error {
	as, err := l.Judge(EditedCall(r, d.Args), r.InputSchema, r.Requester, r.Caller.External())
	if err != nil {
		return fmt.Errorf("edit %s: %w", r.ID, err)
	}
	if as.Denied != nil {
		return fmt.Errorf("edit %s: %w", r.ID, &DenialError{Tool: r.Tool, Denial: *as.Denied})
	}
	d.Quorum, d.Signals = max(as.Policy.Quorum, 1), as.Signals
	return nil
}

// EditedCall is the call an edit of r to args proposes, as Judge takes
// it: r's tool with the edited arguments. The model's confidence in its
// proposal is kept (it is not the edit's to lose: an edit that fired
// low_confidence only because no confidence was given would list a signal
// nobody can act on).
func EditedCall(r *Request, args json.RawMessage) ToolCall {
	return ToolCall{ID: r.CallID, Tool: r.Tool, Args: args, Confidence: r.Confidence}
}

// EditOf returns the edit that set r's arguments, nil when they are the
// proposed ones: the final decision when an edit decided r, else the
// latest edit among the approvals counted (an edit followed by the
// approvals its quorum still needed).
func EditOf(r *Request) *Decision {
	if r.Decision != nil && r.Decision.Verdict == VerdictEdit {
		return r.Decision
	}
	for i := len(r.Approvals) - 1; i >= 0; i-- {
		if r.Approvals[i].Verdict == VerdictEdit {
			return &r.Approvals[i]
		}
	}
	return nil
}
