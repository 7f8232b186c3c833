package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
)

// DefaultAuditStream is the audit stream used when AuditOptions.Stream is
// empty. Its hash tag ("{audit}") keeps the stream and its head key in one
// Redis Cluster slot.
const DefaultAuditStream = "countersign:{audit}"

const (
	// auditMaxAttempts bounds the compare-and-set retries of one Append. A
	// failed attempt means another writer advanced the chain, so the system as
	// a whole always makes progress; only a writer that keeps losing to other
	// processes sees this limit.
	auditMaxAttempts = 1000
	// auditClaimAfter is how many lost compare-and-sets in a row make a
	// writer claim the next append (appendScript).
	auditClaimAfter = 3
	// auditClaimTTL bounds how long a claim lasts if its writer never comes
	// back; others wait auditClaimWait between looks while it is held.
	auditClaimTTL  = 250 * time.Millisecond
	auditClaimWait = time.Millisecond
	// auditVerifyPage is how many entries Verify reads per XRANGE.
	auditVerifyPage = 1000
	// auditDefaultCount is the page size of Range and RevRange when the
	// caller passes count <= 0.
	auditDefaultCount = 100
	// auditFollowBlock is how long one XREAD in Follow blocks before it
	// checks ctx again: Ctrl-C ends `audit tail -f` within it. Four
	// XREADs a second per follower cost Redis nothing.
	auditFollowBlock = 250 * time.Millisecond
)

// AuditOptions configures an Audit.
type AuditOptions struct {
	// Stream is the Redis Stream key; default DefaultAuditStream. The chain
	// head lives at Stream+":head" when Stream has a Cluster hash tag and at
	// "{"+Stream+"}:head" otherwise, so both are always in one slot.
	Stream string
	// Now is the clock that stamps entries; default time.Now.
	Now func() time.Time
	// MaxLen, when > 0, trims the stream to about MaxLen entries on append
	// (XADD MAXLEN ~). Verify then accepts a stream that starts part-way
	// through the chain. 0 keeps every entry.
	MaxLen int64
	// Logger receives compare-and-set retries (debug) and heavy contention
	// (warn); default discards.
	Logger *slog.Logger
	// Wakes, when set, is the store whose wake-ups AppendWake pushes in
	// the same round trip as the entry they follow (same Redis client).
	Wakes *Store
	// Observer, when set, is told of every entry this Audit wrote and of
	// every append that failed, after the fact (the metrics): nothing on
	// the way to Redis waits for it.
	Observer AuditObserver
}

// AuditObserver watches what an Audit writes (AuditOptions.Observer). Its
// methods must return at once.
type AuditObserver interface {
	// Appended is told of an entry written to the stream.
	Appended(e approval.Entry)
	// Failed is told of an append of event ev that failed (it may or may
	// not be in the stream).
	Failed(ev approval.Event)
}

// Audit is the tamper-evident audit log: a Redis Stream whose entries are
// chained by hash (approval.Entry, approval.ChainHash). Appends from any
// number of goroutines and processes form one unbroken chain: each append
// is a compare-and-set on the chain head in one Lua script.
//
// An Audit is safe for concurrent use.
type Audit struct {
	rdb      redis.UniversalClient
	stream   string
	head     string
	claimKey string // appendScript's claim: who appends next after losing often
	// beforeAttempt, set by tests only, runs before each compare-and-set
	// of an Append (the attempt number, from 1).
	beforeAttempt func(attempt int)
	// afterQueued, set by tests only, runs once an append's entries are
	// queued for a group commit.
	afterQueued func()
	now         func() time.Time
	maxLen      int64
	log         *slog.Logger
	wakes       *Store // AuditOptions.Wakes
	observer    AuditObserver

	// turn serialises appends within this process (a one-slot semaphore, so
	// waiting honours ctx): in-process writers then never lose a
	// compare-and-set to each other, only to other processes.
	turn chan struct{}
	// last is this process's view of the chain head ("" = not known yet;
	// the first script call returns the real head). Guarded by turn.
	last chainHead
	// args holds writeChained's script arguments, kept for the next group
	// commit (a check's largest allocation but one). Guarded by turn.
	args []any
	// queue holds the entries waiting for the next group commit
	// (auditbatch.go), oldest first. Guarded by qmu.
	qmu   sync.Mutex
	queue []*queued
}

