package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// Defaults for Options.
const (
	DefaultPrefix       = "countersign"
	DefaultWaitConns    = 2
	DefaultBlockTimeout = time.Second
	DefaultRetain       = 30 * 24 * time.Hour
)

const (
	// wakeTTL is how long a wake element waits for a process to pick it up.
	// The record stays the truth after it is gone.
	wakeTTL = 24 * time.Hour
	// recentKeep is how many request ids are kept per requester.
	recentKeep = 200
	// pageSize bounds index reads and pipelines.
	pageSize = 500
)

// ErrClosed is returned by Wait once Close has been called.
var ErrClosed = errors.New("store: closed")

// ErrNotReplicated is wrapped by a wake-up that fewer than
// Options.WaitReplicas replicas acknowledged in time. It is
// approval.ErrNotReplicated, so the lifecycle owner can tell the clicker.
var ErrNotReplicated = approval.ErrNotReplicated

// Options configure a Store. The zero value is usable.
type Options struct {
	// Prefix starts every key, default "countersign". Tests use a unique
	// prefix per test. It should not contain '{'.
	Prefix string
	// WaitConns is the number of Pub/Sub connections the wake hub listens
	// on for hints (per master on a Cluster), default 2. It bounds the
	// hub's goroutines and connections however many requests are waited on.
	WaitConns int
	// BlockTimeout is how long an idle hub connection waits before it
	// PINGs (and a PING's reply may take before the connection is
	// replaced), the cap of the hub's reconnect backoff (at most 2s), and
	// a thirtieth of the interval of its safety-net re-read of every
	// waited record; default 1s.
	BlockTimeout time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// Logger receives operator detail (Redis errors in background loops),
	// default discard.
	Logger *slog.Logger
	// Retain is how long a request record is kept once nothing more can
	// happen to it (rejected, responded, expired, cancelled, executed,
	// failed, unknown), default DefaultRetain (30 days); negative keeps
	// records forever. Pending and approved records never expire. The audit
	// stream is the permanent record.
	Retain time.Duration
	// WaitReplicas, when above 0, makes every wake-up pushed from Go (the
	// one that follows a recorded decision) wait until that many replicas
	// acknowledged it — and so every write before it, the decision included
	// — with Redis WAIT, for at most WaitReplicasTimeout (default 1s).
	// Fewer is an error wrapping ErrNotReplicated: the decision may be lost
	// by a failover, so it must not be acknowledged to the clicker yet.
	// For Sentinel deployments (docs/deploy.md); ignored on a Cluster, where
	// WAIT cannot follow a key to its node.
	WaitReplicas int
	// WaitReplicasTimeout bounds the WAIT of WaitReplicas, default 1s; keep
	// it below the client's ReadTimeout (default 3s).
	WaitReplicasTimeout time.Duration
}

// Store keeps approval requests in Redis. It is safe for concurrent use.
// Close stops its wake hub; the Redis client stays the caller's.
type Store struct {
	rdb    redis.UniversalClient
	k      keys
	now    func() time.Time
	log    *slog.Logger
	hub    *hub
	retain time.Duration
	// replicas and replicaWait: Options.WaitReplicas(Timeout); 0 replicas
	// means no WAIT.
	replicas    int
	replicaWait time.Duration
}

// New returns a Store over rdb (a single node, Sentinel or Cluster client).
//
// Connections: the process holds at most what the go-redis client allows
// (PoolSize, default 10 per GOMAXPROCS, plus the dedicated pipeline pool,
// PipelinePoolSize, default 10); Wait's hub listens on opts.WaitConns
// Pub/Sub connections (per master on a Cluster) besides, independent of the
// number of waiters.
func New(rdb redis.UniversalClient, opts Options) *Store {
	opts.Prefix = cmp.Or(opts.Prefix, DefaultPrefix)
	opts.WaitConns = approval.PositiveOr(opts.WaitConns, DefaultWaitConns)
	opts.BlockTimeout = approval.PositiveOr(opts.BlockTimeout, DefaultBlockTimeout)
	opts.Now = approval.FuncOr(opts.Now, time.Now)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.Retain = cmp.Or(opts.Retain, DefaultRetain) // negative: keep final requests for ever
	s := &Store{
		retain: opts.Retain,
		rdb:    rdb,
		k:      keys{prefix: opts.Prefix, db: database(rdb)},
		now:    opts.Now,
		log:    opts.Logger,
	}
	if _, cluster := rdb.(*redis.ClusterClient); !cluster && opts.WaitReplicas > 0 {
		s.replicas, s.replicaWait = opts.WaitReplicas, approval.PositiveOr(opts.WaitReplicasTimeout, time.Second)
	}
	s.hub = newHub(s, opts.WaitConns, opts.BlockTimeout)
	return s
}

