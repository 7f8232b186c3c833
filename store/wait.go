package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// recheckRounds is how many hub rounds pass between re-reads of every
// waited record, so a wake element that was lost (popped by another
// process, expired, deleted) cannot leave a waiter hanging.
const recheckRounds = 30

// Wait blocks until request id is final (past pending) and returns it. An
// expired request comes back with Status approval.StatusExpired and a
// Decision whose Verdict is approval.VerdictExpire: a rejection, not an
// error.
//
// Wait reads the durable record first, so a decision made before the call,
// or while no process was waiting, is returned at once. Otherwise it
// registers with the Store's wake hub (see hub) and returns when the hub
// delivers the final record, when ctx is done (at once; the hub stops
// watching the key at its next round), or with ErrClosed after Close. Any
// number of goroutines may Wait on the same id; all get the decision.
//
// Wait holds no Redis connection while blocked: the hub blocks on at most
// Options.WaitConns connections for all waiters of the process together.
func (s *Store) Wait(ctx context.Context, id string) (*approval.Request, error) {
	r, err := s.Request(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("wait: %w", err)
	}
	if r.Status.Decided() {
		return r, nil
	}
	w, err := s.hub.register(id)
	if err != nil {
		return nil, fmt.Errorf("wait for %s: %w", id, err)
	}
	defer s.hub.unregister(id, w)
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for %s: %w", id, ctx.Err())
	case d := <-w:
		if d.err != nil {
			return nil, fmt.Errorf("wait for %s: %w", id, d.err)
		}
		r, err := decodeRecord(d.fields)
		if err != nil {
			return nil, fmt.Errorf("wait for %s: %w", id, err)
		}
		return r, nil
	}
}

// delivery is what the hub hands a waiter: the final record's fields
// (shared, read-only) or an error.
type delivery struct {
	fields map[string]string
	err    error
}

// waiter receives at most one delivery; the channel has room for it so the
// hub never blocks on a waiter that left.
type waiter chan delivery

// hub multiplexes every Wait of a Store onto at most n goroutines, each
// holding at most one Redis connection at a time.
//
// Waited ids are spread over n shards by hash. Shard i's goroutine loops:
// snapshot its waited wake keys, BLPOP all of them with the block timeout,
// and on a pop re-read that request's record and deliver it to all its
// waiters. A key registered during a round joins the next round (at most
// one block timeout later); the wake element stays in the list meanwhile,
// so nothing is missed. Every recheckRounds rounds it re-reads all its
// records (pipelined) as a safety net.
//
// With a Redis Cluster client a multi-key BLPOP would cross hash slots (every
// request has its own), so the hub polls instead: every block timeout it
// re-reads all waited records, pipelined per node.
//
// Goroutines start with the first registration and exit when Close is
// called, after their current round (at most one block timeout).
type hub struct {
	s       *Store
	timeout time.Duration
	poll    bool // cluster: poll records instead of BLPOP
	shards  []*shard
	stop    chan struct{}
	ctx     context.Context // cancelled by close; used for the hub's Redis calls
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// mu guards started and closed. register holds it for reading while it
	// adds a waiter, so close (which takes it for writing) sees every
	// registered waiter when it fails the remaining ones.
	mu      sync.RWMutex
	started bool
	closed  bool

	// hooks are test hooks (export_test.go), set before first use.
	hooks hubHooks
}

// hubHooks lets tests observe the hub without sleeping.
type hubHooks struct {
	registered func(id string)           // after a waiter is registered
	round      func(sh *shard, keys int) // before each BLPOP, with the number of keys
	recheck    int                       // recheckRounds override when > 0
}

// shard is one hub goroutine's share of the waited keys.
type shard struct {
	mu      sync.Mutex         // guards waiting
	waiting map[string]*waited // by wake key
	kick    chan struct{}      // signalled when an idle shard gets a key
}

