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
)

// createScript writes a new record unless one exists.
// KEYS[1] record; ARGV[1] the op id (luaOp), ARGV[2..] field/value pairs.
// Reply: 1 created, 0 exists. A record this very call wrote (go-redis ran
// the script again after a read timeout) counts as created.
var createScript = redis.NewScript(luaOp + `
if redis.call('EXISTS', KEYS[1]) == 1 then
  if replayed(KEYS[1], ARGV[1]) then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
done(KEYS[1], ARGV[1], 'ok')
return 1
`)

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

// wakeScript pushes the wake-up of a final transition recorded without one
// (Store.wake): the wake list element, its TTL and the hint, which carries
// the record (snapshot).
// KEYS[1] wake list, KEYS[2] record. ARGV[1] status, ARGV[2] wake list TTL
// (seconds), ARGV[3] "1" to first check that the record here is final
// (Options.WaitReplicas: the WAIT that follows must cover the decision, and
// after a failover the primary this connection reaches may not have it;
// a record that vanished is final only as "lost"): 0, nothing pushed, when
// it is not. ARGV[4] the hint channel (keys.channel).
var wakeScript = redis.NewScript(luaHint + `
if ARGV[3] == '1' then
  local st = redis.call('HGET', KEYS[2], 'status')
  if st == 'pending' or (not st and ARGV[1] ~= 'lost') then return 0 end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
hint(ARGV[4], snapshot(KEYS[2]))
return 1
`)

// probeScript reports how hint publishes on this server: "sharded" or
// "classic". KEYS[1] a channel nobody listens on.
var probeScript = redis.NewScript(luaHint + `
return hint(KEYS[1], '')
`)

// decideScript records one human decision. See Store.RecordDecision.
//
//	KEYS[1]   record
//	KEYS[2]   wake list
//	ARGV[1]   verdict
//	ARGV[2]   approver
//	ARGV[3]   at (unix ms)
//	ARGV[4]   digest the approver saw
//	ARGV[5]   the decision JSON to store
//	ARGV[6]   the expiry decision JSON (used if the deadline passed)
//	ARGV[7]   edited args (edit only)
//	ARGV[8]   digest of the edited args (edit only)
//	ARGV[9]   wake list TTL (seconds)
//	ARGV[10]  "1" to leave the wake-up to the caller (Store.RecordDecision:
//	          the lifecycle owner pushes it with Store.Wake after auditing)
//	ARGV[11]  the window-elapsed decision JSON (used if a cancel window ended)
//	ARGV[12]  the op id (luaOp)
//	ARGV[13]  the retention TTL (ms, "" to keep forever) set on the record
//	          when it ends rejected, responded or expired (nothing more will
//	          happen to it) — in the script, so recording a decision is one
//	          round trip; the pending and deadline indexes are global keys
//	          (another slot on a Cluster) and are cleaned up with the
//	          wake-up (Store.wake)
//	ARGV[14]  the approvals the edited call needs (edit only: its judgement,
//	          approval.Decision.Quorum): the record's quorum is raised to
//	          it, never lowered, in the same script that counts the edit as
//	          one approval, so no decision can slip between the two
//	ARGV[15]  the hint channel (keys.channel)
//
// The record in the reply is its snapshot (luaHint): the one the hint
// carried when the script woke the waiters.
//
// Under mode "after" the deadline is the end of the cancel window: a
// decision at or after it finds the call approved by the clock (elapsed),
// and the verdicts are cancel (rejected) and run_now (approved).
var decideScript = redis.NewScript(luaHint + luaBound + luaOp + `
local rec, wake, op = KEYS[1], KEYS[2], ARGV[12]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, snapshot(rec)} end
if status ~= 'pending' then return {'decided', snapshot(rec)} end

-- snap: the record as the hint carried it, which is also the reply (the
-- op field done adds after it is read by nobody).
local snap
local function final(st, decision)
  redis.call('HSET', rec, 'status', st, 'decision', decision)
  if st ~= 'approved' and ARGV[13] ~= '' then redis.call('PEXPIRE', rec, ARGV[13]) end
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
  if redis.call('HGET', rec, 'mode') == 'after' and bound(rec) then
    final('approved', ARGV[11])
    return {done(rec, op, 'elapsed'), snap or snapshot(rec)}
  end
  final('expired', ARGV[6])
  return {done(rec, op, 'expired'), snap or snapshot(rec)}
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
  if votes < quorum then return {done(rec, op, 'counted'), snapshot(rec)} end
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
  if quorum > 1 then return {done(rec, op, 'edited'), snapshot(rec)} end
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
return {done(rec, op, 'ok'), snap or snapshot(rec)}
`)