// Close stops the wake hub and waits for its goroutines to exit. Pending
// Wait calls return ErrClosed. Close does not close
// the Redis client. It is safe to call more than once.
func (s *Store) Close() error {
	s.hub.close()
	return nil
}

// CreateRequest saves a new pending request and indexes it. A sampled
// request (approval.ModeSampled: a call that already ran, posted for
// review) is saved final instead, with its Status (executed or failed) and
// Result, and is not indexed as pending; so is a settled one
// (approval.ModeSettled: the gate answered without a human; approved or
// rejected). It fills in r.Status (pending), r.Digest when empty, r.Created when zero and r.Quorum
// when below 1. A digest that does not match r.Args is refused with
// approval.ErrInvalidArgs; an existing id with approval.ErrExists.
func (s *Store) CreateRequest(ctx context.Context, r *approval.Request) error {
	if r.ID == "" {
		return fmt.Errorf("create request: empty id: %w", approval.ErrInvalidArgs)
	}
	digest, err := approval.Digest(r.Args)
	if err != nil {
		return fmt.Errorf("create request %s: %w", r.ID, err)
	}
	if r.Digest == "" {
		r.Digest = digest
	} else if r.Digest != digest {
		return fmt.Errorf("create request %s: digest does not match arguments: %w", r.ID, approval.ErrInvalidArgs)
	}
	// A sampled call (it ran) or a settled one (the gate answered) is
	// final from the start: never pending, never indexed as such.
	final := r.Mode == approval.ModeSampled || r.Mode == approval.ModeSettled
	switch {
	case r.Mode == approval.ModeSampled && r.Status != approval.StatusExecuted && r.Status != approval.StatusFailed:
		return fmt.Errorf("create request %s: sampled with status %q, want executed or failed: %w", r.ID, r.Status, approval.ErrInvalidArgs)
	case r.Mode == approval.ModeSettled && r.Status != approval.StatusApproved && r.Status != approval.StatusRejected:
		return fmt.Errorf("create request %s: settled with status %q, want approved or rejected: %w", r.ID, r.Status, approval.ErrInvalidArgs)
	case !final && r.Status != "" && r.Status != approval.StatusPending:
		return fmt.Errorf("create request %s: status %s, want pending: %w", r.ID, r.Status, approval.ErrInvalidArgs)
	case !final:
		r.Status = approval.StatusPending
	}
	if r.Created.IsZero() {
		r.Created = s.now()
	}
	if r.Quorum < 1 {
		r.Quorum = 1
	}
	args, err := encodeRecord(r)
	if err != nil {
		return fmt.Errorf("create request %s: %w", r.ID, err)
	}
	created, err := createScript.Run(ctx, s.rdb, []string{s.k.request(r.ID)}, append([]any{newOp()}, args...)...).Int()
	if err != nil {
		return fmt.Errorf("create request %s: %w", r.ID, err)
	}
	if created == 0 {
		return fmt.Errorf("create request %s: %w", r.ID, approval.ErrExists)
	}
	// The indexes are separate commands (other hash slots). If they fail the
	// caller gets an error and must not wait on the request.
	ms := float64(r.Created.UnixMilli())
	if final {
		s.retire(ctx, r.ID) // nothing more happens to it but a review, any time before retention ends
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if !r.Deadline.IsZero() && !final {
			p.ZAdd(ctx, s.k.deadlines(), redis.Z{Score: float64(r.Deadline.UnixMilli()), Member: r.ID})
		}
		if !final {
			p.ZAdd(ctx, s.k.pending(), redis.Z{Score: ms, Member: r.ID})
		}
		if r.Mode == approval.ModeSettled {
			return nil // nobody was asked: not among the requester's requests for approval
		}
		p.ZAdd(ctx, s.k.recent(r.Requester), redis.Z{Score: ms, Member: r.ID})
		p.ZRemRangeByRank(ctx, s.k.recent(r.Requester), 0, -recentKeep-1)
		return nil
	})
	if err != nil {
		return fmt.Errorf("create request %s: index: %w", r.ID, err)
	}
	return nil
}

