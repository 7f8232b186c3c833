// Package approvaltest holds in-memory doubles of the ports the approval
// domain declares — the request records (approval.Records), the audit
// stream (approval.Auditor) and the card writer (approval.Cards) — for domain tests where Redis is not the
// point, in the spirit of benbjohnson/wtf's mock package. They keep the
// store's refusal semantics (first decision wins, quorum, one vote per
// approver, digest binding, a claim once, a grant's limits), so a test of
// the lifecycle against them means what it would against Redis; the
// store's own tests keep the scripts honest. Standard library only.
package approvaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
)

// Records is an in-memory approval.Records with the store's semantics
// (store.Store). It is safe for concurrent use; every method works on a
// copy, as the store's records are read from Redis.
type Records struct {
	now func() time.Time

	mu     sync.Mutex                   // guards the maps below
	reqs   map[string]*approval.Request // by request id
	votes  map[string]map[string]bool   // approvers counted, by request id
	claims map[string]string            // who claimed execution, by request id
	grants map[string]*approval.Grant   // in force, by scope (grantScope)
	woken  map[string][]approval.Status // wake-ups pushed, by request id
	posts  map[string]bool              // card posts attempted, by request id
	nudged map[string]int               // the latest reminder claimed, by request id
}

// NewRecords returns empty records on the clock now (time.Now when nil):
// the clock stamps what the store stamps (Created, a cancel, a decision
// without a time, a grant's expiry).
func NewRecords(now func() time.Time) *Records {
	if now == nil {
		now = time.Now
	}
	return &Records{now: now, reqs: map[string]*approval.Request{}, votes: map[string]map[string]bool{},
		claims: map[string]string{}, grants: map[string]*approval.Grant{}, woken: map[string][]approval.Status{},
		posts: map[string]bool{}, nudged: map[string]int{}}
}

// clone is a deep copy of r, through JSON like the store's record.
func clone[T any](v *T) *T {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("approvaltest: encode %T: %v", v, err))
	}
	var out T
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("approvaltest: decode %T: %v", v, err))
	}
	return &out
}

// CreateRequest saves a new pending request, filling r.Status, r.Digest,
// r.Created and r.Quorum as the store does. A sampled request
// (approval.ModeSampled, executed or failed) or a settled one
// (approval.ModeSettled, approved or rejected) is saved final.
// Refusals: approval.ErrInvalidArgs (no id, a digest that does not match
// the arguments, a status the mode does not allow), approval.ErrExists.
func (s *Records) CreateRequest(_ context.Context, r *approval.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := approval.PrepareNew(r, s.now()); err != nil {
		return err
	}
	if _, ok := s.reqs[r.ID]; ok {
		return fmt.Errorf("create request %s: %w", r.ID, approval.ErrExists)
	}
	saved := clone(r)
	// What a decision sets is never taken from the caller's copy.
	saved.Approvals, saved.Decision, saved.OriginalArgs = nil, nil, nil
	s.reqs[r.ID] = saved
	return nil
}

// Request returns a copy of the stored request, or approval.ErrNotFound.
func (s *Records) Request(_ context.Context, id string) (*approval.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	if !ok {
		return nil, fmt.Errorf("load request %s: %w", id, approval.ErrNotFound)
	}
	return clone(r), nil
}

// Forget drops request id and everything kept about it, as Redis losing
// its data (a restart without persistence) does: from then on it is
// approval.ErrNotFound to every method.
func (s *Records) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.reqs, id)
	delete(s.votes, id)
	delete(s.claims, id)
	delete(s.woken, id)
	delete(s.posts, id)
	delete(s.nudged, id)
}

// BindCard records, once, which message is request id's card (as
// store.Store.BindCard) and reports whether this call bound it: binding
// again to the same message binds nothing, to another one is
// approval.ErrExists; approval.ErrNotFound when missing.
func (s *Records) BindCard(_ context.Context, id string, c approval.CardRef) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return false, fmt.Errorf("bind card %s: %w", id, approval.ErrNotFound)
	case r.Card == c:
		return false, nil
	case r.Card.Bound():
		return false, fmt.Errorf("bind card %s: %w", id, approval.ErrExists)
	}
	r.Card = c
	return true, nil
}

// StartCardPost notes an attempt to post request id's card and reports
// whether it is the first (as store.Store.StartCardPost).
func (s *Records) StartCardPost(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.reqs[id]; !ok {
		return false, fmt.Errorf("start card post %s: %w", id, approval.ErrNotFound)
	}
	if s.posts[id] {
		return false, nil
	}
	s.posts[id] = true
	return true, nil
}

