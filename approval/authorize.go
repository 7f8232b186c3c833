package approval

import (
	"cmp"
	"fmt"
	"slices"
)

// This file: who may decide a request.

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