// Request returns the stored request, or approval.ErrNotFound.
func (s *Store) Request(ctx context.Context, id string) (*approval.Request, error) {
	f, err := s.rdb.HGetAll(ctx, s.k.request(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("load request %s: %w", id, err)
	}
	if len(f) == 0 {
		return nil, fmt.Errorf("load request %s: %w", id, approval.ErrNotFound)
	}
	r, err := decodeRecord(f)
	if err != nil {
		return nil, fmt.Errorf("load request %s: %w", id, err)
	}
	return r, nil
}

// RecordDecision records one human decision on d.RequestID atomically;
// d.At is "now" (the store clock when zero). It returns the request as it
// is after the decision: still pending while a quorum is incomplete, final
// otherwise.
//
// Refusals (the request is unchanged unless noted):
//   - approval.ErrNotFound: no such request;
//   - *approval.DecidedError (wrapping approval.ErrAlreadyDecided, or
//     approval.ErrExpired): the request is already final — it says who
//     decided and when, so the loser of a race can be told;
//   - the same with Status expired when d.At is at or past the deadline:
//     the request is expired right there (fail closed; the caller pushes
//     its wake-up);
//   - approval.ErrVerdictNotAllowed: the verdict is not a human one or the
//     request does not allow it;
//   - approval.ErrStaleArgs: d.Digest is not the request's current digest.
//     This holds for every verdict, reject and respond included: a
//     decision applies to the arguments the person saw, and after an edit
//     (quorum > 1) a reject of the old card is not a reject of the new
//     arguments. Nothing runs on a stale click; the card is refreshed and
//     the person decides again;
//   - approval.ErrAlreadyVoted: this approver's approval is already counted;
//   - approval.ErrInvalidArgs: an edit whose d.Args are not JSON.
//
// With a refusal for an existing request the current record is returned too
// (callers refresh the card with it); it is nil for other errors.
//
// A review-after request (approval.ModeAfter) allows only cancel (final:
// rejected, the call never runs) and run_now (final: approved); its
// deadline is the end of its cancel window, and a decision at or after it
// finds the request approved by the clock (VerdictWindowElapsed), returned
// as a *approval.DecidedError with Now set and Status approved.
//
// Approve appends to Approvals and is final once Quorum distinct approvers
// agree. Edit replaces Args (the proposal kept in OriginalArgs) and the
// digest with Digest(d.Args), which the stored edit decision carries too;
// with quorum 1 it is final, otherwise Approvals restart with the editor.
// Reject and respond are final at once.
//
// The decision (or the expiry it found due, reported with DecidedError.Now
// set) is durable when it returns, and nobody is woken yet: the lifecycle
// owner (approval.Lifecycle.Decide) audits it, then pushes the wake-up of
// a final transition with Wake, so the audit stream has the decision
// before anything the woken agent does with it. If the caller stops in
// between, waiters still find the decision at their hub's periodic
// re-read and any later Wait returns it at once.
func (s *Store) RecordDecision(ctx context.Context, d approval.Decision) (*approval.Request, error) {
	id := d.RequestID
	if !d.Verdict.Clickable() {
		return nil, fmt.Errorf("decide %s: verdict %q: %w", id, d.Verdict, approval.ErrVerdictNotAllowed)
	}
	if d.At.IsZero() {
		d.At = s.now()
	}
	d.At = d.At.UTC()
	seen := d.Digest
	var newArgs, newDigest string
	if d.Verdict == approval.VerdictEdit {
		digest, err := approval.Digest(d.Args)
		if err != nil {
			return nil, fmt.Errorf("decide %s: edited arguments: %w", id, err)
		}
		newArgs, newDigest = string(d.Args), digest
		d.Digest = digest
	} else {
		d.Args, d.Quorum, d.Signals = nil, 0, nil
	}
	decision, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	expiry, err := json.Marshal(expiryDecision(id, d.At))
	if err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	elapse, err := json.Marshal(elapseDecision(id, d.At))
	if err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	retain := ""
	if s.retain >= 0 {
		retain = strconv.FormatInt(max(s.retain.Milliseconds(), 1), 10)
	}
	rep, err := run(ctx, s.rdb, decideScript, []string{s.k.request(id), s.k.wake(id)},
		string(d.Verdict), d.Approver, d.At.UnixMilli(), seen, decision, expiry,
		newArgs, newDigest, int64(wakeTTL/time.Second), "1", elapse, newOp(), retain, d.Quorum, s.k.channel(id))
	if err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	var r *approval.Request
	if rep.fields != nil {
		if r, err = decodeRecord(rep.fields); err != nil {
			return nil, fmt.Errorf("decide %s: %w", id, err)
		}
	}
	if rep.code == codeOK || rep.code == codeElapsed {
		s.awaitClaim(ctx, r)
	}
	switch rep.code {
	case codeOK:
		// Retention was set by the script (rejected, responded); the
		// indexes are cleaned up with the wake-up (wake).
		return r, nil
	case codeCounted, codeEdited:
		return r, nil
	case codeExpired, codeElapsed:
		de := approval.NewDecidedError(r)
		de.Now = true
		return r, fmt.Errorf("decide %s: %w", id, de)
	case codeDecided:
		return r, fmt.Errorf("decide %s: %w", id, approval.NewDecidedError(r))
	case codeNotFound:
		return nil, fmt.Errorf("decide %s: %w", id, approval.ErrNotFound)
	}
	// Refusals without a record in the reply: read it for the caller.
	var refusal error
	switch rep.code {
	case codeNotAllowed:
		refusal = approval.ErrVerdictNotAllowed
	case codeStale:
		refusal = approval.ErrStaleArgs
	case codeVoted:
		refusal = approval.ErrAlreadyVoted
	default:
		return nil, fmt.Errorf("decide %s: unexpected script reply %q", id, rep.code)
	}
	r, err = s.Request(ctx, id)
	if err != nil {
		r = nil
	}
	return r, fmt.Errorf("decide %s: %s by %s: %w", id, d.Verdict, d.Approver, refusal)
}

// Claim moves an approved request to executing, at most once across all
// processes, recording owner, time and tokenHash (the hex SHA-256 of the
// claim token, approval.HashClaimToken; "" for an in-process claim
// without one). Every later claim is refused with the record as it now
// is: approval.ErrAlreadyClaimed when the request is executing or
// finished (executed, failed, unknown), approval.ErrAbandoned when its
// claim window ended unclaimed, approval.ErrNotApproved when it is not
// approved (pending, rejected, ...); approval.ErrNotFound when missing.
func (s *Store) Claim(ctx context.Context, id, owner, tokenHash string) (*approval.Request, error) {
	what := "claim " + id
	code, r, err := s.transition(ctx, what, claimScript, []string{s.k.request(id)}, owner, s.now().UnixMilli(), newOp(), tokenHash)
	switch {
	case err != nil:
		return nil, err
	case code == codeOK:
		return r, nil
	case code == codeClaimed:
		return r, fmt.Errorf("%s: status %s: %w", what, r.Status, approval.ErrAlreadyClaimed)
	case code == codeAbandoned:
		return r, fmt.Errorf("%s: %w", what, approval.ErrAbandoned)
	case code == codeNotApproved:
		return r, fmt.Errorf("%s: status %s: %w", what, r.Status, approval.ErrNotApproved)
	}
	return nil, unexpectedReply(what, code)
}

// Claimant returns who claimed execution of request id and when; owner is
// empty when it was never claimed.
func (s *Store) Claimant(ctx context.Context, id string) (owner string, at time.Time, err error) {
	v, err := s.rdb.HMGet(ctx, s.k.request(id), fStatus, fClaimOwner, fClaimAt).Result()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("claimant %s: %w", id, err)
	}
	if v[0] == nil {
		return "", time.Time{}, fmt.Errorf("claimant %s: %w", id, approval.ErrNotFound)
	}
	if v[1] == nil {
		return "", time.Time{}, nil
	}
	owner, _ = v[1].(string)
	ms, _ := v[2].(string)
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("claimant %s: claim time %q: %w", id, ms, err)
	}
	return owner, time.UnixMilli(n).UTC(), nil
}