// chainHead is the newest entry's seq and hash.
type chainHead struct {
	seq  int64
	hash string
}

// token is the head as the script compares it: "<seq>:<hash>", or "" for
// an empty chain.
func (h chainHead) token() string {
	if h.seq == 0 && h.hash == "" {
		return ""
	}
	return strconv.FormatInt(h.seq, 10) + ":" + h.hash
}

func parseHeadToken(s string) (chainHead, error) {
	if s == "" {
		return chainHead{}, nil
	}
	seqStr, hash, ok := strings.Cut(s, ":")
	seq, err := strconv.ParseInt(seqStr, 10, 64)
	if !ok || err != nil || seq < 1 || hash == "" {
		return chainHead{}, fmt.Errorf("malformed audit chain head %q", s)
	}
	return chainHead{seq: seq, hash: hash}, nil
}

// NewAudit returns an Audit over rdb. It does not touch Redis.
func NewAudit(rdb redis.UniversalClient, opts AuditOptions) *Audit {
	a := &Audit{
		rdb:      rdb,
		stream:   opts.Stream,
		now:      opts.Now,
		maxLen:   opts.MaxLen,
		log:      opts.Logger,
		wakes:    opts.Wakes,
		observer: opts.Observer,
		turn:     make(chan struct{}, 1),
	}
	a.stream = cmp.Or(a.stream, DefaultAuditStream)
	a.now = option.FuncOr(a.now, time.Now)
	a.log = cmp.Or(a.log, slog.New(slog.DiscardHandler))
	a.head = auditHeadKey(a.stream)
	a.claimKey = a.head + ":claim" // the head's hash tag: the same slot
	return a
}

// auditHeadKey returns the key holding the chain head of stream, in the
// same Cluster slot as stream.
func auditHeadKey(stream string) string {
	if hasHashTag(stream) {
		return stream + ":head"
	}
	return "{" + stream + "}:head"
}

// hasHashTag reports whether Redis Cluster hashes key by a {tag}: a '{'
// followed later by a '}' with at least one byte between them.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(key[i+1:], '}')
	return j > 0
}

// Stream returns the stream key (for operators and the CLI).
func (a *Audit) Stream() string { return a.stream }

// appendScript appends one entry if the chain head is still what the
// caller built the entry on.
//
//	KEYS[1]   stream
//	KEYS[2]   head (hash: seq, hash, id, op, trimmed)
//	KEYS[3]   claim (the writer that kept losing and appends next)
//	ARGV[1]   expected head token ("" for an empty chain)
//	ARGV[2]   new seq
//	ARGV[3]   new hash
//	ARGV[4]   MAXLEN (0 = keep all)
//	ARGV[5]   the op id of this call (newOp)
//	ARGV[6]   the writer (one Append call, all its attempts)
//	ARGV[7]   "1" when this writer has lost often enough to claim the next
//	          append
//	ARGV[8..] field, value, ... for XADD
//
// Reply: {1, id} on success, {0, current head token} when another writer
// advanced the chain, {2, current head token} when another writer has
// claimed the next append. A missing head key (never written, or deleted)
// is recovered from the stream's last entry, so the chain continues.
//
// The claim keeps a writer from starving: a busy process appends back to
// back with the head it already knows, and can win every race for as long
// as it has entries queued, while a quieter process needs a round trip to
// learn each new head. A writer that lost auditClaimAfter times in a row
// claims the next append when nobody has (for auditClaimTTL at most: a
// writer that dies holding the claim delays the others that long, no
// more); the others wait until it has appended, which its very next
// attempt does.
//
// A head written by this very call (its op id, ARGV[5]) means the entry is
// already written: go-redis ran the script again after the first run's
// reply missed ReadTimeout. The script answers {1, id} of that entry
// instead of reporting a moved head, which would make Append write the
// entry a second time on top of itself. The op id, not the entry's hash,
// tells: two writers may build identical entries (same content, same
// nanosecond) and each must be written.
var appendScript = redis.NewScript(luaChainAppend + `
return chainAppend(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], 8, nil, nil)
`)