// RecordDecision records one human decision, with the refusals of
// store.Store.RecordDecision: approval.ErrVerdictNotAllowed (not a human
// verdict, or one the request does not allow), approval.ErrNotFound,
// *approval.DecidedError for a final request (with Now set when d.At is at
// or past the deadline: the request is expired right there, or approved
// when a bound card's cancel window ended), approval.ErrStaleArgs (d.Digest
// is not the current digest), approval.ErrAlreadyVoted. An edit replaces
// the arguments and restarts the approvals with the editor's. With a
// refusal for an existing request its current copy is returned too.
func (s *Records) RecordDecision(_ context.Context, d approval.Decision) (*approval.Request, error) {
	id := d.RequestID
	if !d.Verdict.Clickable() {
		return nil, fmt.Errorf("decide %s: verdict %q: %w", id, d.Verdict, approval.ErrVerdictNotAllowed)
	}
	if d.At.IsZero() {
		d.At = s.now()
	}
	d.At = d.At.UTC()
	seen := d.Digest
	if d.Verdict == approval.VerdictEdit {
		digest, err := approval.Digest(d.Args)
		if err != nil {
			return nil, fmt.Errorf("decide %s: edited arguments: %w", id, err)
		}
		d.Digest = digest
	} else {
		d.Args = nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("decide %s: %w", id, approval.ErrNotFound)
	case r.Status != approval.StatusPending:
		return clone(r), fmt.Errorf("decide %s: %w", id, approval.NewDecidedError(r))
	case !r.Deadline.IsZero() && !d.At.Before(r.Deadline):
		s.close(r, d.At)
		de := approval.NewDecidedError(r)
		de.Now = true
		return clone(r), fmt.Errorf("decide %s: %w", id, de)
	case !r.Allows(d.Verdict):
		return clone(r), fmt.Errorf("decide %s: %s by %s: %w", id, d.Verdict, d.Approver, approval.ErrVerdictNotAllowed)
	case r.Digest != seen:
		return clone(r), fmt.Errorf("decide %s: %s by %s: %w", id, d.Verdict, d.Approver, approval.ErrStaleArgs)
	}
	votes := s.votes[id]
	switch d.Verdict {
	case approval.VerdictApprove:
		if votes[d.Approver] {
			return clone(r), fmt.Errorf("decide %s: %s by %s: %w", id, d.Verdict, d.Approver, approval.ErrAlreadyVoted)
		}
		if votes == nil {
			votes = map[string]bool{}
			s.votes[id] = votes
		}
		votes[d.Approver] = true
		r.Approvals = append(r.Approvals, d)
		if len(r.Approvals) < r.Quorum {
			return clone(r), nil
		}
		r.Status = approval.StatusApproved
	case approval.VerdictEdit:
		if len(r.OriginalArgs) == 0 {
			r.OriginalArgs = r.Args
		}
		// Approvals counted so far were for the old arguments.
		s.votes[id] = map[string]bool{d.Approver: true}
		r.Args, r.Digest, r.Approvals = d.Args, d.Digest, []approval.Decision{d}
		// The edited call's judgement may need more approvals: the quorum
		// is raised to it, never lowered (store decideScript, ARGV[14]).
		r.Quorum = max(r.Quorum, d.Quorum)
		if r.Quorum > 1 {
			return clone(r), nil
		}
		r.Status = approval.StatusApproved
	case approval.VerdictReject, approval.VerdictCancel:
		r.Status = approval.StatusRejected
	case approval.VerdictRespond:
		r.Status = approval.StatusResponded
	case approval.VerdictRunNow:
		r.Status = approval.StatusApproved
	default:
		return clone(r), fmt.Errorf("decide %s: %s: %w", id, d.Verdict, approval.ErrVerdictNotAllowed)
	}
	r.Decision = &d
	return clone(r), nil
}

// close ends pending request r at its deadline, at: approved by the clock
// when its cancel window ended on a bound card (approval.ModeAfter), else
// expired (fail closed). s.mu is held.
func (s *Records) close(r *approval.Request, at time.Time) {
	if r.Mode == approval.ModeAfter && r.Card.Bound() {
		r.Status = approval.StatusApproved
		r.Decision = &approval.Decision{RequestID: r.ID, Verdict: approval.VerdictWindowElapsed,
			Text: "nobody cancelled within the cancel window", Approver: "system", At: at.UTC()}
		return
	}
	r.Status = approval.StatusExpired
	r.Decision = &approval.Decision{RequestID: r.ID, Verdict: approval.VerdictExpire,
		Text: "no decision before the deadline", Approver: "system", At: at.UTC()}
}

