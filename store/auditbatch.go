package store

// This file: the group commit of audit entries. Entries that wait for
// this process's turn while another append is on its way to Redis are
// written together, chained one on the other, in one script call
// (batchAppendScript): at 2,000 audited calls a second the turn is no
// queue of round trips, and each round trip carries several entries.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clock"
)

const (
	// batchMaxEntries and batchMaxBytes bound one group commit: a script
	// call holds Redis for the whole of it.
	batchMaxEntries = 64
	batchMaxBytes   = 512 << 10
	// batchWriteTimeout bounds a group commit's round trips: its entries
	// are several callers', so no one caller's context ends it.
	batchWriteTimeout = 10 * time.Second
)

// queued is one caller's entries waiting for a group commit, in order.
type queued struct {
	entries []approval.Entry
	// absent, when set, is a key that must not exist for the entries to
	// be written (Ledger.AppendNew): otherwise done receives errTaken
	// and nothing of them is written.
	absent string
	// done receives the outcome once the entries were written (each with
	// its stream ID, seq, time and hashes) or not.
	done chan error
}

// AppendAll appends rs, in order and contiguous in the chain, as Append
// does each, in one round trip (with any other entries waiting for this
// process's turn). It returns the stored entries. An error means none or
// all may have been written: they are written together or not at all.
func (a *Audit) AppendAll(ctx context.Context, rs []approval.Record) ([]approval.Entry, error) {
	return a.appendAll(ctx, rs, "")
}

// errTaken: the key a group commit's entries needed absent exists, so
// they were not written.
var errTaken = errors.New("store: the key is taken")

// appendAll is AppendAll, writing rs only while key absent does not
// exist ("": whatever exists); errTaken when it does (nothing written).
func (a *Audit) appendAll(ctx context.Context, rs []approval.Record, absent string) ([]approval.Entry, error) {
	es := make([]approval.Entry, len(rs))
	for i, r := range rs {
		e, err := newEntry(r)
		if err != nil {
			return nil, err
		}
		es[i] = e
	}
	err := a.appendEntries(ctx, es, absent)
	if errors.Is(err, errTaken) {
		return nil, err // nothing written, nothing failed
	}
	if a.observer != nil {
		for i, e := range es {
			if err != nil {
				a.observer.Failed(rs[i].Event)
			} else {
				a.observer.Appended(e)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("audit append %d entries: %w", len(rs), err)
	}
	return es, nil
}

// appendEntries writes es (built by newEntry) in the next group commit,
// filling in what the chain gives each. The caller that finds the turn
// free writes what is queued then, its own entries or others' first, and
// goes on until its own are written; the others wait for their outcome.
// ctx is honoured while es wait, and while they are written alone; once
// a group commit holds them with others', their outcome is awaited
// (bounded by batchWriteTimeout).
func (a *Audit) appendEntries(ctx context.Context, es []approval.Entry, absent string) error {
	q := &queued{entries: es, absent: absent, done: make(chan error, 1)}
	a.qmu.Lock()
	a.queue = append(a.queue, q)
	a.qmu.Unlock()
	if a.afterQueued != nil {
		a.afterQueued()
	}
	for {
		select {
		case err := <-q.done:
			return err
		case a.turn <- struct{}{}:
			a.commit(ctx, q)
			<-a.turn
		case <-ctx.Done():
			if a.unqueue(q) {
				return ctx.Err()
			}
			return <-q.done // in a group commit already
		}
	}
}

// unqueue takes q out of the queue, reporting whether it was still there
// (no group commit holds it).
func (a *Audit) unqueue(q *queued) bool {
	a.qmu.Lock()
	defer a.qmu.Unlock()
	i := slices.Index(a.queue, q)
	if i < 0 {
		return false
	}
	a.queue = slices.Delete(a.queue, i, i+1)
	return true
}

// commit writes the oldest entries queued, as many as one group commit
// holds, and tells their callers; own are the entries of the caller,
// whose ctx bounds the write when they are all it holds. The caller holds
// a.turn.
func (a *Audit) commit(ctx context.Context, own *queued) {
	a.qmu.Lock()
	n, entries, size := 0, 0, 0
	for n < len(a.queue) {
		q := a.queue[n]
		b := 0
		for _, e := range q.entries {
			b += len(e.Data) + len(e.RequestID) + len(e.RunID) + len(e.Actor) + len(e.Tool) + 256
		}
		if n > 0 && (entries+len(q.entries) > batchMaxEntries || size+b > batchMaxBytes) {
			break
		}
		n, entries, size = n+1, entries+len(q.entries), size+b
	}
	batch := slices.Clone(a.queue[:n])
	a.queue = slices.Delete(a.queue, 0, n)
	a.qmu.Unlock()
	if n == 0 {
		return
	}
	mine := batch[0] == own

	wctx, cancel := ctx, context.CancelFunc(func() {})
	if n > 1 || !mine {
		// Others' entries: no one caller's context ends the write.
		wctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), batchWriteTimeout)
	}
	defer cancel()
	for len(batch) > 0 {
		es := make([]approval.Entry, 0, entries)
		for _, q := range batch {
			es = append(es, q.entries...)
		}
		taken, err := a.writeChained(wctx, es, batch)
		if err == nil && taken >= 0 {
			// One caller's key exists: its entries are not written, the
			// others' are, without them, in the next attempt.
			entries -= len(batch[taken].entries)
			batch[taken].done <- errTaken
			batch = slices.Delete(batch, taken, taken+1)
			continue
		}
		for _, q := range batch {
			if err == nil {
				es = es[copy(q.entries, es):]
			}
			q.done <- err
		}
		return
	}
}