// batchAppendScript appends several entries, chained one on the other,
// if the chain head is still what the caller built the first on: one
// group commit of the entries that waited for this process's turn
// (Audit.appendEntries).
//
//	KEYS[1]   stream
//	KEYS[2]   head (hash: seq, hash, id, op, trimmed)
//	KEYS[3]   claim (the writer that kept losing and appends next)
//	ARGV[1]   expected head token ("" for an empty chain)
//	ARGV[2]   the last entry's seq
//	ARGV[3]   the last entry's hash
//	ARGV[4]   MAXLEN (0 = keep all)
//	ARGV[5]   the op id of this call (newOp)
//	ARGV[6]   the writer (one group commit, all its attempts)
//	ARGV[7]   "1" when this writer has lost often enough to claim the next
//	          append
//	ARGV[8]   the number of entries
//	ARGV[9..] each entry: its count of field and value arguments, then
//	          field, value, ... for its XADD
//
// Reply: {1, id, id, ...} (one stream ID per entry, in order) on success;
// otherwise appendScript's. A head written by this very call (a run again
// by go-redis) answers the IDs of the entries it wrote, which are the
// stream's last: nothing can follow them without moving the head.
var batchAppendScript = redis.NewScript(luaChainAppend + `
return chainAppend(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], 9, nil, tonumber(ARGV[8]))
`)

// absentAppendScript is batchAppendScript made conditional on keys that
// must not exist (Ledger.AppendNew: the record of a request, for
// the entries of a call settled without one, which a retry of a call
// that has a request must not get). Nothing is written while any exists:
// the reply is then {4, k}, KEYS[3+k] the first that does. Only where one
// script may touch the chain and those keys: a single node, not a
// Cluster (other slots).
//
//	KEYS[1]   stream
//	KEYS[2]   head (hash: seq, hash, id, op, trimmed)
//	KEYS[3]   claim (the writer that kept losing and appends next)
//	KEYS[4..] the keys that must not exist
//	ARGV[1]   expected head token ("" for an empty chain)
//	ARGV[2]   the last entry's seq
//	ARGV[3]   the last entry's hash
//	ARGV[4]   MAXLEN (0 = keep all)
//	ARGV[5]   the op id of this call (newOp)
//	ARGV[6]   the writer (one group commit, all its attempts)
//	ARGV[7]   "1" when this writer has lost often enough to claim the next
//	          append
//	ARGV[8]   the number of entries
//	ARGV[9..] each entry: its count of field and value arguments, then
//	          field, value, ... for its XADD
//
// Reply: batchAppendScript's, or {4, k}. A run again by go-redis of a
// call that wrote answers what it wrote, whatever exists since.
var absentAppendScript = redis.NewScript(luaChainAppend + `
local taken = 0
local function guard()
  for i = 4, #KEYS do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      taken = i - 3
      return false
    end
  end
  return true
end
local res = chainAppend(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], 9, guard, tonumber(ARGV[8]))
if taken > 0 then
  return {4, taken}
end
return res
`)