// RecordExpiries ends every pending request whose deadline is at or
// before now and abandons every approved one whose claim window ended
// unclaimed (store.Store.RecordExpiries); it returns copies of those it
// changed, expiries first (soonest deadline first); each is returned by
// exactly one call.
func (s *Records) RecordExpiries(_ context.Context, now time.Time) ([]*approval.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var due []*approval.Request
	for _, r := range s.reqs {
		if r.Status == approval.StatusPending && !r.Deadline.IsZero() && !now.Before(r.Deadline) {
			due = append(due, r)
		}
	}
	sort.Slice(due, func(i, j int) bool { return due[i].Deadline.Before(due[j].Deadline) })
	out := make([]*approval.Request, 0, len(due))
	for _, r := range due {
		s.close(r, now)
		out = append(out, clone(r))
	}
	// Then the approved requests of outside callers whose claim window
	// (from their approval) ended unclaimed: abandoned, nothing ran.
	var gone []*approval.Request
	for _, r := range s.reqs {
		if r.Status == approval.StatusApproved && r.ClaimWindow > 0 && r.Decision != nil &&
			!now.Before(r.Decision.At.Add(r.ClaimWindow)) {
			gone = append(gone, r)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].Decision.At.Before(gone[j].Decision.At) })
	for _, r := range gone {
		r.Status = approval.StatusAbandoned
		out = append(out, clone(r))
	}
	return out, nil
}

// RecordCancel ends a pending request without a human decision: cancelled,
// with a VerdictCancel decision by "by" at the clock's now.
// *approval.DecidedError when it is final, approval.ErrNotFound when
// missing.
func (s *Records) RecordCancel(_ context.Context, id, by, reason string) (*approval.Request, error) {
	now := s.now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("cancel %s: %w", id, approval.ErrNotFound)
	case r.Status != approval.StatusPending:
		return clone(r), fmt.Errorf("cancel %s: %w", id, approval.NewDecidedError(r))
	}
	r.Status = approval.StatusCancelled
	r.Decision = &approval.Decision{RequestID: id, Verdict: approval.VerdictCancel, Text: reason, Approver: by, At: now}
	return clone(r), nil
}

// finished reports whether st is an execution's outcome.
func finished(st approval.Status) bool {
	return st == approval.StatusExecuted || st == approval.StatusFailed || st == approval.StatusUnknown
}

// Claim moves an approved request to executing, once, keeping tokenHash
// (the claim token's hash, "" for an in-process claim) as
// store.Store.Claim does. Every later claim is refused with the record as
// it now is: approval.ErrAlreadyClaimed when it is executing or finished,
// approval.ErrAbandoned when its claim window ended unclaimed,
// approval.ErrNotApproved otherwise; approval.ErrNotFound when missing.
//
// With digest set, a request whose digest is not digest is refused with
// approval.ErrStaleArgs.
func (s *Records) Claim(_ context.Context, id, owner, tokenHash, digest string) (*approval.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.approved("claim", id, digest)
	if err != nil {
		return r, err
	}
	r.Status, r.ClaimHash = approval.StatusExecuting, tokenHash
	s.claims[id] = owner
	return clone(r), nil
}

// approved returns request id, approved with digest digest (any when ""),
// or Claim's refusals. The caller holds s.mu.
func (s *Records) approved(what, id, digest string) (*approval.Request, error) {
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("%s %s: %w", what, id, approval.ErrNotFound)
	case r.Status == approval.StatusExecuting || finished(r.Status):
		return clone(r), fmt.Errorf("%s %s: status %s: %w", what, id, r.Status, approval.ErrAlreadyClaimed)
	case r.Status == approval.StatusAbandoned:
		return clone(r), fmt.Errorf("%s %s: %w", what, id, approval.ErrAbandoned)
	case r.Status != approval.StatusApproved:
		return clone(r), fmt.Errorf("%s %s: status %s: %w", what, id, r.Status, approval.ErrNotApproved)
	case digest != "" && r.Digest != digest:
		return clone(r), fmt.Errorf("%s %s: %w", what, id, approval.ErrStaleArgs)
	}
	return r, nil
}

// Refuse ends an approved request whose digest is digest as refused, why
// its result, as store.Store.Refuse does; refusals as Claim's.
func (s *Records) Refuse(_ context.Context, id, digest, why string) (*approval.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.approved("refuse", id, digest)
	if err != nil {
		return r, err
	}
	r.Status, r.Result = approval.StatusRefused, why
	return clone(r), nil
}

