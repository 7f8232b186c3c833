package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// decideScript records one human decision. See Store.RecordDecision.
//
//	KEYS[1]   record
//	KEYS[2]   wake list
//	KEYS[3]   the claim-window index (keys.claims), on a single node only
//	          (another slot on a Cluster): a request approved here whose
//	          record has claim_ms is indexed by the end of its claim window
//	          in the same script, and the reply's third element is "1"
//	          (otherwise Store.awaitClaim indexes it after)
//	KEYS[4]   the pending index (keys.pending), with KEYS[3] only: a
//	          request made final here leaves it in the same script
//	KEYS[5]   the deadline index (keys.deadlines), as KEYS[4] (on a Cluster
//	          both are cleaned up with the wake-up: Store.wake)
//	ARGV[1]   verdict
//	ARGV[2]   approver
//	ARGV[3]   at (unix ms)
//	ARGV[4]   digest the approver saw
//	ARGV[5]   the decision JSON to store
//	ARGV[6]   the expiry decision JSON (used if the deadline passed; ""
//	          when the caller has not encoded it: then, deadline passed,
//	          nothing changes and the reply is {'due'})
//	ARGV[7]   edited args (edit only)
//	ARGV[8]   digest of the edited args (edit only)
//	ARGV[9]   wake list TTL (seconds)
//	ARGV[10]  "1" to leave the wake-up to the caller (Store.RecordDecision:
//	          the lifecycle owner pushes it with Store.Wake after auditing)
//	ARGV[11]  the window-elapsed decision JSON (used if a cancel window
//	          ended; "" as ARGV[6])
//	ARGV[12]  the op id (luaOp)
//	ARGV[13]  the retention TTL (ms, "" to keep forever) set on the record
//	          when it ends rejected, responded or expired (nothing more will
//	          happen to it) — in the script, so recording a decision is one
//	          round trip
//	ARGV[14]  the approvals the edited call needs (edit only: its judgement,
//	          approval.Decision.Quorum): the record's quorum is raised to
//	          it, never lowered, in the same script that counts the edit as
//	          one approval, so no decision can slip between the two
//	ARGV[15]  the hint channel (keys.channel)
//	ARGV[16]  the request's id
//	ARGV[17]  the revision the decision is conditional on (Decision.Rev;
//	          "" for none): another answers {'moved', record}, nothing
//	          changed
//
// Every change raises the record's revision (rev). The record in the reply is its snapshot (luaHint): the one the hint
// carried when the script woke the waiters.
//
// Under mode "after" the deadline is the end of the cancel window: a
// decision at or after it finds the call approved by the clock (elapsed),
// and the verdicts are cancel (rejected) and run_now (approved).
var decideScript = redis.NewScript(luaHint + luaBound + luaOp + luaSeal + `
local rec, wake, op = KEYS[1], KEYS[2], ARGV[12]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, snapshot(rec)} end
if status ~= 'pending' then return {'decided', snapshot(rec)} end

-- snap: the record as the hint carried it, which is also the reply (the
-- op field done adds after it is read by nobody).
local snap
local indexed = '0'
local function final(st, decision)
  redis.call('HSET', rec, 'status', st, 'decision', decision)
  redis.call('HINCRBY', rec, 'rev', 1)
  if st == 'approved' and KEYS[3] then
    local cw = tonumber(redis.call('HGET', rec, 'claim_ms') or '')
    if cw and cw > 0 then
      redis.call('ZADD', KEYS[3], tonumber(ARGV[3]) + cw, ARGV[16])
      indexed = '1'
    end
  end
  if st ~= 'approved' and ARGV[13] ~= '' then redis.call('PEXPIRE', rec, ARGV[13]) end
  if KEYS[4] then
    redis.call('ZREM', KEYS[4], ARGV[16])
    redis.call('ZREM', KEYS[5], ARGV[16])
  end
  if ARGV[10] ~= '1' then
    redis.call('LPUSH', wake, st)
    redis.call('EXPIRE', wake, ARGV[9])
    snap = snapshot(rec)
    hint(ARGV[15], snap)
  end
end

local at = tonumber(ARGV[3])
local deadline = tonumber(redis.call('HGET', rec, 'deadline') or '')
if deadline and at >= deadline then
  if ARGV[6] == '' or ARGV[11] == '' then return {'due'} end
  if redis.call('HGET', rec, 'mode') == 'after' and bound(rec) then
    final('approved', sealed(rec, ARGV[11]))
    return {done(rec, op, 'elapsed'), snap or snapshot(rec), indexed}
  end
  final('expired', ARGV[6])
  return {done(rec, op, 'expired'), snap or snapshot(rec)}
end

if ARGV[17] ~= '' and (redis.call('HGET', rec, 'rev') or '0') ~= ARGV[17] then
  return {'moved', snapshot(rec)}
end

local verdict, approver = ARGV[1], ARGV[2]
local allow = redis.call('HGET', rec, 'allow') or ''
if not string.find(allow, ',' .. verdict .. ',', 1, true) then return {'not_allowed'} end
if redis.call('HGET', rec, 'digest') ~= ARGV[4] then return {'stale'} end
local quorum = tonumber(redis.call('HGET', rec, 'quorum') or '1') or 1

if verdict == 'approve' then
  if redis.call('HSETNX', rec, 'vote:' .. approver, ARGV[3]) == 0 then return {'already_voted'} end
  local votes = redis.call('HINCRBY', rec, 'votes', 1)
  local list = redis.call('HGET', rec, 'approvals')
  if not list or list == '[]' then
    list = '[' .. ARGV[5] .. ']'
  else
    list = string.sub(list, 1, -2) .. ',' .. ARGV[5] .. ']'
  end
  redis.call('HSET', rec, 'approvals', list)
  if votes < quorum then
    redis.call('HINCRBY', rec, 'rev', 1)
    return {done(rec, op, 'counted'), snapshot(rec)}
  end
  final('approved', ARGV[5])
elseif verdict == 'edit' then
  if redis.call('HEXISTS', rec, 'original_args') == 0 then
    redis.call('HSET', rec, 'original_args', redis.call('HGET', rec, 'args'))
  end
  -- approvals counted so far were for the old arguments: drop them all
  local fields = redis.call('HKEYS', rec)
  for _, f in ipairs(fields) do
    if string.sub(f, 1, 5) == 'vote:' then redis.call('HDEL', rec, f) end
  end
  redis.call('HSET', rec, 'args', ARGV[7], 'digest', ARGV[8], 'vote:' .. approver, ARGV[3],
    'votes', 1, 'approvals', '[' .. ARGV[5] .. ']')
  -- an edit is a new proposal: the edited call may need more approvals
  -- than the request asked for, and the editor supplies only one of them
  local need = tonumber(ARGV[14] or '') or 0
  if need > quorum then
    quorum = need
    redis.call('HSET', rec, 'quorum', quorum)
  end
  if quorum > 1 then
    redis.call('HINCRBY', rec, 'rev', 1)
    return {done(rec, op, 'edited'), snapshot(rec)}
  end
  final('approved', ARGV[5])
elseif verdict == 'reject' then
  final('rejected', ARGV[5])
elseif verdict == 'respond' then
  final('responded', ARGV[5])
elseif verdict == 'cancel' then
  final('rejected', ARGV[5])
elseif verdict == 'run_now' then
  final('approved', ARGV[5])
else
  return {'not_allowed'}
end
return {done(rec, op, 'ok'), snap or snapshot(rec), indexed}
`)

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
	dc, err := s.decision(d)
	if err != nil {
		return nil, err
	}
	rep, err := run(ctx, s.rdb, decideScript, dc.keys, dc.args("", "")...)
	return s.decided(ctx, dc, rep, err)
}