// luaChainAppend defines chainAppend, the body of appendScript and
// guardedAppendScript (their tables say what each argument is): the XADD
// fields are ARGV[first..]; guard, when not nil, runs once a replay has
// been ruled out and before anything is written, and nothing is written
// ({3, ”}) unless it returns true.
var luaChainAppend = strings.ReplaceAll(`
local function chainAppend(stream, head, claimKey, expected, seq, hash, maxlenArg, op, writer, askClaim, first, guard, count)
  local cur, curID, curOp = '', false, false
  local h = redis.call('HMGET', head, 'seq', 'hash', 'id', 'op')
  if h[1] and h[2] then
    cur, curID, curOp = h[1] .. ':' .. h[2], h[3], h[4]
  else
    local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    if #last > 0 then
      local f = last[1][2]
      local lseq, lhash
      for i = 1, #f, 2 do
        if f[i] == 'seq' then lseq = f[i+1] elseif f[i] == 'hash' then lhash = f[i+1] end
      end
      if lseq and lhash then cur, curID = lseq .. ':' .. lhash, last[1][1] end
    end
  end
  if curOp == op and cur == seq .. ':' .. hash and curID then
    if not count then
      return {1, curID}
    end
    local mine = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', count)
    local ids = {1}
    for i = #mine, 1, -1 do
      table.insert(ids, mine[i][1])
    end
    return ids
  end
  if guard and not guard() then
    return {3, ''}
  end
  local claim = redis.call('GET', claimKey)
  if claim and claim ~= writer then
    return {2, cur}
  end
  if cur ~= expected then
    if askClaim == '1' and not claim then
      redis.call('SET', claimKey, writer, 'PX', '__CLAIM_TTL__')
    end
    return {0, cur}
  end
  local maxlen = tonumber(maxlenArg)
  local function xadd(from, to)
    -- The fields straight from ARGV (unpack's range): no table built.
    if maxlen > 0 then
      return redis.call('XADD', stream, 'MAXLEN', '~', maxlenArg, '*', unpack(ARGV, from, to))
    end
    return redis.call('XADD', stream, '*', unpack(ARGV, from, to))
  end
  local id
  local ids = {1}
  if count then
    local i = first
    for _ = 1, count do
      local n = tonumber(ARGV[i])
      id = xadd(i + 1, i + n)
      table.insert(ids, id)
      i = i + n + 1
    end
  else
    id = xadd(first, #ARGV)
    table.insert(ids, id)
  end
  redis.call('HSET', head, 'seq', seq, 'hash', hash, 'id', id, 'op', op)
  if maxlen > 0 then
    redis.call('HSET', head, 'trimmed', '1')
  end
  if claim then
    redis.call('DEL', claimKey)
  end
  return ids
end
`, "__CLAIM_TTL__", strconv.FormatInt(auditClaimTTL.Milliseconds(), 10))

// Append redacts r.Data (r.Secret names and token shapes, see
// approval.Redact), cuts its long strings (approval.BoundData), chains the
// entry to the current head and adds it to the stream. It returns the stored entry with its stream ID. An error means
// the entry may not have been written; ctx cancellation is honoured while
// waiting for this process's turn.
func (a *Audit) Append(ctx context.Context, r approval.Record) (approval.Entry, error) {
	e, _, err := a.append(ctx, r, nil)
	return e, err
}

// AppendWake is Append, then the wake-up of request id, which became
// final with status st (Store.Wake), in the same round trip: each attempt
// sends the append and, behind it on the same connection, the wake-up,
// which Redis pushes only if that very append wrote the chain head
// (wakeScript), so the wake-up never precedes the entry (record → audit →
// wake-up). woke reports whether it was pushed; when not (no
// AuditOptions.Wakes or one on another client, a Cluster, where the stream and the request are in
// different slots, Options.WaitReplicas, another process's entry landing
// in between, an error) the caller pushes it with Store.Wake. The error is
// Append's.
func (a *Audit) AppendWake(ctx context.Context, r approval.Record, id string, st approval.Status) (e approval.Entry, woke bool, err error) {
	if a.wakes == nil || a.wakes.rdb != a.rdb || !a.wakes.wakesWith() {
		e, err = a.Append(ctx, r)
		return e, false, err
	}
	return a.append(ctx, r, func(p redis.Pipeliner, op string) func() bool {
		return a.wakes.wakeAfter(ctx, p, a.head, op, id, st)
	})
}

