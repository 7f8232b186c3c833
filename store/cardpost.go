package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// bindCardScript binds the record to its card message, once. The op id
// (luaOp) makes a run go-redis repeats answer what the first run did, so
// the binding that bound is told so exactly once.
//
//	KEYS[1]   record
//	ARGV[1]   card JSON
//	ARGV[2]   the op id (luaOp)
//
// Reply: ok (bound now), same (bound already to this message), bound (to
// another message), not_found.
var bindCardScript = redis.NewScript(luaOp + `
local rec, op = KEYS[1], ARGV[2]
if redis.call('EXISTS', rec) == 0 then return 'not_found' end
local prior = replayed(rec, op)
if prior then return prior end
local cur = redis.call('HGET', rec, 'card')
if cur == ARGV[1] then return 'same' end
if cur and cur ~= '' and cur ~= '{}' then return 'bound' end
redis.call('HSET', rec, 'card', ARGV[1])
redis.call('HINCRBY', rec, 'rev', 1)
return done(rec, op, 'ok')
`)

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

// startCardPostScript notes a card post attempt.
//
//	KEYS[1]   record
//	ARGV[1]   now (unix ms)
//
// Reply: 1 first attempt, 0 a later one, -1 no record.
var startCardPostScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
return redis.call('HSETNX', KEYS[1], 'card_post_at', ARGV[1])
`)

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
