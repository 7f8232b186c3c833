package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// This file holds what lets a transition and its audit entry share one
// round trip (Ledger.oneTrip): the guarded append, and the claim and the
// decision sent with their entries. The chain itself is audit.go's.

// guardedAppendScript is appendScript made conditional on a claim
// (Audit.ClaimAppend): the entry is written only if the claim of op id
// ARGV[8] took on the record KEYS[4] ('ok' in its op field) and the
// record's digest is still ARGV[9], the digest of the arguments the entry
// describes. Reply {3, ""} when the guard does not hold (nothing
// written); its other replies are appendScript's. Only where one script
// may touch both the chain and the record: a single node, not a Cluster
// (other slots).
//
//	KEYS[1]   stream
//	KEYS[2]   head
//	KEYS[3]   claim
//	KEYS[4]   the request's record
//	ARGV[1]   expected head token
//	ARGV[2]   new seq
//	ARGV[3]   new hash
//	ARGV[4]   MAXLEN
//	ARGV[5]   the op id of this call
//	ARGV[6]   the writer
//	ARGV[7]   "1" to claim the next append (never, here: one attempt)
//	ARGV[8]   the op id of the claim (luaOp) the entry follows
//	ARGV[9]   the digest of the arguments the entry describes
//	ARGV[10..] field, value, ... for XADD
var guardedAppendScript = redis.NewScript(luaChainAppend + `
local function guard()
  return redis.call('HGET', KEYS[4], 'op:' .. ARGV[8]) == 'ok' and redis.call('HGET', KEYS[4], 'digest') == ARGV[9]
end
return chainAppend(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], 10, guard, nil)
`)

// ClaimAppend claims request id for owner as Store.Claim does (tokenHash
// as there), and appends r, the entry of the execution that claim lets
// start, in the same round trip: a pipeline of the claim and
// guardedAppendScript, which writes the entry only if this claim took
// and the request's arguments are still those of digest (those r
// describes). appended reports whether the entry e was written. It is not
// when the claim was refused (the refusal is the error, as Claim's), when
// another writer moved the chain head first, when the digest differs, or
// where one round trip cannot hold both (a Cluster: the record and the
// chain are in different slots; Options.WaitReplicas: the claim counts
// only once replicas confirm it; then the claim alone is made): the
// caller then appends the entry itself, from the record claimed. The
// audit must have been made with AuditOptions.Wakes, the store the
// request is in: without it, ErrCannotClaim and nothing done.
func (a *Audit) ClaimAppend(ctx context.Context, r approval.Record, id, owner, tokenHash, digest string) (claimedReq *approval.Request, e approval.Entry, appended bool, err error) {
	s := a.wakes
	if s == nil {
		return nil, approval.Entry{}, false, fmt.Errorf("claim %s: %w", id, ErrCannotClaim)
	}
	if _, cluster := s.rdb.(*redis.ClusterClient); cluster || s.rdb != a.rdb || s.replicas > 0 {
		got, err := s.Claim(ctx, id, owner, tokenHash, digest)
		return got, approval.Entry{}, false, err
	}
	if e, err = newEntry(r); err != nil {
		got, err := s.Claim(ctx, id, owner, tokenHash, digest)
		return got, approval.Entry{}, false, err
	}
	claimOp := newOp()
	var claimCmd *redis.Cmd
	appended, _, err = a.guardedAppend(ctx, id, &e, claimOp, digest, func(p redis.Pipeliner) {
		claimKeys, claimArgs := s.claimArgs(id, owner, tokenHash, digest, claimOp)
		claimCmd = claimScript.EvalSha(ctx, p, claimKeys, claimArgs...)
	}, nil)
	if err != nil {
		return nil, approval.Entry{}, false, fmt.Errorf("claim %s: %w", id, err)
	}
	v, cerr := claimCmd.Result()
	if cerr != nil && redis.HasErrorPrefix(cerr, "NOSCRIPT") {
		// Not loaded yet: nothing was claimed, so the guard held nothing
		// either. Claim alone (which loads the script).
		got, err := s.Claim(ctx, id, owner, tokenHash, digest)
		return got, approval.Entry{}, false, err
	}
	rep, cerr := parseReply(v, cerr)
	claimedReq, err = claimed(id, rep, cerr)
	if err != nil || !appended {
		return claimedReq, approval.Entry{}, false, err
	}
	return claimedReq, e, true, nil
}