// then queues, behind an append attempt whose op id is op, what must
// follow the entry (AppendWake); the function it returns reports, once
// the pipeline ran, whether that took effect.
type then func(p redis.Pipeliner, op string) func() bool

// append is Append, with after (when not nil) sent behind each attempt
// in one pipeline; followed reports whether after took effect with the
// attempt that wrote the entry.
func (a *Audit) append(ctx context.Context, r approval.Record, after then) (e approval.Entry, followed bool, err error) {
	e, followed, err = a.appendChained(ctx, r, after)
	if a.observer != nil {
		if err != nil {
			a.observer.Failed(r.Event)
		} else {
			a.observer.Appended(e)
		}
	}
	return e, followed, err
}

// appendChained is append, unobserved. An entry with nothing to follow
// it joins the next group commit (appendEntries); one with after is
// written alone, with after behind it.
func (a *Audit) appendChained(ctx context.Context, r approval.Record, after then) (e approval.Entry, followed bool, err error) {
	if e, err = newEntry(r); err != nil {
		return approval.Entry{}, false, err
	}
	if after == nil {
		es := []approval.Entry{e}
		if err := a.appendEntries(ctx, es, ""); err != nil {
			return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, err)
		}
		return es[0], false, nil
	}
	select {
	case a.turn <- struct{}{}:
	case <-ctx.Done():
		return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, ctx.Err())
	}
	defer func() { <-a.turn }()

	writer, lost := newOp(), 0
	for attempt := 1; attempt <= auditMaxAttempts; attempt++ {
		if a.beforeAttempt != nil {
			a.beforeAttempt(attempt)
		}
		prev := a.stamp(&e)

		askClaim := "0"
		if lost >= auditClaimAfter {
			askClaim = "1"
		}
		op := newOp()
		keys := []string{a.stream, a.head, a.claimKey}
		args := make([]any, 0, 7+entryFieldsMax) // one slice for the script's arguments and the entry's fields
		args = append(args, prev.token(), e.Seq, e.Hash, a.maxLen, op, writer, askClaim)
		args = appendEntryFields(args, e)
		var cmd *redis.Cmd
		var took func() bool
		_, _ = a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmd = appendScript.EvalSha(ctx, p, keys, args...)
			took = after(p, op)
			return nil
		})
		res, err := cmd.Slice()
		followed = took()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// Not loaded yet: nothing was written, and what followed
			// found the head not written by op. Run it alone (which
			// loads it); the caller does what followed itself.
			res, err = appendScript.Run(ctx, a.rdb, keys, args...).Slice()
			followed = false
		}
		if err != nil {
			return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, err)
		}
		outcome, val, err := parseAppendReply(res)
		if err != nil {
			return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, err)
		}
		if outcome == appendDone {
			e.ID = val
			a.last = chainHead{seq: e.Seq, hash: e.Hash}
			if attempt > 10 {
				a.log.Warn("audit append contended", "stream", a.stream, "attempts", attempt, "seq", e.Seq)
			}
			return e, followed, nil
		}
		followed = false // nothing follows an entry not written
		// Not written: rebuild on the current head, which the reply carries.
		head, err := parseHeadToken(val)
		if err != nil {
			return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, err)
		}
		a.last = head
		if outcome == appendClaimed {
			// Another writer that kept losing appends next: let it.
			if err := clock.Sleep(ctx, auditClaimWait); err != nil {
				return approval.Entry{}, false, fmt.Errorf("audit append %s: %w", r.Event, err)
			}
			continue
		}
		// Another writer advanced the chain: retry at once.
		a.log.Debug("audit chain head moved, retrying", "stream", a.stream, "attempt", attempt, "head_seq", head.seq)
		lost++
	}
	return approval.Entry{}, false, fmt.Errorf("audit append %s: chain head kept moving after %d attempts", r.Event, auditMaxAttempts)
}

