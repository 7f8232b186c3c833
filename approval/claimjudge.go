package approval

// This file: the judgement every claim makes before it grants anything —
// whoever executes (the agent, /v1, HumanLayer's hand-off, the MCP
// gateway, the Claude Code hook, a cancel window's clock, Run now), against
// the policy this process holds now.

import (
	"errors"
	"fmt"
)

// Scopes says which tools an outside caller may ask for under the policy
// in force (policyfile.File implements it from its API keys). The claim
// asks it again: a key narrowed, or removed, since the request was made
// may no longer have its calls run.
type Scopes interface {
	// MayAsk reports whether c (an API key, by name) may ask for tool now;
	// false for a key the policy no longer has.
	MayAsk(c Caller, tool string) bool
}

// claimJudgement is what the judgement of an approved request at its claim
// found: nothing (it may run), a refusal, or approvals missing.
type claimJudgement struct {
	refused *RefusedError
	more    *MoreApprovalsError
}

// Refusal codes of a RefusedError.
const (
	RefusedArgsChanged    = "args_changed"
	RefusedInvalidArgs    = "invalid_args"
	RefusedDenied         = "denied"
	RefusedToolNotAllowed = "tool_not_allowed"
	RefusedUnknownTool    = "unknown_tool"
	RefusedNotJudged      = "not_judged"
	// RefusedBefore: a claim of a request refused earlier.
	RefusedBefore = "refused"
)

// judgeClaim judges r, approved, at the moment it is claimed, against the
// policy this process holds now. It reads nothing and writes nothing: the
// record is the one the claimant read, the policy is in memory.
//
//   - The stored arguments are the ones approved: the request's digest,
//     the final decision's, and every approval counted toward the quorum
//     (a cancel window's clock saw no card: its decision carries the
//     digest the request held when the window ended).
//   - An outside caller's key may still ask for the tool (Scopes).
//   - The arguments match the tool's schema (the policy's, or the caller's
//     input_schema), and no deny rule refuses them now (Judge).
//   - The approvals counted meet the quorum the policy asks of these
//     arguments now (not for a cancel window: nobody votes there).
func (l *Lifecycle) judgeClaim(r *Request) claimJudgement {
	refuse := func(code, rule, why string) claimJudgement {
		return claimJudgement{refused: &RefusedError{RequestID: r.ID, Code: code, Rule: rule, Reason: why}}
	}
	digest, err := Digest(r.Args)
	bound := err == nil && digest == r.Digest
	if r.Mode != ModeSettled {
		d := r.Decision
		// The clock's decision at the end of a cancel window carries the
		// digest the request held then (sealed by the store); one recorded
		// before it did carries none, bound by the arguments the request
		// was created with (nothing edits a cancel window's call).
		legacy := d != nil && d.Verdict == VerdictWindowElapsed && d.Digest == "" && r.Mode == ModeAfter && len(r.OriginalArgs) == 0
		bound = bound && d != nil && (d.Digest == r.Digest || legacy)
		for _, ap := range r.Approvals {
			bound = bound && ap.Digest == r.Digest
		}
	}
	if !bound {
		return refuse(RefusedArgsChanged, "", "the arguments differ from the ones the approver saw, so the approval does not apply")
	}
	if r.Caller.External() && l.scopes != nil && !l.scopes.MayAsk(r.Caller, r.Tool) {
		return refuse(RefusedToolNotAllowed, "", fmt.Sprintf("the key %q may no longer ask for %s under the policy in force", r.Caller.Name, r.Tool))
	}
	// Whose arguments these are, for the reasons below: an approver's
	// edit, or the proposal's.
	whose := "the arguments"
	if ed := EditOf(r); ed != nil {
		whose = "the arguments " + ed.Approver + " entered"
	}
	as, err := l.Judge(ToolCall{ID: r.CallID, Tool: r.Tool, Args: r.Args, Confidence: r.Confidence}, r.InputSchema, r.Requester, r.Caller.External())
	switch {
	case errors.Is(err, ErrInvalidArgs):
		return refuse(RefusedInvalidArgs, "", fmt.Sprintf("%s are invalid under the policy in force: %v", whose, err))
	case errors.Is(err, ErrUnknownTool):
		return refuse(RefusedUnknownTool, "", fmt.Sprintf("the policy in force no longer has the tool %s", r.Tool))
	case err != nil:
		// Fail closed: what cannot be judged does not run.
		return refuse(RefusedNotJudged, "", fmt.Sprintf("the call could not be judged under the policy in force: %v", err))
	case as.Denied != nil:
		return refuse(RefusedDenied, as.Denied.Rule, fmt.Sprintf("%s are refused by policy: %s", whose, as.Denied.Reason))
	}
	if r.Mode != ModeBefore || r.Kind != KindCall {
		return claimJudgement{}
	}
	if need, have := max(as.Policy.Quorum, 1), len(r.Approvals); have < need {
		return claimJudgement{more: &MoreApprovalsError{RequestID: r.ID, Need: need, Have: have,
			Reason: fmt.Sprintf("the policy in force asks %d approvals for %s and it has %d", need, whose, have)}}
	}
	return claimJudgement{}
}

// unclaimable is the refusal of a claim of r, which is not approved, as
// the store refuses one: ErrAlreadyClaimed (executing or finished),
// ErrAbandoned, a *RefusedError (refused before), ErrNotApproved.
func unclaimable(r *Request) error {
	what := "claim " + r.ID
	switch r.Status {
	case StatusExecuting, StatusExecuted, StatusFailed, StatusUnknown:
		return fmt.Errorf("%s: status %s: %w", what, r.Status, ErrAlreadyClaimed)
	case StatusAbandoned:
		return fmt.Errorf("%s: %w", what, ErrAbandoned)
	case StatusRefused:
		return fmt.Errorf("%s: %w", what, &RefusedError{RequestID: r.ID, Code: RefusedBefore, Reason: r.Result})
	}
	return fmt.Errorf("%s: status %s: %w", what, r.Status, ErrNotApproved)
}