// waited is one request id and the waiters on it.
type waited struct {
	id      string
	waiters map[waiter]struct{}
}

func newHub(s *Store, n int, timeout time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hub{s: s, timeout: timeout, stop: make(chan struct{}), ctx: ctx, cancel: cancel}
	_, h.poll = s.rdb.(*redis.ClusterClient)
	h.shards = make([]*shard, n)
	for i := range h.shards {
		h.shards[i] = &shard{waiting: map[string]*waited{}, kick: make(chan struct{}, 1)}
	}
	return h
}

func (h *hub) shardOf(id string) *shard {
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	return h.shards[f.Sum32()%uint32(len(h.shards))]
}

// register adds a waiter for id and starts the hub goroutines on first use.
func (h *hub) register(id string) (waiter, error) {
	h.start()
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return nil, ErrClosed
	}

	w := make(waiter, 1)
	key := h.s.k.wake(id)
	sh := h.shardOf(id)
	sh.mu.Lock()
	e := sh.waiting[key]
	if e == nil {
		e = &waited{id: id, waiters: map[waiter]struct{}{}}
		sh.waiting[key] = e
	}
	e.waiters[w] = struct{}{}
	sh.mu.Unlock()
	select {
	case sh.kick <- struct{}{}:
	default:
	}
	if h.hooks.registered != nil {
		h.hooks.registered(id)
	}
	return w, nil
}

