package approval_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/countersign/countersign/approval"
)

// TestAuthorizeRequesters: everyone who asked for a request (Requester and
// Requesters: every author in its task thread since the run began) is
// refused as its approver (four-eyes), unless the policy allows self
// approval; an approver who did not ask may decide.
func TestAuthorizeRequesters(t *testing.T) {
	member := func() (bool, error) { return true, nil }
	tests := []struct {
		name      string
		requester string
		askers    []string
		allowSelf bool
		user      string
		want      error // nil means allowed
	}{
		{"first asker", "U0ALICE", []string{"U0ALICE", "U0BOB"}, false, "U0ALICE", approval.ErrSelfApproval},
		{"follow-up author", "U0ALICE", []string{"U0ALICE", "U0BOB"}, false, "U0BOB", approval.ErrSelfApproval},
		{"follow-up author not named Requester", "U0BOB", []string{"U0ALICE", "U0BOB"}, false, "U0ALICE", approval.ErrSelfApproval},
		{"approver who did not ask", "U0ALICE", []string{"U0ALICE", "U0BOB"}, false, "U0CAROL", nil},
		{"follow-up author with allow_self", "U0ALICE", []string{"U0ALICE", "U0BOB"}, true, "U0BOB", nil},
		{"no set: Requester alone", "U0ALICE", nil, false, "U0ALICE", approval.ErrSelfApproval},
		{"no set: anyone else", "U0ALICE", nil, false, "U0BOB", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &approval.Request{ID: "req_1", Requester: tt.requester, Requesters: tt.askers,
				Approvers: approval.Approvers{ChannelMembers: true, AllowSelf: tt.allowSelf}}
			err := approval.Authorize(r, tt.user, nil, member)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Authorize(requesters %v, %q) = %v, want %v", tt.askers, tt.user, err, tt.want)
			}
		})
	}
}

// TestRequestedAuditsEveryAsker: a request asked for by several people
// says so in its requested entry (who asked is the audit's to keep).
func TestRequestedAuditsEveryAsker(t *testing.T) {
	f := mustLifecycle(t)
	r := f.create(t, func(r *approval.Request) { r.Requester, r.Requesters = "U0BOB", []string{"U0ALICE", "U0BOB"} })
	var got []string
	for _, e := range f.audit.Entries() {
		if e.RequestID != r.ID || e.Event != approval.EventRequested {
			continue
		}
		ev := approval.DecodeEvent(e)
		data, ok := ev.(*approval.RequestedEvent)
		if !ok {
			t.Fatalf("requested entry data = %T, want *approval.RequestedEvent", ev)
		}
		got = data.Requesters
	}
	if want := []string{"U0ALICE", "U0BOB"}; !slices.Equal(got, want) {
		t.Errorf("requested entry's requesters = %v, want %v", got, want)
	}
}