// Reopen takes an approved request whose digest is digest back to
// pending, as store.Store.Reopen does: quorum raised to ro.Need, the
// approvals (and the votes) kept, deadline ro.Deadline, ro recorded.
func (s *Records) Reopen(_ context.Context, id, digest string, ro approval.Reopening) (*approval.Request, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.approved("reopen", id, digest)
	if err != nil {
		return r, err
	}
	r.Status, r.Decision, r.Quorum = approval.StatusPending, nil, max(r.Quorum, ro.Need)
	r.Deadline, r.Reopened = ro.Deadline, clone(&ro)
	return clone(r), nil
}

// Claimant returns who claimed request id's execution ("" when nobody).
func (s *Records) Claimant(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims[id]
}

// Finish records the outcome (executed, failed or unknown) of an executing
// request: approval.ErrAlreadyClaimed when it is already finished,
// approval.ErrNotApproved when it was never claimed, approval.ErrNotFound.
func (s *Records) Finish(_ context.Context, id string, st approval.Status, result string) (*approval.Request, error) {
	if !finished(st) {
		return nil, fmt.Errorf("finish %s: status %q is not an outcome", id, st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("finish %s: %w", id, approval.ErrNotFound)
	case finished(r.Status):
		return nil, fmt.Errorf("finish %s: already %s: %w", id, r.Status, approval.ErrAlreadyClaimed)
	case r.Status != approval.StatusExecuting:
		return nil, fmt.Errorf("finish %s: status %s, not executing: %w", id, r.Status, approval.ErrNotApproved)
	}
	r.Status, r.Result = st, result
	return clone(r), nil
}

// grantScope is the key a grant lets calls through under: tool, requester
// and task thread.
func grantScope(tool, requester string, o approval.Origin) string {
	return o.Channel + "\x00" + o.ThreadTS + "\x00" + requester + "\x00" + tool
}

// errGrantExpired refuses a grant already over.
var errGrantExpired = errors.New("approvaltest: grant already expired")

// PutGrant saves g for its scope until g.Expires, replacing an earlier
// grant of the scope, and records it on its request (approval.ErrNotFound
// when that is gone; the grant is then withdrawn).
func (s *Records) PutGrant(_ context.Context, g *approval.Grant) error {
	if !s.now().Before(g.Expires) {
		return fmt.Errorf("put grant %s: %w", g.ID, errGrantExpired)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[g.RequestID]
	if !ok {
		return fmt.Errorf("put grant %s on request %s: %w", g.ID, g.RequestID, approval.ErrNotFound)
	}
	s.grants[grantScope(g.Tool, g.Requester, g.Origin)] = clone(g)
	r.Grant = clone(g)
	return nil
}

// ActiveGrant returns the grant of the scope when one is in force at the
// clock's now, nil otherwise.
func (s *Records) ActiveGrant(_ context.Context, tool, requester string, origin approval.Origin) (*approval.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.grants[grantScope(tool, requester, origin)]
	if !g.Active(s.now()) {
		return nil, nil
	}
	return clone(g), nil
}

// UseGrant counts one use of grant g by request requestID, adding amount,
// as store.Store.UseGrant: false, nothing counted, when the scope no
// longer holds g (expired, revoked, replaced) or a limit would be passed;
// a request already counted is answered as counted again.
func (s *Records) UseGrant(_ context.Context, g *approval.Grant, requestID string, amount float64) (*approval.Grant, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	scope := grantScope(g.Tool, g.Requester, g.Origin)
	cur := s.grants[scope]
	switch {
	case cur == nil || !s.now().Before(cur.Expires) || cur.ID != g.ID || cur.RevokedBy != "":
		return nil, false, nil
	case slices.Contains(cur.Uses, requestID):
		return clone(cur), true, nil
	case cur.Limits.MaxUses > 0 && len(cur.Uses)+1 > cur.Limits.MaxUses:
		return nil, false, nil
	case cur.Limits.MaxTotal > 0 && cur.Spent+amount > cur.Limits.MaxTotal+1e-9:
		return nil, false, nil
	}
	cur.Uses = append(cur.Uses, requestID)
	cur.Spent += amount
	if r, ok := s.reqs[cur.RequestID]; ok {
		r.Grant = clone(cur)
	}
	return clone(cur), true, nil
}

// Wake records the wake-up of request id, which became final with status
// st (Woken lists them). It never fails.
func (s *Records) Wake(_ context.Context, id string, st approval.Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.woken[id] = append(s.woken[id], st)
	return nil
}

// Woken returns the wake-ups pushed for request id, oldest first.
func (s *Records) Woken(id string) []approval.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.woken[id])
}

