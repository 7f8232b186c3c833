package approvaltest

import (
	"context"
	"slices"

	"github.com/countersign/countersign/approval"
)

// Directory is an approval.Directory over fixed lists, for tests where
// Slack is not the point: Groups maps a usergroup id to its members,
// Channel lists the approvals channel's members, and Everyone admits
// every user to every usergroup and the channel. Err, when set, is every
// answer's error (Slack failing).
type Directory struct {
	Everyone bool
	Groups   map[string][]string
	Channel  []string
	Err      error
}

var _ approval.Directory = Directory{}

// InUsergroup reports whether user is in usergroup id.
func (d Directory) InUsergroup(_ context.Context, id, user string) (bool, error) {
	if d.Err != nil {
		return false, d.Err
	}
	return d.Everyone || slices.Contains(d.Groups[id], user), nil
}

// InApprovalsChannel reports whether user is in the approvals channel.
func (d Directory) InApprovalsChannel(_ context.Context, user string) (bool, error) {
	if d.Err != nil {
		return false, d.Err
	}
	return d.Everyone || slices.Contains(d.Channel, user), nil
}
