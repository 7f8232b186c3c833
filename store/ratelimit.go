package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter keeps each API key's call budget in Redis, so every process of
// the deployment spends from one budget per key (agent/api.Limiter). Get
// it from Store.Limiter.
type Limiter struct {
	s *Store
}

// Limiter returns the deployment's rate limiter.
func (s *Store) Limiter() *Limiter { return &Limiter{s: s} }

// rateKey is the budget of the API key named name.
func (k keys) rate(name string) string { return k.prefix + ":rate:{" + name + "}" }

// takeScript is a token bucket: capacity calls, refilled continuously at
// capacity per period, one spent per call. The bucket expires a period
// after its last call (by then it is full again, as a missing one is).
// The time is the caller's (the processes' clocks; a clock behind the
// bucket's last call refills nothing rather than draining it).
//
//	KEYS[1]   the key's bucket: a hash {tokens, at (unix ms)}
//	ARGV[1]   capacity (calls per period)
//	ARGV[2]   period, ms
//	ARGV[3]   now (unix ms)
//
// Reply: {1, 0} spent; {0, wait ms} none left.
var takeScript = redis.NewScript(`
local cap = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then
  tokens, at = cap, now
end
if now > at then
  tokens = math.min(cap, tokens + (now - at) * cap / period)
  at = now
end
local ok, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
else
  wait = math.ceil((1 - tokens) * period / cap)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'at', string.format('%d', at))
redis.call('PEXPIRE', KEYS[1], period)
return {ok, wait}
`)

// Take spends one of perMinute calls a minute of the API key named key;
// when none is left, ok is false and wait is how long until one is. An
// error means Redis did not answer: the caller decides (the API refuses).
func (l *Limiter) Take(ctx context.Context, key string, perMinute int) (wait time.Duration, ok bool, err error) {
	if perMinute < 1 {
		return 0, false, fmt.Errorf("rate limit %s: %d calls per minute", key, perMinute)
	}
	res, err := takeScript.Run(ctx, l.s.rdb, []string{l.s.k.rate(key)}, perMinute, time.Minute.Milliseconds(), l.s.now().UnixMilli()).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("rate limit %s: %w", key, err)
	}
	if len(res) != 2 {
		return 0, false, fmt.Errorf("rate limit %s: reply %v", key, res)
	}
	return time.Duration(res[1]) * time.Millisecond, res[0] == 1, nil
}