// RecordFeedback records f on a settled request (approval.Request.Markable
// before any mark): approval.ErrNotFinal when it is not settled by a
// decision (or a sample), approval.ErrAlreadyMarked when it is marked wrong
// already, or, for a "looks right", judged already; approval.ErrNotFound.
func (s *Records) RecordFeedback(_ context.Context, id string, f approval.Feedback) (*approval.Request, error) {
	if f.At.IsZero() {
		f.At = s.now()
	}
	f.At = f.At.UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	if !ok {
		return nil, fmt.Errorf("feedback on %s: %w", id, approval.ErrNotFound)
	}
	settled := finished(r.Status) || r.Status == approval.StatusRejected || r.Status == approval.StatusResponded
	decided := r.Decision != nil || r.Mode == approval.ModeSampled
	switch {
	case !settled || !decided:
		return clone(r), fmt.Errorf("feedback on %s: status %s: %w", id, r.Status, approval.ErrNotFinal)
	case r.Feedback != nil && r.Feedback.Wrong, !f.Wrong && r.Feedback != nil:
		return clone(r), fmt.Errorf("feedback on %s: %w", id, approval.ErrAlreadyMarked)
	}
	r.Feedback = &f
	return clone(r), nil
}

// ClaimReminder claims reminder n of request id, as
// store.Store.ClaimReminder: true once per n for a pending request before
// its deadline, when no reminder numbered n or higher was claimed.
func (s *Records) ClaimReminder(_ context.Context, id string, n int, now time.Time) (bool, error) {
	if n < 1 {
		return false, fmt.Errorf("claim reminder %d of %s: %w", n, id, approval.ErrInvalidArgs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return false, fmt.Errorf("claim reminder %d of %s: %w", n, id, approval.ErrNotFound)
	case r.Status != approval.StatusPending, !r.Deadline.IsZero() && !now.Before(r.Deadline), s.nudged[id] >= n:
		return false, nil
	}
	s.nudged[id] = n
	return true, nil
}

// Escalate marks pending request id escalated to "to" at now, once, and
// with widen adds to's users and usergroups to its approvers (as
// store.Store.Escalate). It returns the request as stored and whether
// this call escalated it.
func (s *Records) Escalate(_ context.Context, id string, to approval.Approvers, widen bool, now time.Time) (*approval.Request, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, false, fmt.Errorf("escalate %s: %w", id, approval.ErrNotFound)
	case r.Status != approval.StatusPending || r.Escalated != nil || (!r.Deadline.IsZero() && !now.Before(r.Deadline)):
		return clone(r), false, nil
	}
	r.Escalated = &approval.Escalation{At: now.UTC(), To: *clone(&to), Widened: widen}
	if widen {
		if len(r.Approvers.Users) == 0 && len(r.Approvers.Usergroups) == 0 {
			r.Approvers.ChannelMembers = true
		}
		for _, u := range to.Users {
			if !slices.Contains(r.Approvers.Users, u) {
				r.Approvers.Users = append(r.Approvers.Users, u)
			}
		}
		for _, g := range to.Usergroups {
			if !slices.Contains(r.Approvers.Usergroups, g) {
				r.Approvers.Usergroups = append(r.Approvers.Usergroups, g)
			}
		}
		r.Approvers.ChannelMembers = r.Approvers.ChannelMembers || to.ChannelMembers
	}
	return clone(r), true, nil
}

// RevokeGrant ends grant grantID of request requestID (as
// store.Store.RevokeGrant): its scope lets nothing through any more, and
// the request's copy says who revoked it and when. approval.ErrNotFound
// when the request has no such grant.
func (s *Records) RevokeGrant(_ context.Context, requestID, grantID, by string) (*approval.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[requestID]
	if !ok || r.Grant == nil || r.Grant.ID != grantID {
		return nil, fmt.Errorf("revoke grant %s of request %s: %w", grantID, requestID, approval.ErrNotFound)
	}
	scope := grantScope(r.Grant.Tool, r.Grant.Requester, r.Grant.Origin)
	if cur := s.grants[scope]; cur != nil && cur.ID == grantID {
		delete(s.grants, scope)
	}
	if r.Grant.RevokedBy == "" {
		r.Grant.RevokedBy, r.Grant.RevokedAt = by, s.now()
	}
	return clone(r.Grant), nil
}