// decisionCall is decideScript's call for one decision: its keys, its
// arguments and its op id, the same in every run of it (RecordDecision,
// Audit.DecideAppendWake).
type decisionCall struct {
	d  approval.Decision // At in UTC; an edit's Digest is its arguments'
	op string
	// keys are decideScript's; args its arguments, given the expiry and
	// window-elapsed decisions ("" until a run answered 'due').
	keys []string
	args func(expiry, elapse any) []any
}

// decision prepares decideScript's call for d (RecordDecision).
func (s *Store) decision(d approval.Decision) (*decisionCall, error) {
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
	retain := s.retainArg()
	rev := "" // unconditional
	if d.Rev > 0 {
		rev = strconv.FormatInt(d.Rev, 10)
	}
	op := newOp() // the same in every run: the first changes nothing when it answers 'due'
	keys := []string{s.k.request(id), s.k.wake(id)}
	if _, cluster := s.rdb.(*redis.ClusterClient); !cluster {
		// The claim window indexed and the indexes left in the script: one
		// round trip less each.
		keys = append(keys, s.k.claims(), s.k.pending(), s.k.deadlines())
	}
	return &decisionCall{d: d, op: op, keys: keys, args: func(expiry, elapse any) []any {
		return []any{string(d.Verdict), d.Approver, d.At.UnixMilli(), seen, decision, expiry,
			newArgs, newDigest, int64(wakeTTL / time.Second), "1", elapse, op, retain, d.Quorum, s.k.channel(id), id, rev}
	}}, nil
}