// newEntry is the entry of r before it is chained. The single-line fields
// may come from a payload (a refused click's actor and request id): each
// is clipped, so garbage cannot grow the stream; the data is redacted,
// then every string in it is bounded (approval.BoundData).
func newEntry(r approval.Record) (approval.Entry, error) {
	if r.Event == "" {
		return approval.Entry{}, errors.New("audit append: record has no event")
	}
	return approval.Entry{
		Event:     r.Event,
		RequestID: clip.Bytes(r.RequestID, approval.MaxField),
		RunID:     clip.Bytes(r.RunID, approval.MaxField),
		Actor:     clip.Bytes(r.Actor, approval.MaxField),
		Tool:      clip.Bytes(r.Tool, approval.MaxField),
		Data:      approval.BoundData(approval.Redact(r.Data, r.Secret)),
		TraceID:   r.TraceID,
	}, nil
}

// stamp chains e to the head this process knows (a.last, which it
// returns): its seq, previous hash, time and hash. Stamped per attempt so
// that, within one process, time never goes backwards along the chain.
// Round(0) drops the monotonic reading. The caller holds a.turn.
func (a *Audit) stamp(e *approval.Entry) chainHead {
	prev := a.last
	e.Seq = prev.seq + 1
	e.PrevHash = prev.hash
	e.Time = a.now().Round(0).UTC()
	e.Hash = approval.ChainHash(e.PrevHash, *e)
	return prev
}

// appendScript's outcomes (the first element of its reply).
const (
	appendMoved   int64 = 0 // another writer advanced the chain
	appendDone    int64 = 1 // written (or written already by this call)
	appendClaimed int64 = 2 // another writer claimed the next append
	appendGuarded int64 = 3 // guardedAppendScript's guard did not hold: nothing written
	appendTaken   int64 = 4 // absentAppendScript: a key that had to be absent exists
)

func parseAppendReply(res []any) (outcome int64, val string, err error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("unexpected script reply %v", res)
	}
	flag, ok1 := res[0].(int64)
	val, ok2 := res[1].(string)
	if !ok1 || !ok2 || flag < appendMoved || flag > appendGuarded {
		return 0, "", fmt.Errorf("unexpected script reply %v", res)
	}
	return flag, val, nil
}

// Stream entry field names. Every field is always written, empty or not,
// except trace_id: written only when the entry has a trace id (entries
// from before trace ids existed have none).
const (
	fieldSeq       = "seq"
	fieldTime      = "time"
	fieldEvent     = "event"
	fieldRequestID = "request_id"
	fieldRunID     = "run_id"
	fieldActor     = "actor"
	fieldTool      = "tool"
	fieldData      = "data"
	fieldTraceID   = "trace_id"
	fieldPrevHash  = "prev_hash"
	fieldHash      = "hash"
)

// entryFieldsMax is the most values appendEntryFields appends: eleven
// fields and their values.
const entryFieldsMax = 22

// appendEntryFields appends e's stream fields and values (for XADD) to f.
func appendEntryFields(f []any, e approval.Entry) []any {
	f = append(f,
		fieldSeq, strconv.FormatInt(e.Seq, 10),
		fieldTime, e.Time.UTC().Format(time.RFC3339Nano),
		fieldEvent, string(e.Event),
		fieldRequestID, e.RequestID,
		fieldRunID, e.RunID,
		fieldActor, e.Actor,
		fieldTool, e.Tool,
		fieldData, []byte(e.Data), // written as the same bulk string, without a copy
		fieldPrevHash, e.PrevHash,
		fieldHash, e.Hash,
	)
	if e.TraceID != "" {
		f = append(f, fieldTraceID, e.TraceID)
	}
	return f
}