// Finish records the outcome of an executing request: st is
// approval.StatusExecuted, StatusFailed or StatusUnknown; result is the tool
// output or error text. It refuses with approval.ErrAlreadyClaimed when the
// request is already finished, approval.ErrNotApproved when it was never
// claimed (not executing), approval.ErrNotFound when missing.
func (s *Store) Finish(ctx context.Context, id string, st approval.Status, result string) (*approval.Request, error) {
	switch st {
	case approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
	default:
		return nil, fmt.Errorf("finish %s: status %q is not an outcome", id, st)
	}
	what := "finish " + id
	code, r, err := s.transition(ctx, what, finishScript, []string{s.k.request(id)}, string(st), result, s.now().UnixMilli(), newOp())
	switch {
	case err != nil:
		return nil, err
	case code == codeOK:
		s.retire(ctx, id)
		return r, nil
	case code == codeNotExecuting:
		switch r.Status {
		case approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
			return nil, fmt.Errorf("%s: already %s: %w", what, r.Status, approval.ErrAlreadyClaimed)
		}
		return nil, fmt.Errorf("%s: status %s, not executing: %w", what, r.Status, approval.ErrNotApproved)
	}
	return nil, unexpectedReply(what, code)
}

// RecordCancel ends a pending request without a human decision (the run
// stopped, the card could not be posted): the request becomes cancelled
// with a VerdictCancel decision by "by". A final request gives
// *approval.DecidedError, a missing one approval.ErrNotFound. Nobody is
// woken: the lifecycle owner (approval.Lifecycle.Cancel) audits it, then
// pushes the wake-up with Wake.
func (s *Store) RecordCancel(ctx context.Context, id, by, reason string) (*approval.Request, error) {
	now := s.now().UTC()
	dec, err := json.Marshal(approval.Decision{RequestID: id, Verdict: approval.VerdictCancel, Text: reason, Approver: by, At: now})
	if err != nil {
		return nil, fmt.Errorf("cancel %s: %w", id, err)
	}
	return s.close(ctx, "cancel", id, now, dec)
}