// start starts the goroutines once.
func (h *hub) start() {
	h.mu.RLock()
	started := h.started
	h.mu.RUnlock()
	if started {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.closed {
		return
	}
	h.started = true
	for _, sh := range h.shards {
		h.wg.Add(1)
		go h.run(sh)
	}
}

// unregister removes w; the key leaves the next round's BLPOP when it was
// the last waiter.
func (h *hub) unregister(id string, w waiter) {
	key := h.s.k.wake(id)
	sh := h.shardOf(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.waiting[key]; e != nil {
		delete(e.waiters, w)
		if len(e.waiters) == 0 {
			delete(sh.waiting, key)
		}
	}
}

// deliver hands d to every waiter of key and forgets the key.
func (sh *shard) deliver(key string, d delivery) {
	sh.mu.Lock()
	e := sh.waiting[key]
	delete(sh.waiting, key)
	sh.mu.Unlock()
	if e == nil {
		return
	}
	for w := range e.waiters {
		w <- d // room for one; each waiter gets exactly one delivery
	}
}

// snapshot returns the shard's waited keys and their ids.
func (sh *shard) snapshot() (keys, ids []string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	keys = make([]string, 0, len(sh.waiting))
	ids = make([]string, 0, len(sh.waiting))
	for k, e := range sh.waiting {
		keys = append(keys, k)
		ids = append(ids, e.id)
	}
	return keys, ids
}

// run is one hub goroutine. It exits when h.stop is closed.
func (h *hub) run(sh *shard) {
	defer h.wg.Done()
	every := recheckRounds
	if h.hooks.recheck > 0 {
		every = h.hooks.recheck
	}
	for round := 1; ; round++ {
		keys, ids := sh.snapshot()
		if len(keys) == 0 {
			select {
			case <-h.stop:
				return
			case <-sh.kick:
				continue
			}
		}
		select {
		case <-h.stop:
			return
		default:
		}
		if h.poll {
			if !h.pause() {
				return
			}
			h.recheck(sh, keys, ids)
			continue
		}
		if round%every == 0 {
			h.recheck(sh, keys, ids)
		}
		if h.hooks.round != nil {
			h.hooks.round(sh, len(keys))
		}
		key, err := h.blpop(keys)
		switch {
		case errors.Is(err, redis.Nil):
			// timeout: next round with a fresh snapshot
		case err != nil:
			h.s.log.Warn("store: wake hub BLPOP", "keys", len(keys), "err", err)
			if !h.pause() { // do not hot-loop on a broken connection
				return
			}
		default:
			h.wake(sh, key)
		}
	}
}

// pause waits one block timeout; false means the hub is stopping.
func (h *hub) pause() bool {
	t := time.NewTimer(h.timeout)
	defer t.Stop()
	select {
	case <-h.stop:
		return false
	case <-t.C:
		return true
	}
}

// blpop pops from the first non-empty key, or returns redis.Nil after the
// block timeout.
func (h *hub) blpop(keys []string) (string, error) {
	var (
		res []string
		err error
	)
	if h.timeout >= time.Second {
		// Whole seconds (a fraction is dropped): go-redis reads a typed
		// blocking command's reply with the block time plus a margin, so
		// any BlockTimeout works whatever the client's ReadTimeout.
		res, err = h.s.rdb.BLPop(h.ctx, h.timeout.Truncate(time.Second), keys...).Result()
	} else {
		// Sub-second: a decimal timeout (Redis ≥ 6) through Do, whose reply
		// is read with the client's ReadTimeout (default 3s).
		args := make([]any, 0, len(keys)+2)
		args = append(args, "blpop")
		for _, k := range keys {
			args = append(args, k)
		}
		args = append(args, strconv.FormatFloat(h.timeout.Seconds(), 'f', -1, 64))
		res, err = h.s.rdb.Do(h.ctx, args...).StringSlice()
	}
	if err != nil {
		return "", err
	}
	if len(res) != 2 {
		return "", fmt.Errorf("unexpected BLPOP reply %q", res)
	}
	return res[0], nil
}

// wake re-reads the record behind a popped wake key and delivers it when
// final. A read error leaves the waiters in place; the next recheck finds
// the decision.
func (h *hub) wake(sh *shard, key string) {
	sh.mu.Lock()
	e := sh.waiting[key]
	sh.mu.Unlock()
	if e == nil {
		return // nobody waits any more; the record keeps the decision
	}
	f, err := h.s.rdb.HGetAll(h.ctx, h.s.k.request(e.id)).Result()
	if err != nil {
		h.s.log.Warn("store: wake hub read", "request_id", e.id, "err", err)
		return
	}
	h.settle(sh, key, f)
}

// settle delivers a record that is final, or missing, to key's waiters.
func (h *hub) settle(sh *shard, key string, f map[string]string) {
	switch {
	case len(f) == 0:
		sh.deliver(key, delivery{err: approval.ErrNotFound})
	case f[fStatus] != string(approval.StatusPending):
		sh.deliver(key, delivery{fields: f})
	}
}

// recheck re-reads the status of every waited record and delivers the final
// ones.
func (h *hub) recheck(sh *shard, keys, ids []string) {
	for start := 0; start < len(ids); start += pageSize {
		end := min(start+pageSize, len(ids))
		cmds := make([]*redis.StringCmd, 0, end-start)
		_, err := h.s.rdb.Pipelined(h.ctx, func(p redis.Pipeliner) error {
			for _, id := range ids[start:end] {
				cmds = append(cmds, p.HGet(h.ctx, h.s.k.request(id), fStatus))
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			h.s.log.Warn("store: wake hub recheck", "err", err)
			return
		}
		for i, c := range cmds {
			st, err := c.Result()
			if err == nil && st == string(approval.StatusPending) {
				continue
			}
			if err != nil && !errors.Is(err, redis.Nil) {
				continue
			}
			f, err := h.s.rdb.HGetAll(h.ctx, h.s.k.request(ids[start+i])).Result()
			if err != nil {
				continue
			}
			h.settle(sh, keys[start+i], f)
		}
	}
}

// close stops the goroutines, waits for them and fails remaining waiters
// with ErrClosed.
func (h *hub) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	close(h.stop)
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	for _, sh := range h.shards {
		keys, _ := sh.snapshot()
		for _, k := range keys {
			sh.deliver(k, delivery{err: ErrClosed})
		}
	}
}
