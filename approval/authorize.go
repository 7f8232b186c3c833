package approval

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// This file: who may decide a request.

// Directory answers, at the moment a person decides, who is in a
// usergroup and who is in the approvals channel (the Slack bot implements
// it over usergroups.users.list and conversations.members). An error
// means the question could not be answered: the decision fails closed
// unless another route admits the person.
type Directory interface {
	// InUsergroup reports whether user is a member of usergroup id.
	InUsergroup(ctx context.Context, id, user string) (bool, error)
	// InApprovalsChannel reports whether user is a member of the
	// approvals channel.
	InApprovalsChannel(ctx context.Context, user string) (bool, error)
}

// MayDecide judges whether user may record verdict v on r now — the one
// judgement of who decides, for every path that decides (a click, a
// modal, a cancel window's buttons, any later surface): Authorize over the
// lifecycle's Directory (approver lists, usergroups, the approvals
// channel, widened by an escalation; four-eyes: nobody who asked for r
// decides it unless its policy allows self-approval), and, with allow
// (Approve + allow), that r offers a pre-authorisation
// (ErrGrantNotOffered) and that user did not ask for r (ErrSelfGrant,
// whatever the policy says of self-approval). Decide asks it itself; a
// surface may ask it earlier (before opening a modal) to refuse what is
// certain to be refused. Errors wrap ErrNotApprover, ErrSelfApproval,
// ErrSelfGrant, ErrGrantNotOffered, or say why membership could not be
// read.
func (l *Lifecycle) MayDecide(ctx context.Context, r *Request, user string, v Verdict, allow bool) error {
	if allow {
		switch {
		case v != VerdictApprove || !OffersGrant(r):
			return fmt.Errorf("decide %s: %w", r.ID, ErrGrantNotOffered)
		case user != "" && r.AskedBy(user):
			return fmt.Errorf("decide %s: %s: %w", r.ID, user, ErrSelfGrant)
		}
	}
	return l.authorize(ctx, r, user)
}

// authorize is Authorize over the lifecycle's Directory.
func (l *Lifecycle) authorize(ctx context.Context, r *Request, user string) error {
	var inGroup func(string) (bool, error)
	var inChannel func() (bool, error)
	if l.dir != nil {
		inGroup = func(id string) (bool, error) { return l.dir.InUsergroup(ctx, id, user) }
		inChannel = func() (bool, error) { return l.dir.InApprovalsChannel(ctx, user) }
	}
	return Authorize(r, user, inGroup, inChannel)
}

// OffersGrant reports whether r's card offers Approve + allow: its policy
// allows a pre-authorisation, it needs one approval, and approving is
// allowed.
func OffersGrant(r *Request) bool {
	return r.Preauthorize > 0 && max(r.Quorum, 1) == 1 && r.Allows(VerdictApprove)
}

// Authorize checks, at click time, whether user may decide r. It is pure:
// group and channel membership come from the callbacks, which are asked
// only when needed.
//
// Nobody who asked for r (r.Askers: the requester and everyone else who
// posted in its task thread since the run began) may decide it unless
// r.Approvers.AllowSelf (ErrSelfApproval). Otherwise user may decide when
// listed in r.Approvers.Users, a member of one of r.Approvers.Usergroups
// (inUsergroups(groupID)), or — when r.Approvers.ChannelMembers is set, or
// no users and no usergroups are listed — a member of the approvals channel
// (inChannel). Anyone else gets ErrNotApprover. A failing callback fails
// closed: its error is returned (wrapped) unless another route admits user.
func Authorize(r *Request, user string, inUsergroups func(id string) (bool, error), inChannel func() (bool, error)) error {
	if user == "" {
		return fmt.Errorf("authorize on %s: empty user: %w", r.ID, ErrNotApprover)
	}
	if r.AskedBy(user) && !r.Approvers.AllowSelf {
		return fmt.Errorf("authorize %s on %s: %w", user, r.ID, ErrSelfApproval)
	}
	ap := r.Approvers
	if slices.Contains(ap.Users, user) {
		return nil
	}
	var failed error
	if inUsergroups != nil {
		for _, g := range ap.Usergroups {
			ok, err := inUsergroups(g)
			if err != nil {
				failed = cmp.Or(failed, fmt.Errorf("authorize %s on %s: usergroup %s: %w", user, r.ID, g, err))
				continue
			}
			if ok {
				return nil
			}
		}
	}
	if (ap.ChannelMembers || (len(ap.Users) == 0 && len(ap.Usergroups) == 0)) && inChannel != nil {
		ok, err := inChannel()
		if err != nil {
			failed = cmp.Or(failed, fmt.Errorf("authorize %s on %s: approvals channel: %w", user, r.ID, err))
		} else if ok {
			return nil
		}
	}
	if failed != nil {
		return failed
	}
	return fmt.Errorf("authorize %s on %s: %w", user, r.ID, ErrNotApprover)
}

// DecisionRefused audits a click or form that changed nothing
// (decision_refused): by whom, the verdict tried, why as a short code
// (not_approver, self_approval, already_decided, foreign_team, …) and,
// for foreign_team, the other workspace. r may stand for a request known
// only by its id (a payload naming one this deployment does not hold).
// Every single-line field is clipped by the audit (an attacker's payload
// cannot grow it).
func (l *Lifecycle) DecisionRefused(ctx context.Context, r *Request, by string, v Verdict, code, team string) {
	l.append(ctx, r, Record{Event: EventDecisionRefuse, RequestID: r.ID, RunID: r.RunID, Actor: by, Tool: r.Tool,
		Data: RefusalEvent{Verdict: v, Reason: code, Team: team}})
}