// parseEntry turns a stream message back into the entry that was hashed.
func parseEntry(m redis.XMessage) (approval.Entry, error) {
	str := func(k string) string {
		s, _ := m.Values[k].(string)
		return s
	}
	e := approval.Entry{
		ID:        m.ID,
		Event:     approval.Event(str(fieldEvent)),
		RequestID: str(fieldRequestID),
		RunID:     str(fieldRunID),
		Actor:     str(fieldActor),
		Tool:      str(fieldTool),
		TraceID:   str(fieldTraceID),
		PrevHash:  str(fieldPrevHash),
		Hash:      str(fieldHash),
	}
	if d := str(fieldData); d != "" {
		e.Data = []byte(d)
	}
	seq, err := strconv.ParseInt(str(fieldSeq), 10, 64)
	if err != nil {
		return e, fmt.Errorf("audit entry %s: bad seq %q", m.ID, str(fieldSeq))
	}
	e.Seq = seq
	t, err := time.Parse(time.RFC3339Nano, str(fieldTime))
	if err != nil {
		return e, fmt.Errorf("audit entry %s: bad time %q", m.ID, str(fieldTime))
	}
	e.Time = t.UTC()
	return e, nil
}

func parseEntries(msgs []redis.XMessage) ([]approval.Entry, error) {
	out := make([]approval.Entry, 0, len(msgs))
	for _, m := range msgs {
		e, err := parseEntry(m)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Range returns up to count entries after the stream ID afterID, oldest
// first; afterID "" (or "-") starts at the beginning. Pass the last ID of
// one page as afterID of the next. count <= 0 means 100. An entry that
// cannot be parsed is an error (Verify reports it as a chain break instead).
func (a *Audit) Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error) {
	msgs, err := a.xrange(ctx, afterID, count)
	if err != nil {
		return nil, err
	}
	return parseEntries(msgs)
}

func (a *Audit) xrange(ctx context.Context, afterID string, count int64) ([]redis.XMessage, error) {
	count = option.PositiveOr(count, auditDefaultCount)
	start := "-"
	if afterID != "" && afterID != "-" {
		start = "(" + afterID
	}
	msgs, err := a.rdb.XRangeN(ctx, a.stream, start, "+", count).Result()
	if err != nil {
		return nil, fmt.Errorf("audit range after %q: %w", afterID, err)
	}
	return msgs, nil
}

// RevRange returns up to count entries before the stream ID beforeID,
// newest first; beforeID "" (or "+") starts at the newest entry. Pass the
// last ID of one page as beforeID of the next. count <= 0 means 100.
func (a *Audit) RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error) {
	count = option.PositiveOr(count, auditDefaultCount)
	end := "+"
	if beforeID != "" && beforeID != "+" {
		end = "(" + beforeID
	}
	msgs, err := a.rdb.XRevRangeN(ctx, a.stream, end, "-", count).Result()
	if err != nil {
		return nil, fmt.Errorf("audit reverse range before %q: %w", beforeID, err)
	}
	return parseEntries(msgs)
}