// close runs closeScript (expire or cancel) and maps its reply. A not-due
// expiry returns (nil, nil).
func (s *Store) close(ctx context.Context, mode, id string, now time.Time, decision []byte) (*approval.Request, error) {
	what := mode + " " + id
	code, r, err := s.transition(ctx, what, closeScript, []string{s.k.request(id), s.k.wake(id)},
		mode, now.UnixMilli(), decision, int64(wakeTTL/time.Second), "1", "", newOp(), s.k.channel(id))
	switch {
	case err != nil:
		return nil, err
	case code == codeOK:
		s.retire(ctx, id)
		_ = s.unindex(ctx, id) // logged; the record is final
		return r, nil
	case code == codeNotDue:
		return nil, nil
	case code == codeDecided:
		return r, fmt.Errorf("%s: %w", what, approval.NewDecidedError(r))
	}
	return nil, unexpectedReply(what, code)
}

// BindCard records, once, which message is the request's approval card.
// The card writer calls it right after Slack answered chat.postMessage and
// before anything else, so a click counts only on that message (or a
// click on the card binds it first, when Slack's answer is late). It
// reports whether this call bound it: binding again to the same message
// binds nothing (false); to another one it refuses with
// approval.ErrExists (the first card stays the card). A missing record
// gives approval.ErrNotFound.
func (s *Store) BindCard(ctx context.Context, id string, c approval.CardRef) (bool, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return false, fmt.Errorf("bind card %s: %w", id, err)
	}
	code, err := bindCardScript.Run(ctx, s.rdb, []string{s.k.request(id)}, b, newOp()).Text()
	if err != nil {
		return false, fmt.Errorf("bind card %s: %w", id, err)
	}
	switch code {
	case codeOK:
		return true, nil
	case "same":
		return false, nil
	case codeNotFound:
		return false, fmt.Errorf("bind card %s: %w", id, approval.ErrNotFound)
	case "bound":
		return false, fmt.Errorf("bind card %s: bound to another message: %w", id, approval.ErrExists)
	}
	return false, fmt.Errorf("bind card %s: unexpected script reply %q", id, code)
}

