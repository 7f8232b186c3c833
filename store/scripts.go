package store

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
)

// The request record is a Redis hash. Lua only compares and sets flat string
// fields and concatenates JSON that Go encoded; it never decodes or encodes
// JSON, so arguments (raw JSON, numbers as written) survive byte for byte and
// empty arrays cannot turn into objects.
//
//	base          Request JSON with the mutable fields below cleared (Go)
//	status        approval.Status
//	args          raw argument JSON, byte-exact
//	digest        approval.Digest(args)
//	original_args the proposed arguments once an edit replaced them
//	deadline      unix ms; absent means no deadline (under mode after: the
//	              end of the cancel window, when the call runs)
//	mode          approval.Mode: "after" (a cancel window) or "sampled" (ran, then posted for review); absent otherwise
//	claim_ms      approval.Request.ClaimWindow in ms, for decideScript to index the claim window; absent when none
//	feedback      JSON approval.Feedback, an approver's judgement after the fact (feedback.go)
//	wrong         "1" once marked wrong (never unset)
//	quorum        approvals needed (raised by an edit whose call needs more)
//	allow         ",approve,edit,reject," — verdicts Request.Allows
//	votes         number of distinct approvals counted
//	vote:<user>   unix ms of that approver's counted approval
//	approvals     JSON array of approval.Decision (counted approvals)
//	decision      JSON approval.Decision, the final one
//	card          JSON approval.CardRef, bound once (BindCard)
//	card_post_at  unix ms of the first card post attempt (StartCardPost)
//	grant         JSON approval.Grant given with the approval (grants.go)
//	claim_owner   who claimed execution; claim_at: unix ms
//	claim_token   hex SHA-256 of the winning claim's token (never the token); absent for an in-process claim
//	abandoned_at  unix ms the claim window's end was recorded (abandon.go)
//	reopened      JSON approval.Reopening: approved, then pending again at its claim (reopenScript); its deadline is the request's
//	result        execution outcome; finished_at: unix ms
//	op:<id>       reply code of the transition that call <id> made (luaOp)
const (
	fBase         = "base"
	fStatus       = "status"
	fArgs         = "args"
	fDigest       = "digest"
	fOriginalArgs = "original_args"
	fDeadline     = "deadline"
	fMode         = "mode"
	fClaimMS      = "claim_ms"
	fFeedback     = "feedback"
	fQuorum       = "quorum"
	fAllow        = "allow"
	fApprovals    = "approvals"
	fDecision     = "decision"
	fCard         = "card"
	fGrant        = "grant"
	fClaimOwner   = "claim_owner"
	fClaimAt      = "claim_at"
	fClaimToken   = "claim_token"
	fResult       = "result"
	fReopened     = "reopened"
	fRev          = "rev" // Request.Rev, raised by every script that changes the record
)

// Script reply codes (the first element of every reply).
const (
	codeOK           = "ok"          // transition done; record follows
	codeNotFound     = "not_found"   // no record
	codeDecided      = "decided"     // already final; record follows
	codeExpired      = "expired"     // RecordDecision found the deadline passed and expired it; record follows
	codeElapsed      = "elapsed"     // RecordDecision found a cancel window ended and approved the call; record follows
	codeNotAllowed   = "not_allowed" // verdict not allowed
	codeStale        = "stale"       // digest mismatch
	codeVoted        = "already_voted"
	codeCounted      = "counted" // approval counted, quorum not reached; record follows
	codeEdited       = "edited"  // edit recorded, approvals reset, still pending; record follows
	codeNotDue       = "not_due"
	codeClaimed      = "claimed"      // already executing or finished; record follows
	codeNotApproved  = "not_approved" // record follows
	codeAbandoned    = "abandoned"    // claimed too late: the claim window ended; record follows
	codeNotExecuting = "not_executing"
	codeNotFinal     = "not_final" // feedback on a request not settled by a person or a sample; record follows
	codeMarked       = "marked"    // already marked wrong (or reviewed); record follows
	codeDue          = "due"       // RecordDecision found the deadline passed without the clock's decisions to record: nothing changed
	codeMoved        = "moved"     // RecordDecision: the record is not at the decision's revision (Decision.Rev); record follows
)

// luaOp defines replayed(rec, op) and done(rec, op, code), which make a
// transition safe to run twice. go-redis runs a script again when its
// reply did not arrive within ReadTimeout (docs/deploy.md), and the first
// run may have changed the record already. Each call of a transition
// carries an op id of its own (newOp), the same in every run of that
// call; done records the reply code of the change under op:<id> in the
// record, and replayed finds it, so a second run answers what the first
// did instead of refusing the change the first run made. Nothing else
// reads op fields; they go with the record.
const luaOp = `
local function replayed(rec, op)
  if op == '' then return false end
  return redis.call('HGET', rec, 'op:' .. op)
end
local function done(rec, op, code)
  if op ~= '' then redis.call('HSET', rec, 'op:' .. op, code) end
  return code
end
`