// writeChained chains es (the entries of batch, in order) one on the
// other from the head this process knows and writes them in one script
// call, retrying on the current head when another process moved it (as
// appendChained does one entry). On success each entry has its seq,
// time, hashes and stream ID. When a queued entry's absent key exists,
// nothing is written and taken is its index in batch (else -1). The
// caller holds a.turn.
func (a *Audit) writeChained(ctx context.Context, es []approval.Entry, batch []*queued) (taken int, err error) {
	writer, lost := newOp(), 0
	keys := []string{a.stream, a.head, a.claimKey}
	var absent []int // the batch's index of each key after the first three
	for i, q := range batch {
		if q.absent != "" {
			keys, absent = append(keys, q.absent), append(absent, i)
		}
	}
	script := appendScript
	switch {
	case len(absent) > 0:
		script = absentAppendScript
	case len(es) > 1:
		script = batchAppendScript
	}
	// args is the whole command, EVALSHA's name, hash and keys, then the
	// script's arguments from pre on, so go-redis takes it as it is.
	pre := 3 + len(keys)
	args := slices.Grow(a.args[:0], pre+8+len(es)*(entryFieldsMax+1))
	defer func() {
		clear(args) // nothing of these entries is kept
		if cap(args) <= 16+batchMaxEntries*(entryFieldsMax+1) {
			a.args = args[:0]
		}
	}()
	args = append(args, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	for attempt := 1; attempt <= auditMaxAttempts; attempt++ {
		if a.beforeAttempt != nil {
			a.beforeAttempt(attempt)
		}
		prev := a.last
		head := chain(es, prev, a.now())
		askClaim := "0"
		if lost >= auditClaimAfter {
			askClaim = "1"
		}
		args = append(args[:pre], prev.token(), head.seq, head.hash, a.maxLen, newOp(), writer, askClaim)
		if script == appendScript {
			args = appendEntryFields(args, es[0])
		} else {
			args = batchEntryFields(args, es)
		}
		res, err := a.evalsha(ctx, script, keys, args, pre)
		if err != nil {
			return -1, err
		}
		if k, ok := takenKey(res, len(absent)); ok {
			return absent[k], nil
		}
		if len(res) == len(es)+1 {
			if flag, ok := res[0].(int64); ok && flag == appendDone {
				for i := range es {
					id, ok := res[i+1].(string)
					if !ok {
						return -1, fmt.Errorf("unexpected script reply %v", res)
					}
					es[i].ID = id
				}
				a.last = head
				if attempt > 10 {
					a.log.Warn("audit append contended", "stream", a.stream, "attempts", attempt, "seq", head.seq)
				}
				return -1, nil
			}
		}
		outcome, val, err := parseAppendReply(res)
		switch {
		case err != nil:
			return -1, err
		case outcome == appendDone: // a reply of the wrong length
			return -1, fmt.Errorf("unexpected script reply %v", res)
		}
		// Not written: rebuild on the current head, which the reply carries.
		cur, err := parseHeadToken(val)
		if err != nil {
			return -1, err
		}
		a.last = cur
		if outcome == appendClaimed {
			// Another writer that kept losing appends next: let it.
			if err := clock.Sleep(ctx, auditClaimWait); err != nil {
				return -1, err
			}
			continue
		}
		// Another writer advanced the chain: retry at once.
		a.log.Debug("audit chain head moved, retrying", "stream", a.stream, "attempt", attempt, "head_seq", cur.seq)
		lost++
	}
	return -1, fmt.Errorf("chain head kept moving after %d attempts", auditMaxAttempts)
}

// evalsha runs script as Script.Run does (EVALSHA, then EVAL when Redis
// does not have it): cmd is the whole EVALSHA command, keys its keys and
// cmd[pre:] the script's arguments. go-redis takes cmd as it is (no copy
// of a group commit's arguments per call); it keeps nothing of it once
// the reply is read.
func (a *Audit) evalsha(ctx context.Context, script *redis.Script, keys []string, cmd []any, pre int) ([]any, error) {
	c := redis.NewCmd(ctx, cmd...)
	c.SetFirstKeyPos(3)
	_ = a.rdb.Process(ctx, c)
	res, err := c.Slice()
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		return script.Eval(ctx, a.rdb, keys, cmd[pre:]...).Slice()
	}
	return res, err
}

// takenKey reads absentAppendScript's reply of a taken key: its index
// among the n absent keys.
func takenKey(res []any, n int) (int, bool) {
	if len(res) != 2 {
		return 0, false
	}
	flag, ok1 := res[0].(int64)
	k, ok2 := res[1].(int64)
	if !ok1 || !ok2 || flag != appendTaken || k < 1 || k > int64(n) {
		return 0, false
	}
	return int(k) - 1, true
}

// chain stamps es one on the other from head prev at time now (the time
// of them all, Round(0) dropping the monotonic reading): seq, previous
// hash, time and hash. It returns the new head, the last entry's.
func chain(es []approval.Entry, prev chainHead, now time.Time) chainHead {
	head, now := prev, now.Round(0).UTC()
	for i := range es {
		e := &es[i]
		e.Seq, e.PrevHash, e.Time = head.seq+1, head.hash, now
		e.Hash = approval.ChainHash(e.PrevHash, *e)
		head = chainHead{seq: e.Seq, hash: e.Hash}
	}
	return head
}

// batchEntryFields appends batchAppendScript's entry arguments for es to
// args: their count, then each entry's count of field and value
// arguments followed by them.
func batchEntryFields(args []any, es []approval.Entry) []any {
	args = append(args, len(es))
	for _, e := range es {
		at := len(args)
		args = appendEntryFields(append(args, 0), e)
		args[at] = len(args) - at - 1
	}
	return args
}