// closeScript ends a pending request without a human: expiry or cancel.
// KEYS[1] record, KEYS[2] wake list. ARGV[1] "expire" or "cancel", ARGV[2]
// now (unix ms), ARGV[3] decision JSON, ARGV[4] wake list TTL (seconds),
// ARGV[5] "1" to leave the wake-up to the caller (the lifecycle owner pushes
// it with Store.Wake after auditing), ARGV[6] the window-elapsed decision
// JSON: an expiry due on a request of mode "after" approves it with that
// decision instead (its cancel window ended; the call runs), ARGV[7] the op
// id (luaOp), ARGV[8] the hint channel (keys.channel).
var closeScript = redis.NewScript(luaHint + luaBound + luaOp + `
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
  if redis.call('HGET', rec, 'mode') == 'after' and bound(rec) then st, decision = 'approved', ARGV[6] end
end
redis.call('HSET', rec, 'status', st, 'decision', decision)
if ARGV[5] ~= '1' then
  redis.call('LPUSH', wake, st)
  redis.call('EXPIRE', wake, ARGV[4])
  hint(ARGV[8], snapshot(rec))
end
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// claimScript moves an approved request to executing, once.
// KEYS[1] record. ARGV[1] owner, ARGV[2] now (unix ms), ARGV[3] the op id
// (luaOp), ARGV[4] the hex SHA-256 of the claim token ("" for none).
// Every later claim gets the record as it is (claimed, abandoned,
// not_approved), never a second executing.
var claimScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[3]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status == 'approved' then
  redis.call('HSET', rec, 'status', 'executing', 'claim_owner', ARGV[1], 'claim_at', ARGV[2])
  if ARGV[4] ~= '' then redis.call('HSET', rec, 'claim_token', ARGV[4]) end
  return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
end
if status == 'executing' or status == 'executed' or status == 'failed' or status == 'unknown' then
  return {'claimed', redis.call('HGETALL', rec)}
end
if status == 'abandoned' then return {'abandoned', redis.call('HGETALL', rec)} end
return {'not_approved', redis.call('HGETALL', rec)}
`)

// finishScript records the outcome of an executing request.
// KEYS[1] record. ARGV[1] status, ARGV[2] result, ARGV[3] now (unix ms),
// ARGV[4] the op id (luaOp).
var finishScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[4]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status ~= 'executing' then return {'not_executing', redis.call('HGETALL', rec)} end
redis.call('HSET', rec, 'status', ARGV[1], 'result', ARGV[2], 'finished_at', ARGV[3])
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// setFieldScript sets one field of an existing record.
// KEYS[1] record. ARGV[1] field, ARGV[2] value. Reply: 1 set, 0 no record.
var setFieldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// bindCardScript binds the record to its card message, once. The op id
// (luaOp) makes a run go-redis repeats answer what the first run did, so
// the binding that bound is told so exactly once.
// KEYS[1] record. ARGV[1] card JSON, ARGV[2] the op id. Reply: ok (bound
// now), same (bound already to this message), bound (to another
// message), not_found.
var bindCardScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[2]
if redis.call('EXISTS', rec) == 0 then return 'not_found' end
local prior = replayed(rec, op)
if prior then return prior end
local cur = redis.call('HGET', rec, 'card')
if cur == ARGV[1] then return 'same' end
if cur and cur ~= '' and cur ~= '{}' then return 'bound' end
redis.call('HSET', rec, 'card', ARGV[1])
return done(rec, op, 'ok')
`)

// startCardPostScript notes a card post attempt.
// KEYS[1] record. ARGV[1] now (unix ms). Reply: 1 first attempt, 0 a later
// one, -1 no record.
var startCardPostScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('HSETNX', KEYS[1], 'card_post_at', ARGV[1])
`)

// newOp returns the op id of one call of a transition script (luaOp):
// random, and the same in every run go-redis makes of that call.
func newOp() string { return approval.NewID("op") }

// reply is a decoded script reply: a code and, for most codes, the record
// as it is after the script ran: a field/value array (HGETALL), or, from
// decideScript (every decision), the one string of luaHint's snapshot,
// which costs the reader one allocation instead of two per field.
type reply struct {
	code   string
	fields map[string]string
}

// run runs a script that replies {code[, {field, value, ...}]}.
func run(ctx context.Context, rdb redis.Scripter, s *redis.Script, keys []string, args ...any) (reply, error) {
	v, err := s.Run(ctx, rdb, keys, args...).Result()
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
	if len(arr) > 1 {
		if snap, ok := arr[1].(string); ok {
			// The record as one string (snapshot in luaHint): one
			// allocation to read instead of two per field.
			if r.fields, ok = decodeSnapshot(snap); !ok {
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