// StartCardPost notes that a card is about to be posted for request id
// and reports whether this is the first attempt. A later attempt (the
// poster stopped between chat.postMessage and BindCard) must look for the
// card already posted before posting another.
func (s *Store) StartCardPost(ctx context.Context, id string) (first bool, err error) {
	n, err := startCardPostScript.Run(ctx, s.rdb, []string{s.k.request(id)}, s.now().UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("start card post %s: %w", id, err)
	}
	switch n {
	case -1:
		return false, fmt.Errorf("start card post %s: %w", id, approval.ErrNotFound)
	case 1:
		return true, nil
	}
	return false, nil
}

// Pending returns every pending request, oldest first. Index entries whose
// record is gone or no longer pending are skipped and removed.
func (s *Store) Pending(ctx context.Context) ([]*approval.Request, error) {
	ids, err := s.rdb.ZRange(ctx, s.k.pending(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("pending: %w", err)
	}
	rs, err := s.load(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("pending: %w", err)
	}
	out := rs[:0]
	var stale []any
	for i, r := range rs {
		if r == nil || r.Status != approval.StatusPending {
			stale = append(stale, ids[i])
			continue
		}
		out = append(out, r)
	}
	if len(stale) > 0 {
		if err := s.rdb.ZRem(ctx, s.k.pending(), stale...).Err(); err != nil {
			s.log.WarnContext(ctx, "store: prune pending index", "err", err)
		}
	}
	return out, nil
}

// RecentByRequester returns up to n of user's most recent requests, newest
// first (at most the last 200 are indexed). Requests whose record is gone
// are skipped.
func (s *Store) RecentByRequester(ctx context.Context, user string, n int) ([]*approval.Request, error) {
	if n <= 0 {
		return nil, nil
	}
	ids, err := s.rdb.ZRevRange(ctx, s.k.recent(user), 0, int64(n-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("recent requests of %s: %w", user, err)
	}
	rs, err := s.load(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("recent requests of %s: %w", user, err)
	}
	out := rs[:0]
	for _, r := range rs {
		if r != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// load reads records in pipelined pages; a missing record gives nil at its
// position.
func (s *Store) load(ctx context.Context, ids []string) ([]*approval.Request, error) {
	out := make([]*approval.Request, len(ids))
	for start := 0; start < len(ids); start += pageSize {
		end := min(start+pageSize, len(ids))
		cmds := make([]*redis.MapStringStringCmd, 0, end-start)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range ids[start:end] {
				cmds = append(cmds, p.HGetAll(ctx, s.k.request(id)))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for i, c := range cmds {
			f := c.Val()
			if len(f) == 0 {
				continue
			}
			r, err := decodeRecord(f)
			if err != nil {
				return nil, fmt.Errorf("request %s: %w", ids[start+i], err)
			}
			out[start+i] = r
		}
	}
	return out, nil
}

// unindex removes a request that is no longer pending from the pending and
// deadline indexes. Callers whose transition already succeeded only log a
// failure: readers of the indexes skip and prune such entries.
func (s *Store) unindex(ctx context.Context, id string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.k.pending(), id)
		p.ZRem(ctx, s.k.deadlines(), id)
		return nil
	})
	if err != nil {
		s.log.WarnContext(ctx, "store: unindex request", "request_id", id, "err", err)
		return fmt.Errorf("unindex %s: %w", id, err)
	}
	return nil
}

// expiryDecision is the decision the clock makes.
func expiryDecision(id string, at time.Time) approval.Decision {
	return approval.Decision{
		RequestID: id,
		Verdict:   approval.VerdictExpire,
		Text:      "no decision before the deadline",
		Approver:  "system",
		At:        at.UTC(),
	}
}

// elapseDecision is the clock's decision at the end of a cancel window
// (approval.ModeAfter): nobody cancelled, so the call runs. It carries no
// digest: the arguments of a review-after request cannot change.
func elapseDecision(id string, at time.Time) approval.Decision {
	return approval.Decision{
		RequestID: id,
		Verdict:   approval.VerdictWindowElapsed,
		Text:      "nobody cancelled within the cancel window",
		Approver:  "system",
		At:        at.UTC(),
	}
}

// transition runs a request's transition script (claim, finish, close,
// feedback) and returns its reply code and the record in the reply, if
// any. A missing request is approval.ErrNotFound; every error starts with
// what ("claim req_…"). The caller maps its script's other codes.
func (s *Store) transition(ctx context.Context, what string, script *redis.Script, keys []string, args ...any) (string, *approval.Request, error) {
	rep, err := run(ctx, s.rdb, script, keys, args...)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", what, err)
	}
	var r *approval.Request
	if rep.fields != nil {
		if r, err = decodeRecord(rep.fields); err != nil {
			return "", nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	if rep.code == codeNotFound {
		return rep.code, nil, fmt.Errorf("%s: %w", what, approval.ErrNotFound)
	}
	return rep.code, r, nil
}

// unexpectedReply is the error for a script reply code the caller does not
// know (a script newer than this process).
func unexpectedReply(what, code string) error {
	return fmt.Errorf("%s: unexpected script reply %q", what, code)
}

// encodeRecord turns a new request into HSET field/value arguments.
func encodeRecord(r *approval.Request) ([]any, error) {
	base := *r
	base.Status, base.Args, base.Digest = "", nil, ""
	base.Approvals, base.Decision, base.OriginalArgs = nil, nil, nil
	base.Card, base.Result, base.Grant = approval.CardRef{}, "", nil
	b, err := json.Marshal(base)
	if err != nil {
		return nil, err
	}
	card, err := json.Marshal(r.Card)
	if err != nil {
		return nil, err
	}
	allow := ","
	for _, v := range []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject, approval.VerdictRespond,
		approval.VerdictCancel, approval.VerdictRunNow} {
		if r.Allows(v) {
			allow += string(v) + ","
		}
	}
	status := approval.StatusPending
	final := r.Mode == approval.ModeSampled || r.Mode == approval.ModeSettled
	if final {
		status = r.Status // ran, or settled by the gate: final from the start (CreateRequest)
	}
	args := []any{
		fBase, b,
		fStatus, string(status),
		fArgs, string(r.Args),
		fDigest, r.Digest,
		fQuorum, r.Quorum,
		fAllow, allow,
		fCard, card,
	}
	if !r.Deadline.IsZero() {
		args = append(args, fDeadline, r.Deadline.UnixMilli())
	}
	if r.Mode != approval.ModeBefore {
		args = append(args, fMode, string(r.Mode))
	}
	if final {
		args = append(args, fResult, r.Result)
	}
	return args, nil
}

// decodeRecord rebuilds a Request from its hash fields.
func decodeRecord(f map[string]string) (*approval.Request, error) {
	var r approval.Request
	if err := json.Unmarshal([]byte(f[fBase]), &r); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	r.Status = approval.Status(f[fStatus])
	r.Args = json.RawMessage(f[fArgs])
	r.Digest = f[fDigest]
	if q, err := strconv.Atoi(f[fQuorum]); err == nil && q > r.Quorum {
		r.Quorum = q // raised by an edit (decideScript)
	}
	if v, ok := f[fOriginalArgs]; ok {
		r.OriginalArgs = json.RawMessage(v)
	}
	if v := f[fApprovals]; v != "" {
		if err := json.Unmarshal([]byte(v), &r.Approvals); err != nil {
			return nil, fmt.Errorf("decode record approvals: %w", err)
		}
	}
	if v := f[fDecision]; v != "" {
		r.Decision = new(approval.Decision)
		if err := json.Unmarshal([]byte(v), r.Decision); err != nil {
			return nil, fmt.Errorf("decode record decision: %w", err)
		}
	}
	if v := f[fCard]; v != "" {
		if err := json.Unmarshal([]byte(v), &r.Card); err != nil {
			return nil, fmt.Errorf("decode record card: %w", err)
		}
	}
	if v := f[fFeedback]; v != "" {
		r.Feedback = new(approval.Feedback)
		if err := json.Unmarshal([]byte(v), r.Feedback); err != nil {
			return nil, fmt.Errorf("decode record feedback: %w", err)
		}
	}
	if v := f[fGrant]; v != "" {
		r.Grant = new(approval.Grant)
		if err := json.Unmarshal([]byte(v), r.Grant); err != nil {
			return nil, fmt.Errorf("decode record grant: %w", err)
		}
	}
	r.Result = f[fResult]
	r.ClaimHash = f[fClaimToken]
	return &r, nil
}

// Wake pushes the wake-up of request id, which became final (status st),
// for whoever waits on it. The lifecycle owner calls it after recording and
// auditing the transition. A lost wake-up loses no decision: waiters re-read
// the record.
func (s *Store) Wake(ctx context.Context, id string, st approval.Status) error {
	return s.wake(ctx, id, st)
}

// wake pushes the wake-up for a final transition recorded without one
// (RecordDecision and friends), with the same TTL the scripts give it, and
// publishes the hint the wake hub listens for (wakeScript, wait.go).
//
// With Options.WaitReplicas it then waits (WAIT, on the same connection)
// until that many replicas have everything written so far, the decision
// included, and returns an error wrapping ErrNotReplicated when fewer did
// or when the primary it reaches does not hold the transition at all (a
// failover since it was recorded: the script checks the record first).
//
// The request is final, so the same pipeline drops it from the pending and
// deadline indexes (global keys: another slot, another node on a Cluster,
// where go-redis sends the pipeline to each node at once): the wake-up
// costs no extra round trip for it. A failed clean-up is logged, not
// returned (readers skip index entries whose record is final). A wake-up
// that never comes (the caller stopped) leaves the entries to those
// readers.
func (s *Store) wake(ctx context.Context, id string, st approval.Status) error {
	check := "0"
	if s.replicas > 0 {
		check = "1"
	}
	keys, args := []string{s.k.wake(id), s.k.request(id)}, []any{string(st), int64(wakeTTL / time.Second), check, s.k.channel(id)}
	var woke, acked *redis.Cmd
	var unindexed [2]*redis.IntCmd
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if s.replicas > 0 {
			woke = wakeScript.Eval(ctx, p, keys, args...)
			acked = p.Do(ctx, "wait", s.replicas, s.replicaWait.Milliseconds()) // same connection: WAIT covers it
		} else {
			woke = wakeScript.EvalSha(ctx, p, keys, args...) // NOSCRIPT is retried below
		}
		unindexed[0] = p.ZRem(ctx, s.k.pending(), id)
		unindexed[1] = p.ZRem(ctx, s.k.deadlines(), id)
		return nil
	})
	for _, c := range unindexed {
		if err := c.Err(); err != nil {
			s.log.WarnContext(ctx, "store: unindex request", "request_id", id, "err", err)
			break
		}
	}
	err := woke.Err()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = wakeScript.Run(ctx, s.rdb, keys, args...).Err() // loads it
	}
	if err != nil {
		return fmt.Errorf("wake %s: %w", id, err)
	}
	if acked == nil {
		return nil
	}
	if pushed, _ := woke.Int64(); pushed == 0 {
		// Recorded on a primary this connection no longer reaches (a
		// failover since): a WAIT here would vouch for a decision that is
		// not here. The caller records it again.
		return fmt.Errorf("wake %s: the record is not %s on the primary reached now (a failover since it was recorded): %w", id, st, ErrNotReplicated)
	}
	n, err := acked.Int64()
	if err != nil {
		return fmt.Errorf("wake %s: WAIT: %w", id, err)
	}
	if n < int64(s.replicas) {
		return fmt.Errorf("wake %s: %d of %d replicas within %v: %w", id, n, s.replicas, s.replicaWait, ErrNotReplicated)
	}
	return nil
}

// retire sets the retention TTL on a record nothing more can happen to.
// It is housekeeping after the transition: a failure is logged and the
// record simply stays.
func (s *Store) retire(ctx context.Context, id string) {
	if s.retain < 0 {
		return
	}
	if err := s.rdb.Expire(ctx, s.k.request(id), s.retain).Err(); err != nil {
		s.log.WarnContext(ctx, "store: set record retention", "request_id", id, "err", err)
	}
}
