package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
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
	// Every claim (Claim, and Audit.ClaimAppend) waits the same way, and
	// one that fewer replicas confirm is withdrawn and refused with
	// approval.ErrClaimNotConfirmed: a claim lost by a failover would let
	// another process claim and run the request again.
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
	// page bounds index reads and pipelines: pageSize (tests set it lower,
	// SetPageSize, to walk several pages over fewer records).
	page int
	// limiter is the process's view of the keys' budgets (Limiter).
	limiterOnce sync.Once
	limiter     *Limiter
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
	opts.WaitConns = option.PositiveOr(opts.WaitConns, DefaultWaitConns)
	opts.BlockTimeout = option.PositiveOr(opts.BlockTimeout, DefaultBlockTimeout)
	opts.Now = option.FuncOr(opts.Now, time.Now)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.Retain = cmp.Or(opts.Retain, DefaultRetain) // negative: keep final requests for ever
	s := &Store{
		retain: opts.Retain,
		rdb:    rdb,
		k:      keys{prefix: opts.Prefix, db: database(rdb)},
		now:    opts.Now,
		log:    opts.Logger,
		page:   pageSize,
	}
	if _, cluster := rdb.(*redis.ClusterClient); !cluster && opts.WaitReplicas > 0 {
		s.replicas, s.replicaWait = opts.WaitReplicas, option.PositiveOr(opts.WaitReplicasTimeout, time.Second)
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

// createScript writes a new record unless one exists.
//
//	KEYS[1]   record
//	ARGV[1]   the op id (luaOp)
//	ARGV[2..] field, value, ... (HSET)
//
// Reply: 1 created, 0 exists. A record this very call wrote (go-redis ran
// the script again after a read timeout) counts as created.
var createScript = redis.NewScript(luaOp + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  if replayed(KEYS[1], ARGV[1]) then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('HSET', KEYS[1], 'rev', 1)
done(KEYS[1], ARGV[1], 'ok')
return 1
`)

// CreateRequest saves a new pending request and indexes it. A sampled
// request (approval.ModeSampled: a call that already ran, posted for
// review) is saved final instead, with its Status (executed or failed) and
// Result, and is not indexed as pending; so is a settled one
// (approval.ModeSettled: the gate answered without a human; approved or
// rejected). It fills in r.Status (pending), r.Digest when empty, r.Created when zero and r.Quorum
// when below 1. A digest that does not match r.Args is refused with
// approval.ErrInvalidArgs; an existing id with approval.ErrExists.
func (s *Store) CreateRequest(ctx context.Context, r *approval.Request) error {
	if err := approval.PrepareNew(r, s.now()); err != nil {
		return err
	}
	// A sampled call (it ran) or a settled one (the gate answered) is
	// final from the start: never pending, never indexed as such.
	final := r.Mode == approval.ModeSampled || r.Mode == approval.ModeSettled
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
	r.Rev = 1 // createScript's
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

// PendingFrom returns the ids and creation times of the pending requests
// created at or after from (the zero time: all), oldest first, skipping
// offset of them (Redis walks them: keep it small) and returning at most
// count, as the pending index has them (reading no record: an entry may
// outlive its request's pending state by moments). The reminder loop
// learns of new requests with it, page by page, so that it does not read
// every pending record on every tick.
func (s *Store) PendingFrom(ctx context.Context, from time.Time, offset, count int) ([]approval.PendingRef, error) {
	lo := "-inf"
	if !from.IsZero() {
		lo = strconv.FormatInt(from.UnixMilli(), 10)
	}
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, s.k.pending(), &redis.ZRangeBy{
		Min: lo, Max: "+inf", Offset: int64(offset), Count: int64(count),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("pending from %s: %w", lo, err)
	}
	return pendingRefs(zs), nil
}

// PendingRank returns the entries of the pending index ranked start to
// start+count-1, oldest first: a page of the whole index at the cost of
// the page (Redis walks an offset of PendingFrom one entry at a time).
func (s *Store) PendingRank(ctx context.Context, start, count int) ([]approval.PendingRef, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.k.pending(), int64(start), int64(start+count-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("pending ranked %d-%d: %w", start, start+count-1, err)
	}
	return pendingRefs(zs), nil
}

// pendingRefs converts entries of the pending index.
func pendingRefs(zs []redis.Z) []approval.PendingRef {
	out := make([]approval.PendingRef, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		out = append(out, approval.PendingRef{ID: id, Created: time.UnixMilli(int64(z.Score)).UTC()})
	}
	return out
}

// PendingRecords returns the records of ids that are still pending, in
// their order: nil for a request that is gone or no longer pending, whose
// index entries it removes (as Pending does). Reads are pipelined pages.
func (s *Store) PendingRecords(ctx context.Context, ids []string) ([]*approval.Request, error) {
	rs, err := s.load(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("load %d pending requests: %w", len(ids), err)
	}
	var stale []any
	for i, r := range rs {
		if r == nil || r.Status != approval.StatusPending {
			rs[i] = nil
			stale = append(stale, ids[i])
		}
	}
	s.prunePending(ctx, stale)
	return rs, nil
}

// prunePending removes ids, known not to be pending, from the pending
// index (their deadline entries are the expiry sweeper's); a failure is
// logged, the next reader prunes them again.
func (s *Store) prunePending(ctx context.Context, ids []any) {
	if len(ids) == 0 {
		return
	}
	if err := s.rdb.ZRem(ctx, s.k.pending(), ids...).Err(); err != nil {
		s.log.WarnContext(ctx, "store: prune pending index", "err", err)
	}
}

// PendingCount returns the number of entries of the pending index: the
// pending requests, and for moments one just decided (readers of the
// index remove such entries). One command, whatever the backlog.
func (s *Store) PendingCount(ctx context.Context) (int, error) {
	n, err := s.rdb.ZCard(ctx, s.k.pending()).Result()
	if err != nil {
		return 0, fmt.Errorf("pending count: %w", err)
	}
	return int(n), nil
}

// maxStaleOldest bounds the index entries PendingAges drops before it
// finds the oldest request still pending.
const maxStaleOldest = 10

// PendingAges returns when the oldest pending request was created (zero
// when none) and how many pending requests are past their deadline at now
// (the expiry sweeper's, within a second), from the indexes: a few
// commands whatever the backlog. An oldest entry whose record is no longer
// pending is removed and the next one taken, so a stale entry never holds
// the age up.
func (s *Store) PendingAges(ctx context.Context, now time.Time) (oldest time.Time, overdue int, err error) {
	n, err := s.rdb.ZCount(ctx, s.k.deadlines(), "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10)).Result()
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("overdue requests: %w", err)
	}
	for range maxStaleOldest {
		zs, err := s.rdb.ZRangeWithScores(ctx, s.k.pending(), 0, 0).Result()
		if err != nil {
			return time.Time{}, 0, fmt.Errorf("oldest pending request: %w", err)
		}
		if len(zs) == 0 {
			return time.Time{}, int(n), nil
		}
		ref := pendingRefs(zs)[0]
		st, err := s.rdb.HGet(ctx, s.k.request(ref.ID), fStatus).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return time.Time{}, 0, fmt.Errorf("oldest pending request: %w", err)
		}
		if st == string(approval.StatusPending) {
			return ref.Created, int(n), nil
		}
		s.prunePending(ctx, []any{ref.ID})
	}
	return time.Time{}, 0, fmt.Errorf("oldest pending request: more than %d stale index entries", maxStaleOldest)
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
	s.prunePending(ctx, stale)
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
	for start := 0; start < len(ids); start += s.page {
		end := min(start+s.page, len(ids))
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

// encodeRecord turns a new request into HSET field/value arguments.
func encodeRecord(r *approval.Request) ([]any, error) {
	base := *r
	base.Status, base.Args, base.Digest = "", nil, ""
	base.Approvals, base.Decision, base.OriginalArgs = nil, nil, nil
	base.Card, base.Result, base.Grant, base.Reopened = approval.CardRef{}, "", nil, nil
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
	if r.ClaimWindow > 0 {
		args = append(args, fClaimMS, r.ClaimWindow.Milliseconds())
	}
	if final {
		args = append(args, fResult, r.Result)
	}
	return args, nil
}

// isSole reports whether list, a JSON array, is "[" + elem + "]".
func isSole(list, elem string) bool {
	return len(list) == len(elem)+2 && list[0] == '[' && list[len(list)-1] == ']' && list[1:len(list)-1] == elem
}

// decodeRecord rebuilds a Request from its hash fields.
func decodeRecord(f map[string]string) (*approval.Request, error) {
	return decodeFields(mapFields(f))
}

// recordFields are the hash fields of a record that decodeFields reads.
type recordFields struct {
	base, status, args, digest, quorum, approvals, decision string
	card, feedback, grant, result, claimToken, reopened     string
	rev                                                     string
	originalArgs                                            string
	hasOriginalArgs                                         bool // the field exists (it may be empty)
}

// mapFields reads a record's fields from its hash.
func mapFields(f map[string]string) recordFields {
	rf := recordFields{base: f[fBase], status: f[fStatus], args: f[fArgs], digest: f[fDigest], quorum: f[fQuorum],
		approvals: f[fApprovals], decision: f[fDecision], card: f[fCard], feedback: f[fFeedback], grant: f[fGrant],
		result: f[fResult], claimToken: f[fClaimToken], reopened: f[fReopened], rev: f[fRev]}
	rf.originalArgs, rf.hasOriginalArgs = f[fOriginalArgs]
	return rf
}

// set keeps value v of field k when decodeFields reads it.
func (rf *recordFields) set(k, v string) {
	switch k {
	case fBase:
		rf.base = v
	case fStatus:
		rf.status = v
	case fArgs:
		rf.args = v
	case fDigest:
		rf.digest = v
	case fQuorum:
		rf.quorum = v
	case fApprovals:
		rf.approvals = v
	case fDecision:
		rf.decision = v
	case fCard:
		rf.card = v
	case fFeedback:
		rf.feedback = v
	case fGrant:
		rf.grant = v
	case fResult:
		rf.result = v
	case fClaimToken:
		rf.claimToken = v
	case fReopened:
		rf.reopened = v
	case fRev:
		rf.rev = v
	case fOriginalArgs:
		rf.originalArgs, rf.hasOriginalArgs = v, true
	}
}

// decodeFields rebuilds a Request from its hash fields.
func decodeFields(f recordFields) (*approval.Request, error) {
	r, err := bases.decode(f.base)
	if err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	r.Status = approval.Status(f.status)
	r.Args = json.RawMessage(f.args)
	if f.rev != "" {
		if r.Rev, err = strconv.ParseInt(f.rev, 10, 64); err != nil {
			return nil, fmt.Errorf("decode record rev: %w", err)
		}
	}
	r.Digest = f.digest
	if q, err := strconv.Atoi(f.quorum); err == nil && q > r.Quorum {
		r.Quorum = q // raised by an edit (decideScript)
	}
	if f.hasOriginalArgs {
		r.OriginalArgs = json.RawMessage(f.originalArgs)
	}
	// A request decided by its one approval (quorum 1, or an edit) has
	// approvals "[<decision>]": decideScript writes both from one
	// argument. Its approval is then decoded once, as the decision.
	sole := false
	if v := f.approvals; v != "" {
		if sole = f.decision != "" && isSole(v, f.decision); !sole {
			if err := json.Unmarshal([]byte(v), &r.Approvals); err != nil {
				return nil, fmt.Errorf("decode record approvals: %w", err)
			}
		}
	}
	if f.decision != "" {
		r.Decision = new(approval.Decision)
		if err := json.Unmarshal([]byte(f.decision), r.Decision); err != nil {
			if sole {
				return nil, fmt.Errorf("decode record approvals: %w", err)
			}
			return nil, fmt.Errorf("decode record decision: %w", err)
		}
		if sole {
			a := *r.Decision
			a.Args, a.Signals = bytes.Clone(a.Args), slices.Clone(a.Signals) // shared with nothing, as if decoded apart
			r.Approvals = []approval.Decision{a}
		}
	}
	if v := f.card; v != "" {
		if err := json.Unmarshal([]byte(v), &r.Card); err != nil {
			return nil, fmt.Errorf("decode record card: %w", err)
		}
	}
	if v := f.feedback; v != "" {
		r.Feedback = new(approval.Feedback)
		if err := json.Unmarshal([]byte(v), r.Feedback); err != nil {
			return nil, fmt.Errorf("decode record feedback: %w", err)
		}
	}
	if v := f.grant; v != "" {
		r.Grant = new(approval.Grant)
		if err := json.Unmarshal([]byte(v), r.Grant); err != nil {
			return nil, fmt.Errorf("decode record grant: %w", err)
		}
	}
	if v := f.reopened; v != "" {
		r.Reopened = new(approval.Reopening)
		if err := json.Unmarshal([]byte(v), r.Reopened); err != nil {
			return nil, fmt.Errorf("decode record reopened: %w", err)
		}
		r.Deadline = r.Reopened.Deadline
	}
	r.Result = f.result
	r.ClaimHash = f.claimToken
	return r, nil
}