// guardedAppend sends one pipeline: first what the entry follows (queued
// by transition: a claim, a decision, whose op id is guardOp), then
// guardedAppendScript's append of e, written only if that transition
// took on request id's record with the arguments of digest, then what
// must follow the entry (after, nil for nothing; AppendWake's then). It
// holds the audit's turn meanwhile and chains e to the head this process
// knows. appended reports whether e was written (e then has its stream
// ID), followed whether after took effect; when not written, the head
// the reply carried is kept for the caller's own append. err is only the
// wait for the turn's (ctx); what transition queued is the caller's to
// read.
func (a *Audit) guardedAppend(ctx context.Context, id string, e *approval.Entry, guardOp, digest string,
	transition func(p redis.Pipeliner), after then) (appended, followed bool, err error) {
	select {
	case a.turn <- struct{}{}:
	case <-ctx.Done():
		return false, false, ctx.Err()
	}
	defer func() { <-a.turn }()
	prev := a.stamp(e)
	op := newOp()
	keys := []string{a.stream, a.head, a.claimKey, a.wakes.k.request(id)}
	args := make([]any, 0, 9+entryFieldsMax)
	args = append(args, prev.token(), e.Seq, e.Hash, a.maxLen, op, newOp(), "0", guardOp, digest)
	args = appendEntryFields(args, *e)
	var appendCmd *redis.Cmd
	var took func() bool
	_, _ = a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		transition(p)
		appendCmd = guardedAppendScript.EvalSha(ctx, p, keys, args...)
		if after != nil {
			took = after(p, op)
		}
		return nil
	})
	if took != nil {
		followed = took()
	}
	res, aerr := appendCmd.Slice()
	switch {
	case aerr != nil && redis.HasErrorPrefix(aerr, "NOSCRIPT"):
		_ = guardedAppendScript.Load(ctx, a.rdb).Err() // for the next one; this entry is the caller's
	case aerr != nil:
	default:
		outcome, val, perr := parseAppendReply(res)
		switch {
		case perr != nil:
			a.log.Warn("audit append after a transition", "request_id", id, "err", perr)
		case outcome == appendDone:
			e.ID = val
			a.last = chainHead{seq: e.Seq, hash: e.Hash}
			if a.observer != nil {
				a.observer.Appended(*e)
			}
			return true, followed, nil
		case outcome == appendMoved || outcome == appendClaimed:
			if head, herr := parseHeadToken(val); herr == nil {
				a.last = head // for the caller's append
			}
		}
	}
	return false, false, nil
}

// DecideAppendWake records decision d as Store.RecordDecision does,
// appends r (the entry of the request d makes final with status st) and
// pushes the request's wake-up, in one round trip: a pipeline of the
// decision, guardedAppendScript (the entry is written only if that very
// decision made the request final, 'ok' under its op id, and the
// request's digest is digest, the arguments r describes) and wakeScript
// (pushed only if that entry wrote the chain head: record → audit →
// wake-up). after and err are RecordDecision's. appended and woke report
// what took. Neither does when the decision was refused, counted toward a
// quorum or found the deadline passed, when another writer moved the
// chain head first, when a script was not loaded yet, or where one round
// trip cannot hold all three (a Cluster, WaitReplicas, an audit on
// another client: the decision is then recorded alone). The caller then
// appends the entry and pushes the wake-up from after, as it would
// without this. The indexes of the request made final are left in the
// decision's script (decideScript, KEYS[4] and KEYS[5]). The audit must
// have been made with AuditOptions.Wakes, the store the request is in:
// without it, ErrCannotDecide and nothing done.
func (a *Audit) DecideAppendWake(ctx context.Context, d approval.Decision, r approval.Record, st approval.Status, digest string) (after *approval.Request, e approval.Entry, appended, woke bool, err error) {
	s := a.wakes
	if s == nil {
		return nil, approval.Entry{}, false, false, fmt.Errorf("decide %s: %w", d.RequestID, ErrCannotDecide)
	}
	if s.rdb != a.rdb || !s.wakesWith() {
		after, err = s.RecordDecision(ctx, d)
		return after, approval.Entry{}, false, false, err
	}
	dc, err := s.decision(d)
	if err != nil {
		return nil, approval.Entry{}, false, false, err
	}
	alone := func() (*approval.Request, approval.Entry, bool, bool, error) {
		rep, err := run(ctx, s.rdb, decideScript, dc.keys, dc.args("", "")...)
		after, err := s.decided(ctx, dc, rep, err)
		return after, approval.Entry{}, false, false, err
	}
	e, err = newEntry(r)
	if err != nil {
		return alone()
	}
	var decideCmd *redis.Cmd
	appended, woke, err = a.guardedAppend(ctx, d.RequestID, &e, dc.op, digest, func(p redis.Pipeliner) {
		decideCmd = decideScript.EvalSha(ctx, p, dc.keys, dc.args("", "")...)
	}, func(p redis.Pipeliner, op string) func() bool {
		return s.wakeBehind(ctx, p, a.head, op, d.RequestID, st, false)
	})
	if err != nil {
		return nil, approval.Entry{}, false, false, fmt.Errorf("decide %s: %w", d.RequestID, err)
	}
	v, derr := decideCmd.Result()
	if derr != nil && redis.HasErrorPrefix(derr, "NOSCRIPT") {
		// Not loaded yet: nothing was decided, so the guard held nothing
		// and nothing was woken. Decide alone (which loads the script).
		return alone()
	}
	rep, derr := parseReply(v, derr)
	after, err = s.decided(ctx, dc, rep, derr)
	if !appended {
		e = approval.Entry{}
	}
	return after, e, appended, woke, err
}

// ErrCannotClaim and ErrCannotDecide: an Audit made without
// AuditOptions.Wakes has no store to claim or decide in (ClaimAppend,
// DecideAppendWake); nothing was done. A Ledger never meets them: it
// gives its audit its store.
var (
	ErrCannotClaim  = errors.New("store: this audit has no store to claim in")
	ErrCannotDecide = errors.New("store: this audit has no store to record decisions in")
)
