package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
)

// feedbackScript records an approver's judgement of a final request: Mark
// as wrong, or Looks right on a sampled call. The request must be settled
// (ran, or rejected or answered by a person; see approval.Request.Markable)
// and not yet marked wrong; a "looks right" also needs no feedback yet.
//
//	KEYS[1]   record
//	ARGV[1]   feedback JSON
//	ARGV[2]   "1" wrong, "0" right
var feedbackScript = redis.NewScript(`
local rec = KEYS[1]
local status = redis.call('HGET', rec, 'status')
if not status then return {'not_found'} end
local settled = {executed=true, failed=true, unknown=true, rejected=true, responded=true}
local decided = (redis.call('HGET', rec, 'decision') or '') ~= '' or redis.call('HGET', rec, 'mode') == 'sampled'
if not settled[status] or not decided then return {'not_final', redis.call('HGETALL', rec)} end
if redis.call('HGET', rec, 'wrong') == '1' then return {'marked', redis.call('HGETALL', rec)} end
if ARGV[2] ~= '1' and redis.call('HEXISTS', rec, 'feedback') == 1 then return {'marked', redis.call('HGETALL', rec)} end
redis.call('HSET', rec, 'feedback', ARGV[1])
if ARGV[2] == '1' then redis.call('HSET', rec, 'wrong', '1') end
redis.call('HINCRBY', rec, 'rev', 1)
return {'ok', redis.call('HGETALL', rec)}
`)

// RecordFeedback records f on request id atomically (see feedbackScript)
// and returns the request as it now is. Refusals, with the current record:
// approval.ErrNotFinal, approval.ErrAlreadyMarked; a missing request gives
// approval.ErrNotFound.
func (s *Store) RecordFeedback(ctx context.Context, id string, f approval.Feedback) (*approval.Request, error) {
	if f.At.IsZero() {
		f.At = s.now()
	}
	f.At = f.At.UTC()
	b, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("feedback on %s: %w", id, err)
	}
	wrong := "0"
	if f.Wrong {
		wrong = "1"
	}
	what := "feedback on " + id
	code, r, err := s.transition(ctx, what, feedbackScript, []string{s.k.request(id)}, b, wrong)
	switch {
	case err != nil:
		return nil, err
	case code == codeOK:
		return r, nil
	case code == codeNotFinal:
		return r, fmt.Errorf("%s: status %s: %w", what, r.Status, approval.ErrNotFinal)
	case code == codeMarked:
		return r, fmt.Errorf("%s: %w", what, approval.ErrAlreadyMarked)
	}
	return nil, unexpectedReply(what, code)
}