// Verify reads the whole stream, oldest first, one page at a time, and
// checks the hash chain with approval.ChainVerifier. It returns how many
// entries were found intact: all of them and a nil error when the chain is
// unbroken (an empty stream is intact with 0), or the number before the
// break and a *approval.ChainError naming the first bad position. Any other
// error means Redis failed and nothing is known.
//
// Beyond the chain itself, Verify compares the stream with the head key:
// a stream that was never trimmed (AuditOptions.MaxLen) must start at seq
// 1, and the chain must reach the head recorded when Verify began, so
// deleting the first or the last entries is detected too. Appends that run
// during Verify are checked as far as it reads.
func (a *Audit) Verify(ctx context.Context) (int, error) {
	head, trimmed, headKnown, err := a.readHead(ctx)
	if err != nil {
		return 0, err
	}
	var (
		v      approval.ChainVerifier
		after  string
		last   approval.Entry
		sawAny bool
	)
	for {
		msgs, err := a.xrange(ctx, after, auditVerifyPage)
		if err != nil {
			return v.Checked(), err
		}
		for _, m := range msgs {
			idx := v.Checked()
			e, perr := parseEntry(m)
			if perr != nil {
				return idx, &approval.ChainError{Index: idx, ID: m.ID, Seq: e.Seq, Why: "malformed entry: " + perr.Error()}
			}
			if idx == 0 && e.Seq != 1 && headKnown && !trimmed {
				return 0, &approval.ChainError{Index: 0, ID: e.ID, Seq: e.Seq,
					Why: fmt.Sprintf("stream starts at seq %d but was never trimmed (entries deleted)", e.Seq)}
			}
			if err := v.Next(e); err != nil {
				return idx, err
			}
			if headKnown && e.Seq == head.seq && e.Hash != head.hash {
				return idx, &approval.ChainError{Index: idx, ID: e.ID, Seq: e.Seq,
					Why: "hash differs from the recorded chain head (chain rewritten)"}
			}
			last, sawAny = e, true
		}
		if int64(len(msgs)) < auditVerifyPage {
			break
		}
		after = msgs[len(msgs)-1].ID
	}
	if headKnown && (!sawAny || last.Seq < head.seq) {
		ce := &approval.ChainError{Index: v.Checked(), Seq: head.seq,
			Why: fmt.Sprintf("chain head is at seq %d but the stream ends", head.seq)}
		if sawAny {
			ce.Why += fmt.Sprintf(" at seq %d (last entries deleted)", last.Seq)
		} else {
			ce.Why += " empty (entries deleted)"
		}
		return v.Checked(), ce
	}
	return v.Checked(), nil
}

// readHead returns the chain head and whether the stream was ever trimmed.
// known is false when no head key exists (no append yet, or it was lost).
func (a *Audit) readHead(ctx context.Context) (head chainHead, trimmed, known bool, err error) {
	vals, err := a.rdb.HGetAll(ctx, a.head).Result()
	if err != nil {
		return chainHead{}, false, false, fmt.Errorf("audit read head: %w", err)
	}
	if len(vals) == 0 {
		return chainHead{}, false, false, nil
	}
	head, err = parseHeadToken(vals["seq"] + ":" + vals["hash"])
	if err != nil {
		return chainHead{}, false, false, fmt.Errorf("audit read head: %w", err)
	}
	return head, vals["trimmed"] == "1", true, nil
}

// Follow calls fn for each entry after the stream ID afterID, in order, as
// they are appended, until ctx is done (it then returns ctx.Err()) or fn
// returns an error (returned as is). afterID "" means entries appended from
// now on. Each XREAD blocks for at most auditFollowBlock (250 ms), so ctx
// is honoured within a quarter of a second.
func (a *Audit) Follow(ctx context.Context, afterID string, fn func(approval.Entry) error) error {
	if afterID == "" {
		// Resolve "now" to a concrete ID: re-reading with "$" on every round
		// would miss entries added between two rounds.
		msgs, err := a.rdb.XRevRangeN(ctx, a.stream, "+", "-", 1).Result()
		if err != nil {
			return fmt.Errorf("audit follow: %w", err)
		}
		afterID = "0-0"
		if len(msgs) > 0 {
			afterID = msgs[0].ID
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		streams, err := a.rdb.XRead(ctx, &redis.XReadArgs{
			Streams: []string{a.stream, afterID},
			Count:   auditDefaultCount,
			Block:   auditFollowBlock,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue // nothing new within the block time
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			return fmt.Errorf("audit follow after %s: %w", afterID, err)
		}
		for _, s := range streams {
			for _, m := range s.Messages {
				e, err := parseEntry(m)
				if err != nil {
					return fmt.Errorf("audit follow: %w", err)
				}
				if err := fn(e); err != nil {
					return err
				}
				afterID = m.ID
			}
		}
	}
}
