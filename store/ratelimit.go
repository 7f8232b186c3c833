package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter keeps each API key's call budget in Redis, so every process of
// the deployment spends from one budget per key (agent/api.Limiter). Get
// it from Store.Limiter.
//
// A busy key's calls are not a round trip each: one Take takes a lease of
// up to a tenth of a second's worth of calls (leaseSize) from the shared
// budget, and the process spends the rest of the lease locally for up to
// leaseTTL. Once half of a lease is spent, the next is taken ahead, off
// the calls' path (one refill at a time per key; a call that finds the
// lease empty while it is on its way waits for it rather than asking
// too), so a steady stream of calls seldom waits for Redis. The budget is
// never overspent (a lease is taken from it before any of its calls is
// let through); a lease the process does not use in time is lost to the
// budget, at most two tenths of a second's worth per key and process. A
// budget under 600 calls a minute is leased one call at a time: every
// call is a round trip, as without leases.
type Limiter struct {
	s  *Store
	mu sync.Mutex
	// leases are the calls taken from each key's budget and not spent
	// yet, by key name.
	leases map[string]*lease
	// onAsk, when set (tests), is called as a call asks Redis itself.
	onAsk func()
}

// lease is calls of a key's budget this process took and may spend
// locally until the lease expires.
type lease struct {
	calls     int
	perMinute int // the budget it was taken from
	until     time.Time
	// refill, while a refill of the lease is on its way, is closed when
	// it has landed (refillLease).
	refill chan struct{}
}

// refillTimeout bounds a refill taken ahead of need.
const refillTimeout = time.Second

// leaseTTL bounds how long a leased call may wait to be spent: a tenth
// of a second, as leaseSize.
const leaseTTL = 100 * time.Millisecond

// leaseSize is how many calls one round trip takes at most from a budget
// of perMinute calls a minute: a tenth of a second's worth, at most 64.
func leaseSize(perMinute int) int { return min(64, max(1, perMinute/600)) }

// Limiter returns the deployment's rate limiter, as this process spends
// from it (one per Store: its leases are the process's).
func (s *Store) Limiter() *Limiter {
	s.limiterOnce.Do(func() { s.limiter = &Limiter{s: s, leases: map[string]*lease{}} })
	return s.limiter
}

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
//	ARGV[4]   how many calls to take at most (a lease, 1 or more)
//
// Reply: {n, 0} n calls taken (1 to ARGV[4]: as many whole tokens as are
// left); {0, wait ms} none left.
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
  ok = math.min(tonumber(ARGV[4]), math.floor(tokens))
  tokens = tokens - ok
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
	now := l.s.now()
	want := leaseSize(perMinute)
	l.mu.Lock()
	if ls := l.leases[key]; ls != nil && ls.perMinute == perMinute {
		if ls.calls > 0 && now.Before(ls.until) {
			ls.calls--
			if want > 1 && ls.calls <= want/2 && ls.refill == nil {
				ls.refill = make(chan struct{})
				go l.refillLease(key, ls) // ends within refillTimeout
			}
			l.mu.Unlock()
			return 0, true, nil
		}
		if landed := ls.refill; landed != nil {
			l.mu.Unlock()
			select {
			case <-landed:
			case <-ctx.Done():
				return 0, false, fmt.Errorf("rate limit %s: %w", key, ctx.Err())
			}
			return l.Take(ctx, key, perMinute) // spent from the refill, or asked again
		}
	}
	l.mu.Unlock()
	if l.onAsk != nil {
		l.onAsk()
	}
	res, err := takeScript.Run(ctx, l.s.rdb, []string{l.s.k.rate(key)}, perMinute, time.Minute.Milliseconds(), now.UnixMilli(), want).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("rate limit %s: %w", key, err)
	}
	if len(res) != 2 || res[0] < 0 || res[0] > int64(want) {
		return 0, false, fmt.Errorf("rate limit %s: reply %v", key, res)
	}
	if res[0] == 0 {
		return time.Duration(res[1]) * time.Millisecond, false, nil
	}
	if rest := int(res[0]) - 1; rest > 0 { // this call spends one; the rest is leased
		l.mu.Lock()
		l.leased(key, perMinute, rest, now)
		l.mu.Unlock()
	}
	return 0, true, nil
}

// leased adds n calls taken from key's budget of perMinute at now to the
// lease this process spends; l.mu is held.
func (l *Limiter) leased(key string, perMinute, n int, now time.Time) {
	ls := l.leases[key]
	if ls == nil || ls.perMinute != perMinute {
		ls = &lease{perMinute: perMinute}
		l.leases[key] = ls
	}
	if !now.Before(ls.until) {
		ls.calls = 0 // expired: lost to the budget, never spent late
	}
	ls.calls += n
	ls.until = now.Add(leaseTTL)
}

// refillLease takes the next lease of key ahead of need, for ls (half
// spent), and tells the calls waiting for it. A refill that fails or
// finds the budget spent leases nothing: the next call asks itself.
func (l *Limiter) refillLease(key string, ls *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), refillTimeout)
	defer cancel()
	now := l.s.now()
	want := leaseSize(ls.perMinute)
	res, err := takeScript.Run(ctx, l.s.rdb, []string{l.s.k.rate(key)}, ls.perMinute, time.Minute.Milliseconds(), now.UnixMilli(), want).Int64Slice()
	l.mu.Lock()
	defer l.mu.Unlock()
	close(ls.refill)
	ls.refill = nil
	switch {
	case err != nil:
		l.s.log.Warn("rate limit: the next lease was not taken ahead; the next call asks", "key", key, "err", err)
	case len(res) == 2 && res[0] > 0 && res[0] <= int64(want):
		l.leased(key, ls.perMinute, int(res[0]), now)
	}
}