// luaHint defines hint(ch, msg), which every script that pushes a wake list
// also calls: it publishes msg on the request's Pub/Sub channel (the wake
// list's name scoped to the database, keys.channel: channels are
// server-wide), the hint the wake hub listens for (wait.go). On Redis ≥ 7 it is a
// sharded message (SPUBLISH), whose channel hashes to the request's slot
// like the record and the wake list, so a script stays in one slot on a
// Cluster; where SPUBLISH is unknown (Redis 6, miniredis) it falls back to
// PUBLISH. It returns which one it used; the hub asks the same function
// (probeScript) so it subscribes the way the scripts publish.
//
// It also defines snapshot(rec), the message those scripts publish: the
// record's fields as the script leaves them, read in the same script that
// pushes the wake-up, so the hub hands a waiter the durable record without
// reading it again (one round trip less on every wake-up). The encoding is
// "*" then, for each field and value in turn, its length in bytes, ":" and
// the bytes (decodeSnapshot): plain concatenation, no JSON in Lua. A hub
// that finds no "*" (a status, as older processes publish) reads the
// record itself.
const luaHint = `
local function hint(ch, msg)
  if pcall(redis.call, 'SPUBLISH', ch, msg) then return 'sharded' end
  redis.call('PUBLISH', ch, msg)
  return 'classic'
end
local function snapshot(rec)
  local f = redis.call('HGETALL', rec)
  local out = {'*'}
  for i = 1, #f do out[i + 1] = #f[i] .. ':' .. f[i] end
  return table.concat(out)
end
`

// luaApproved defines unapproved(rec, status, digest): nil when the
// record (whose status is status) is approved with digest digest ("" for
// any), else the reply of a transition that needs it so (claimScript,
// refuseScript, reopenScript): {'claimed', record} executing or finished,
// {'abandoned', record}, {'not_approved', record} any other status,
// {'stale', record} approved with other arguments.
const luaApproved = `
local function unapproved(rec, status, digest)
  if status == 'executing' or status == 'executed' or status == 'failed' or status == 'unknown' then
    return {'claimed', redis.call('HGETALL', rec)}
  end
  if status == 'abandoned' then return {'abandoned', redis.call('HGETALL', rec)} end
  if status ~= 'approved' then return {'not_approved', redis.call('HGETALL', rec)} end
  if digest ~= '' and redis.call('HGET', rec, 'digest') ~= digest then return {'stale', redis.call('HGETALL', rec)} end
  return nil
end
`

// luaSeal defines sealed(rec, decision): the clock's decision JSON at the
// end of a cancel window (Go-encoded with "digest":"") with the record's
// digest put in, by plain string replacement (no JSON in Lua): the clock
// saw no card, so it binds the call to the arguments the request holds as
// its window ends, and the claim's judgement refuses any other.
const luaSeal = `
local function sealed(rec, decision)
  local d = redis.call('HGET', rec, 'digest') or ''
  return (string.gsub(decision, '"digest":""', function() return '"digest":"' .. d .. '"' end, 1))
end
`

// luaBound defines bound(rec): whether the record's card is bound to a
// posted message (bindCardScript). A cancel window whose card was never
// posted (the process stopped between saving the request and posting its
// card) gave nobody the chance to cancel: at its end the request expires
// (fail closed) instead of running.
const luaBound = `
local function bound(rec)
  local c = redis.call('HGET', rec, 'card')
  return c ~= false and c ~= '' and c ~= '{}'
end
`

// newOp returns the op id of one call of a transition script (luaOp):
// random, and the same in every run go-redis makes of that call.
func newOp() string { return approval.NewID("op") }

// reply is a decoded script reply: a code and, for most codes, the record
// as it is after the script ran: a field/value array (HGETALL), or, from
// decideScript (every decision), the one string of luaHint's snapshot,
// which costs the reader one allocation instead of two per field, and
// whose fields are read straight from that string (snapshotFields), with
// no map between.
type reply struct {
	code   string
	extra  string            // a third element, when the script gives one (decideScript: "1" when it indexed the claim window)
	fields map[string]string // the record from a field/value array; nil otherwise
	snap   recordFields      // the record from a snapshot, when isSnap
	isSnap bool
}

// hasRecord reports whether the reply carries the record.
func (r reply) hasRecord() bool { return r.fields != nil || r.isSnap }

// record decodes the record the reply carries.
func (r reply) record() (*approval.Request, error) {
	if r.isSnap {
		return decodeFields(r.snap)
	}
	return decodeRecord(r.fields)
}

// status is the status field of the record the reply carries.
func (r reply) status() string {
	if r.isSnap {
		return r.snap.status
	}
	return r.fields[fStatus]
}

// run runs a script that replies {code[, {field, value, ...}]}.
func run(ctx context.Context, rdb redis.Scripter, s *redis.Script, keys []string, args ...any) (reply, error) {
	return parseReply(s.Run(ctx, rdb, keys, args...).Result())
}

// parseReply decodes a script's reply v (err: the command's error), as
// run does; for a script sent in a pipeline.
func parseReply(v any, err error) (reply, error) {
	if err != nil {
		return reply{}, err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return reply{}, fmt.Errorf("unexpected script reply %T", v)
	}
	code, ok := arr[0].(string)
	if !ok {
		return reply{}, fmt.Errorf("unexpected script reply code %T", arr[0])
	}
	r := reply{code: code}
	if len(arr) > 2 {
		r.extra, _ = arr[2].(string)
	}
	if len(arr) > 1 {
		if snap, ok := arr[1].(string); ok {
			// The record as one string (snapshot in luaHint): one
			// allocation to read instead of two per field.
			if r.snap, r.isSnap = snapshotFields(snap); !r.isSnap {
				return reply{}, fmt.Errorf("unexpected script record %.20q", snap)
			}
			return r, nil
		}
		flat, ok := arr[1].([]any)
		if !ok || len(flat)%2 != 0 {
			return reply{}, fmt.Errorf("unexpected script record %T", arr[1])
		}
		r.fields = make(map[string]string, len(flat)/2)
		for i := 0; i < len(flat); i += 2 {
			k, ok1 := flat[i].(string)
			val, ok2 := flat[i+1].(string)
			if !ok1 || !ok2 {
				return reply{}, fmt.Errorf("unexpected script record field %T=%T", flat[i], flat[i+1])
			}
			r.fields[k] = val
		}
	}
	return r, nil
}
