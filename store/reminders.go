package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// Reminder and escalation bookkeeping lives in the request record itself (no
// extra keys), so it shares the record's hash slot and lifetime:
//
//	reminded  the highest reminder number sent so far (absent: none)
//	base      carries Request.Escalated and, when widened, the widened
//	          Request.Approvers once escalated
//
// Both change only while the request is pending and before its deadline,
// each in one script, so any number of processes may race: each reminder
// number and the escalation are claimed by exactly one of them.
const fReminded = "reminded"

// Extra script reply codes.
const (
	codeLate = "late" // the deadline passed: no reminder or escalation any more
	codeSent = "sent" // this reminder number (or a later one) was already claimed
)

// claimReminderScript claims reminder n of a pending request.
//
//	KEYS[1]   record
//	ARGV[1]   n
//	ARGV[2]   now (unix ms)
//	ARGV[3]   the op id (luaOp)
var claimReminderScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[3]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior} end
if status ~= 'pending' then return {'decided'} end
local deadline = tonumber(redis.call('HGET', rec, 'deadline') or '')
if deadline and tonumber(ARGV[2]) >= deadline then return {'late'} end
local sent = tonumber(redis.call('HGET', rec, 'reminded') or '0') or 0
if sent >= tonumber(ARGV[1]) then return {'sent'} end
redis.call('HSET', rec, 'reminded', ARGV[1])
return {done(rec, op, 'ok')}
`)

// escalateScript replaces the record's base (compare-and-set) while the
// request is pending and before its deadline.
//
//	KEYS[1]   record
//	ARGV[1]   the base the caller read
//	ARGV[2]   the new base
//	ARGV[3]   now (unix ms)
//	ARGV[4]   the op id (luaOp)
var escalateScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[4]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local prior = replayed(rec, op)
if prior then return {prior, redis.call('HGETALL', rec)} end
if status ~= 'pending' then return {'decided', redis.call('HGETALL', rec)} end
local deadline = tonumber(redis.call('HGET', rec, 'deadline') or '')
if deadline and tonumber(ARGV[3]) >= deadline then return {'late', redis.call('HGETALL', rec)} end
if redis.call('HGET', rec, 'base') ~= ARGV[1] then return {'stale'} end
redis.call('HSET', rec, 'base', ARGV[2])
redis.call('HINCRBY', rec, 'rev', 1)
return {done(rec, op, 'ok'), redis.call('HGETALL', rec)}
`)

// ClaimReminder reports whether the caller is the one to send reminder n
// (n ≥ 1, counted from the request's creation) for request id. It claims n
// when the request is pending, now is before its deadline, and no reminder
// numbered n or higher was claimed yet: with several processes calling it
// for the same n, exactly one gets true. A process that was down for a few
// intervals claims only the latest number, so people get one reminder, not
// a burst. It returns false (and a nil error) when the request is final or
// past its deadline, and approval.ErrNotFound when it is missing.
func (s *Store) ClaimReminder(ctx context.Context, id string, n int, now time.Time) (bool, error) {
	if n < 1 {
		return false, fmt.Errorf("claim reminder %d of %s: reminders count from 1: %w", n, id, approval.ErrInvalidArgs)
	}
	rep, err := run(ctx, s.rdb, claimReminderScript, []string{s.k.request(id)}, n, now.UnixMilli(), newOp())
	if err != nil {
		return false, fmt.Errorf("claim reminder %d of %s: %w", n, id, err)
	}
	switch rep.code {
	case codeOK:
		return true, nil
	case codeSent, codeDecided, codeLate:
		return false, nil
	case codeNotFound:
		return false, fmt.Errorf("claim reminder %d of %s: %w", n, id, approval.ErrNotFound)
	}
	return false, fmt.Errorf("claim reminder %d of %s: unexpected script reply %q", n, id, rep.code)
}

// Escalate marks pending request id as escalated to "to" at now, once
// across all processes, and when widen is set adds to's users and
// usergroups to the request's Approvers, so they may decide from then on
// (the bot checks Approvers at click time). It returns the request as
// stored afterwards and whether this call escalated it. A request that is
// already escalated, final, or past its deadline is returned unchanged with
// false; a missing one gives approval.ErrNotFound.
func (s *Store) Escalate(ctx context.Context, id string, to approval.Approvers, widen bool, now time.Time) (*approval.Request, bool, error) {
	now = now.UTC()
	// The base changes only here, and only once (Escalated is set by the
	// change), so a compare-and-set on it loses at most to one other
	// escalation; the next round sees Escalated and stops.
	for range 5 {
		f, err := s.rdb.HGetAll(ctx, s.k.request(id)).Result()
		if err != nil {
			return nil, false, fmt.Errorf("escalate %s: %w", id, err)
		}
		if len(f) == 0 {
			return nil, false, fmt.Errorf("escalate %s: %w", id, approval.ErrNotFound)
		}
		r, err := decodeRecord(f)
		if err != nil {
			return nil, false, fmt.Errorf("escalate %s: %w", id, err)
		}
		if r.Status != approval.StatusPending || r.Escalated != nil ||
			(!r.Deadline.IsZero() && !now.Before(r.Deadline)) {
			return r, false, nil
		}
		var base approval.Request
		if err := json.Unmarshal([]byte(f[fBase]), &base); err != nil {
			return nil, false, fmt.Errorf("escalate %s: decode record: %w", id, err)
		}
		base.Escalated = &approval.Escalation{At: now, To: cloneApprovers(to), Widened: widen}
		if widen {
			base.Approvers = widenApprovers(base.Approvers, to)
		}
		nb, err := json.Marshal(base)
		if err != nil {
			return nil, false, fmt.Errorf("escalate %s: %w", id, err)
		}
		rep, err := run(ctx, s.rdb, escalateScript, []string{s.k.request(id)}, f[fBase], nb, now.UnixMilli(), newOp())
		if err != nil {
			return nil, false, fmt.Errorf("escalate %s: %w", id, err)
		}
		switch rep.code {
		case codeOK:
			r, err := rep.record()
			if err != nil {
				return nil, false, fmt.Errorf("escalate %s: %w", id, err)
			}
			return r, true, nil
		case codeDecided, codeLate:
			r, err := rep.record()
			if err != nil {
				return nil, false, fmt.Errorf("escalate %s: %w", id, err)
			}
			return r, false, nil
		case codeNotFound:
			return nil, false, fmt.Errorf("escalate %s: %w", id, approval.ErrNotFound)
		case codeStale:
			continue // escalated meanwhile by another process: read again
		default:
			return nil, false, fmt.Errorf("escalate %s: unexpected script reply %q", id, rep.code)
		}
	}
	return nil, false, fmt.Errorf("escalate %s: record kept changing", id)
}

// widenApprovers adds to's users and usergroups to ap. An empty ap means
// "members of the approvals channel"; that stays true once names are added.
func widenApprovers(ap, to approval.Approvers) approval.Approvers {
	out := cloneApprovers(ap)
	if len(ap.Users) == 0 && len(ap.Usergroups) == 0 {
		out.ChannelMembers = true
	}
	for _, u := range to.Users {
		if !slices.Contains(out.Users, u) {
			out.Users = append(out.Users, u)
		}
	}
	for _, g := range to.Usergroups {
		if !slices.Contains(out.Usergroups, g) {
			out.Usergroups = append(out.Usergroups, g)
		}
	}
	if to.ChannelMembers {
		out.ChannelMembers = true
	}
	return out
}

func cloneApprovers(a approval.Approvers) approval.Approvers {
	a.Users = slices.Clone(a.Users)
	a.Usergroups = slices.Clone(a.Usergroups)
	return a
}