// decided is RecordDecision once decideScript answered rep (err: the
// command's error) to dc: a 'due' answer is followed by the run that
// records the expiry (or the elapsed window), then the reply becomes the
// request and the refusal.
func (s *Store) decided(ctx context.Context, dc *decisionCall, rep reply, err error) (*approval.Request, error) {
	d, id := dc.d, dc.d.RequestID
	// The clock's decisions (an expiry, an elapsed cancel window) are
	// encoded only when the script finds the deadline passed ('due', the
	// record unchanged): nearly every decision comes before it and does
	// without them.
	if err == nil && rep.code == codeDue {
		expiry, merr := json.Marshal(expiryDecision(id, d.At))
		if merr != nil {
			return nil, fmt.Errorf("decide %s: %w", id, merr)
		}
		elapse, merr := json.Marshal(elapseDecision(id, d.At))
		if merr != nil {
			return nil, fmt.Errorf("decide %s: %w", id, merr)
		}
		rep, err = run(ctx, s.rdb, decideScript, dc.keys, dc.args(expiry, elapse)...)
	}
	if err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	if rep.code == codeDue {
		return nil, fmt.Errorf("decide %s: unexpected script reply %q", id, rep.code)
	}
	var r *approval.Request
	if rep.hasRecord() {
		if r, err = rep.record(); err != nil {
			return nil, fmt.Errorf("decide %s: %w", id, err)
		}
	}
	if (rep.code == codeOK || rep.code == codeElapsed) && rep.extra != "1" {
		s.awaitClaim(ctx, r) // a Cluster, or a record written before claim_ms
	}
	switch rep.code {
	case codeOK:
		// Retention was set by the script (rejected, responded); the
		// indexes are cleaned up in the script or with the wake-up (wake).
		return r, nil
	case codeCounted, codeEdited:
		return r, nil
	case codeExpired, codeElapsed:
		de := approval.NewDecidedError(r)
		de.Now = true
		return r, fmt.Errorf("decide %s: %w", id, de)
	case codeDecided:
		return r, fmt.Errorf("decide %s: %w", id, approval.NewDecidedError(r))
	case codeMoved:
		return r, fmt.Errorf("decide %s: at revision %d: %w", id, d.Rev, approval.ErrMoved)
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

// claimScript moves an approved request to executing, once. Every later
// claim gets the record as it is (claimed, abandoned, not_approved), never
// a second executing.
//
//	KEYS[1]   record
//	ARGV[1]   owner
//	ARGV[2]   now (unix ms)
//	ARGV[3]   the op id (luaOp)
//	ARGV[4]   the hex SHA-256 of the claim token ("" for none)
//	ARGV[5]   the digest the claim judged ("" for any): a request whose
//	          arguments are no longer those is not claimed ('stale')
var claimScript = redis.NewScript(luaOp + luaApproved + `
local rec, op = KEYS[1], ARGV[3]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
local refused = unapproved(rec, status, ARGV[5])
if refused then return refused end
redis.call('HSET', rec, 'status', 'executing', 'claim_owner', ARGV[1], 'claim_at', ARGV[2])
redis.call('HINCRBY', rec, 'rev', 1)
if ARGV[4] ~= '' then redis.call('HSET', rec, 'claim_token', ARGV[4]) end
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// Claim moves an approved request to executing, at most once across all
// processes, recording owner, time and tokenHash (the hex SHA-256 of the
// claim token, approval.HashClaimToken; "" for an in-process claim
// without one). Every later claim is refused with the record as it now
// is: approval.ErrAlreadyClaimed when the request is executing or
// finished (executed, failed, unknown), approval.ErrAbandoned when its
// claim window ended unclaimed, approval.ErrNotApproved when it is not
// approved (pending, rejected, refused, ...); approval.ErrNotFound when
// missing. With digest set (the arguments the lifecycle's judgement
// judged), an approved request whose digest is another is not claimed:
// approval.ErrStaleArgs with the record.
//
// With Options.WaitReplicas a claim counts only once that many replicas
// have it (claimConfirmed): otherwise a failover could lose it, and
// another process claim and run the request again on the new primary.
// One they do not confirm is withdrawn and refused with
// approval.ErrClaimNotConfirmed: nothing may run on it, and the request
// may be claimed again.
func (s *Store) Claim(ctx context.Context, id, owner, tokenHash, digest string) (*approval.Request, error) {
	op := newOp()
	keys, args := s.claimArgs(id, owner, tokenHash, digest, op)
	if s.replicas > 0 {
		return s.claimConfirmed(ctx, id, op, keys, args)
	}
	rep, err := run(ctx, s.rdb, claimScript, keys, args...)
	return claimed(id, rep, err)
}

// claimTries bounds how many times claimConfirmed sends a claim whose
// replicas did not confirm it, or whose reply was lost.
const claimTries = 3

// claimConfirmed is Claim with Options.WaitReplicas: the claim script and
// a WAIT in one pipeline (one connection, so WAIT covers the claim). A
// claim won but confirmed by fewer replicas, or whose reply was lost
// (Redis failing over), is sent again with the same op id, up to
// claimTries times: a primary that has it replays it (and WAIT asks its
// replicas again), one that lost it in a failover sees the request as it
// is there (approved: claimed now; claimed by another process: refused).
// A refusal needs no confirmation: nothing runs on it. A claim still
// unconfirmed after that is withdrawn (withdrawScript) and refused with
// approval.ErrClaimNotConfirmed. op is the claim's op id, keys and args
// claimScript's (claimArgs).
func (s *Store) claimConfirmed(ctx context.Context, id, op string, keys []string, args []any) (*approval.Request, error) {
	var why error
	for range claimTries {
		var claim, acked *redis.Cmd
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			claim = claimScript.Eval(ctx, p, keys, args...)
			acked = p.Do(ctx, "wait", s.replicas, s.replicaWait.Milliseconds())
			return nil
		})
		rep, err := parseReply(claim.Result())
		if err != nil {
			why = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		r, err := claimed(id, rep, nil)
		if err != nil {
			return r, err
		}
		n, err := acked.Int64()
		if err == nil && n >= int64(s.replicas) {
			return r, nil
		}
		why = err
		if err == nil {
			why = fmt.Errorf("%d of %d replicas within %v", n, s.replicas, s.replicaWait)
		}
	}
	// The withdrawal is bounded by its own time, not the replicas' wait
	// (which may be a millisecond): a withdrawal cut short leaves the
	// claim standing with nobody to run it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(s.replicaWait, withdrawTimeout))
	defer cancel()
	if err := withdrawScript.Run(wctx, s.rdb, keys, op).Err(); err != nil {
		// The claim may stand, unconfirmed, with nobody to run it: the
		// request stays executing, and a run that finds it so reports
		// its outcome unknown. Nothing runs twice.
		s.log.ErrorContext(ctx, "store: withdraw an unconfirmed claim", "request_id", id, "err", err)
	}
	return nil, fmt.Errorf("claim %s: %v: %w", id, why, approval.ErrClaimNotConfirmed)
}

// withdrawTimeout bounds the withdrawal of an unconfirmed claim.
const withdrawTimeout = 2 * time.Second

// withdrawScript undoes a claim that its replicas did not confirm
// (claimConfirmed): if the record holds that very claim (its op id), it
// is approved again, without claimant, and the op is marked withdrawn so
// that a late replay of it cannot claim.
//
//	KEYS[1]   record
//	ARGV[1]   the claim's op id
var withdrawScript = redis.NewScript(`
local rec, op = KEYS[1], 'op:' .. ARGV[1]
if redis.call('HGET', rec, op) ~= 'ok' or redis.call('HGET', rec, 'status') ~= 'executing' then return 0 end
redis.call('HSET', rec, 'status', 'approved', op, 'withdrawn')
redis.call('HINCRBY', rec, 'rev', 1)
redis.call('HDEL', rec, 'claim_owner', 'claim_at', 'claim_token')
return 1
`)

// claimArgs are claimScript's keys and arguments: request id claimed by
// owner (tokenHash, digest: Claim), with op id op.
func (s *Store) claimArgs(id, owner, tokenHash, digest, op string) ([]string, []any) {
	return []string{s.k.request(id)}, []any{owner, s.now().UnixMilli(), op, tokenHash, digest}
}

// claimed is Claim's answer for claimScript's reply (err: the
// command's error).
func claimed(id string, rep reply, err error) (*approval.Request, error) {
	what := "claim " + id
	code, r, err := transitionReply(what, rep, err)
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
	case code == codeStale:
		return r, fmt.Errorf("%s: arguments are no longer those judged: %w", what, approval.ErrStaleArgs)
	}
	return nil, unexpectedReply(what, code)
}

// refuseScript ends an approved request that the judgement at its claim
// refused: refused, why its result. It answers as claimScript does for a
// request it does not change.
//
//	KEYS[1]   record
//	ARGV[1]   the digest judged
//	ARGV[2]   why (the result)
//	ARGV[3]   now (unix ms)
//	ARGV[4]   the op id (luaOp)
var refuseScript = redis.NewScript(luaOp + luaApproved + `
local rec, op = KEYS[1], ARGV[4]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
local refused = unapproved(rec, status, ARGV[1])
if refused then return refused end
redis.call('HSET', rec, 'status', 'refused', 'result', ARGV[2], 'finished_at', ARGV[3])
redis.call('HINCRBY', rec, 'rev', 1)
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// Refuse ends an approved request whose digest is digest as refused, why
// its result: the lifecycle's judgement at its claim refused it, so it
// never runs (approval.Records.Refuse). A request not approved is refused
// as Claim refuses it, one with another digest with approval.ErrStaleArgs,
// each with the record; approval.ErrNotFound when missing. Nothing more
// happens to a refused request: its record is kept Options.Retain.
func (s *Store) Refuse(ctx context.Context, id, digest, why string) (*approval.Request, error) {
	rep, err := run(ctx, s.rdb, refuseScript, []string{s.k.request(id)}, digest, why, s.now().UnixMilli(), newOp())
	r, err := claimed(id, rep, err)
	if err != nil {
		return r, err
	}
	s.retire(ctx, id)
	return r, nil
}

// reopenScript takes an approved request back to pending: the policy in
// force asks more approvals of its arguments than it has (the lifecycle's
// judgement at its claim). Its approvals and votes stay (each approver
// still counts once); its quorum is raised, never lowered; its final
// decision goes. It answers as claimScript does for a request it does not
// change.
//
//	KEYS[1]   record
//	ARGV[1]   the digest judged
//	ARGV[2]   the approvals the arguments need now
//	ARGV[3]   the new deadline (unix ms; "" for none)
//	ARGV[4]   the reopening (JSON approval.Reopening)
//	ARGV[5]   the op id (luaOp)
var reopenScript = redis.NewScript(luaOp + luaApproved + `
local rec, op = KEYS[1], ARGV[5]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
local refused = unapproved(rec, status, ARGV[1])
if refused then return refused end
local need = tonumber(ARGV[2]) or 1
local quorum = tonumber(redis.call('HGET', rec, 'quorum') or '1') or 1
if need > quorum then redis.call('HSET', rec, 'quorum', need) end
redis.call('HDEL', rec, 'decision')
redis.call('HSET', rec, 'status', 'pending', 'reopened', ARGV[4])
redis.call('HINCRBY', rec, 'rev', 1)
if ARGV[3] ~= '' then redis.call('HSET', rec, 'deadline', ARGV[3]) end
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// Reopen takes an approved request whose digest is digest back to
// pending (approval.Records.Reopen): quorum raised to ro.Need, approvals
// kept, deadline ro.Deadline, ro kept as Request.Reopened, and the
// request indexed as pending (and by its deadline) again, its claim
// window forgotten until it is approved again. Refusals as Refuse's.
func (s *Store) Reopen(ctx context.Context, id, digest string, ro approval.Reopening) (*approval.Request, error) {
	b, err := json.Marshal(ro)
	if err != nil {
		return nil, fmt.Errorf("reopen %s: %w", id, err)
	}
	deadline := ""
	if !ro.Deadline.IsZero() {
		deadline = strconv.FormatInt(ro.Deadline.UnixMilli(), 10)
	}
	rep, err := run(ctx, s.rdb, reopenScript, []string{s.k.request(id)}, digest, ro.Need, deadline, b, newOp())
	r, err := claimed(id, rep, err)
	if err != nil {
		return r, err
	}
	// The indexes are other slots: separate commands, as CreateRequest's.
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if deadline != "" {
			p.ZAdd(ctx, s.k.deadlines(), redis.Z{Score: float64(ro.Deadline.UnixMilli()), Member: id})
		}
		p.ZAdd(ctx, s.k.pending(), redis.Z{Score: float64(r.Created.UnixMilli()), Member: id})
		p.ZRem(ctx, s.k.claims(), id)
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("reopen %s: index: %w", id, err)
	}
	return r, nil
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

// retainArg is the retention argument of a script that ends a record:
// Options.Retain in ms (at least 1), "" when records are kept forever.
func (s *Store) retainArg() string {
	if s.retain < 0 {
		return ""
	}
	return strconv.FormatInt(max(s.retain.Milliseconds(), 1), 10)
}

// finishScript records the outcome of an executing request.
//
//	KEYS[1]   record
//	ARGV[1]   status
//	ARGV[2]   result
//	ARGV[3]   now (unix ms)
//	ARGV[4]   the op id (luaOp)
//	ARGV[5]   retention (ms) of the finished record; "" keeps it forever
var finishScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[4]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status ~= 'executing' then return {'not_executing', redis.call('HGETALL', rec)} end
redis.call('HSET', rec, 'status', ARGV[1], 'result', ARGV[2], 'finished_at', ARGV[3])
redis.call('HINCRBY', rec, 'rev', 1)
local reply = {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
if ARGV[5] ~= '' then redis.call('PEXPIRE', rec, ARGV[5]) end
return reply
`)

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
	// Nothing more happens to a finished record but a review: its
	// retention is set in the same script call.
	code, r, err := s.transition(ctx, what, finishScript, []string{s.k.request(id)}, string(st), result, s.now().UnixMilli(), newOp(), s.retainArg())
	switch {
	case err != nil:
		return nil, err
	case code == codeOK:
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

// closeScript ends a pending request without a human: expiry or cancel.
//
//	KEYS[1]   record
//	KEYS[2]   wake list
//	ARGV[1]   "expire" or "cancel"
//	ARGV[2]   now (unix ms)
//	ARGV[3]   decision JSON
//	ARGV[4]   wake list TTL (seconds)
//	ARGV[5]   "1" to leave the wake-up to the caller (the lifecycle owner
//	          pushes it with Store.Wake after auditing)
//	ARGV[6]   the window-elapsed decision JSON: an expiry due on a request
//	          of mode "after" approves it with that decision instead (its
//	          cancel window ended; the call runs)
//	ARGV[7]   the op id (luaOp)
//	ARGV[8]   the hint channel (keys.channel)
var closeScript = redis.NewScript(luaHint + luaBound + luaOp + luaSeal + `
local rec, wake, op = KEYS[1], KEYS[2], ARGV[7]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status ~= 'pending' then return {'decided', redis.call('HGETALL', rec)} end
local st, decision = 'cancelled', ARGV[3]
if ARGV[1] == 'expire' then
  local deadline = tonumber(redis.call('HGET', rec, 'deadline') or '')
  if not deadline or tonumber(ARGV[2]) < deadline then return {'not_due'} end
  st = 'expired'
  if redis.call('HGET', rec, 'mode') == 'after' and bound(rec) then st, decision = 'approved', sealed(rec, ARGV[6]) end
end
redis.call('HSET', rec, 'status', st, 'decision', decision)
redis.call('HINCRBY', rec, 'rev', 1)
if ARGV[5] ~= '1' then
  redis.call('LPUSH', wake, st)
  redis.call('EXPIRE', wake, ARGV[4])
  hint(ARGV[8], snapshot(rec))
end
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

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
// (approval.ModeAfter): nobody cancelled, so the call runs. Its digest is
// sealed by the script that records it (luaSeal): the request's digest as
// the window ends, which the claim's judgement binds the call to.
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
	return transitionReply(what, rep, err)
}

// transitionReply is transition's answer for a script's decoded reply.
func transitionReply(what string, rep reply, err error) (string, *approval.Request, error) {
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", what, err)
	}
	var r *approval.Request
	if rep.hasRecord() {
		if r, err = rep.record(); err != nil {
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
