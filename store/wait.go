package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/redis/go-redis/v9"
)

// recheckRounds is how many BlockTimeouts pass between re-reads of every
// waited record, a safety net for a hint that was never published (a
// process stopped between recording a decision and waking its waiters) or
// that Redis dropped without closing the connection, and the way a waiter
// learns that its record vanished (a Cluster node restarted empty) when
// nothing else tells it: every 10 s, so a loss is shown well within 30 s.
// The cost is one pipelined read per waited record per round, spread over
// the round: each BlockTimeout a lane re-reads the tenth of its records
// whose turn it is (waited.turn), not all of them at once — at 33,000
// waits per process, re-reading them together every 10 s stalled Redis
// for everyone (wake p99 5.8–7.5 ms against 2.1–2.2 ms without,
// BenchmarkPending100K).
const recheckRounds = 10

// rereadPage bounds the records of one pipelined re-read: Redis runs a
// pipeline's commands back to back, so a large one delays every other
// client's commands (at 500 records, 1,000 commands, the safety net's
// re-reads showed in everyone's p99).
const rereadPage = 100

// subscribeBatch bounds the channels of one SUBSCRIBE command.
const subscribeBatch = 1000

// minBackoff is the first pause after a Redis error in the hub; it doubles
// up to Options.BlockTimeout, and never beyond maxBackoff.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// Wait blocks until request id is final (past pending) and returns it. An
// expired request comes back with Status approval.StatusExpired and a
// Decision whose Verdict is approval.VerdictExpire: a rejection, not an
// error.
//
// Wait reads the durable record first, so a decision made before the call,
// or while no process was waiting, is returned at once. Otherwise it
// registers with the Store's wake hub (see hub) and returns when the hub
// delivers the final record, when ctx is done (at once), or with ErrClosed
// after Close. Any number of goroutines may Wait on the same id; all get
// the decision.
//
// Wait holds no Redis connection while blocked: the hub listens on at most
// Options.WaitConns connections per Redis master for all waiters of the
// process together.
func (s *Store) Wait(ctx context.Context, id string) (*approval.Request, error) {
	r, base, err := s.waitFrom(ctx, id)
	if err != nil || r != nil {
		return r, err
	}
	w := &waiter{ch: make(chan delivery, 1)}
	l, err := s.hub.register(ctx, id, base, w)
	if err != nil {
		return nil, fmt.Errorf("wait for %s: %w", id, err)
	}
	defer l.remove(s.k.channel(id), w)
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for %s: %w", id, ctx.Err())
	case d := <-w.ch:
		return d.request(id)
	}
}

// Watch is Wait that holds no goroutine while the request is pending: the
// API's parked long polls use it, 10,000 of them on a handful of the hub's
// goroutines. When the request is final (and woken) already, Watch
// returns it. Otherwise it registers ready with the wake hub and returns;
// the hub calls ready once with what Wait would have returned (the final
// record, or an error such as ErrClosed) from its own goroutine, so ready
// must not block. stop unregisters (the caller gave up); a ready already
// under way may still run once after it. ctx bounds the reads Watch makes
// before it returns, not the watch.
func (s *Store) Watch(ctx context.Context, id string, ready func(*approval.Request, error)) (final *approval.Request, stop func(), err error) {
	r, base, err := s.waitFrom(ctx, id)
	if err != nil || r != nil {
		return r, nil, err
	}
	w := &waiter{fn: func(d delivery) { ready(d.request(id)) }}
	l, err := s.hub.register(ctx, id, base, w)
	if err != nil {
		return nil, nil, fmt.Errorf("wait for %s: %w", id, err)
	}
	return nil, func() { l.remove(s.k.channel(id), w) }, nil
}

// waitFrom reads request id as Wait starts: the request when it is final
// and woken (nothing to wait for), else the immutable part (fBase) of the
// record read, which the hub compares with a hint's record.
func (s *Store) waitFrom(ctx context.Context, id string) (final *approval.Request, base string, err error) {
	f, err := s.rdb.HGetAll(ctx, s.k.request(id)).Result()
	if err == nil && len(f) == 0 {
		err = approval.ErrNotFound
	}
	var r *approval.Request
	if err == nil {
		r, err = decodeRecord(f)
	}
	if err != nil {
		return nil, "", fmt.Errorf("wait: load request %s: %w", id, err)
	}
	if r.Status.Decided() {
		// Final and woken: the owner of the transition audited it before
		// pushing the wake-up, so what the waiter does next is audited
		// after it. Final but not woken yet (the owner is auditing it, or
		// stopped before waking): wait for the wake-up like any waiter;
		// the hub's safety-net re-read delivers it if none ever comes.
		woken, err := s.rdb.Exists(ctx, s.k.wake(id)).Result()
		if err != nil {
			return nil, "", fmt.Errorf("wait: %w", err)
		}
		if woken > 0 {
			return r, "", nil
		}
	}
	return nil, f[fBase], nil
}

// delivery is what the hub hands a waiter: the final record's fields
// (shared, read-only) or an error.
type delivery struct {
	fields map[string]string
	err    error
}

// request is what a waiter of request id returns for d.
func (d delivery) request(id string) (*approval.Request, error) {
	if d.err != nil {
		return nil, fmt.Errorf("wait for %s: %w", id, d.err)
	}
	r, err := decodeRecord(d.fields)
	if err != nil {
		return nil, fmt.Errorf("wait for %s: %w", id, err)
	}
	return r, nil
}

// waiter receives at most one delivery: a Wait's on its channel, which has
// room for it so the hub never blocks on a waiter that left; a Watch's
// through its func, called on the hub's goroutine.
type waiter struct {
	ch chan delivery
	fn func(delivery)
}

func (w *waiter) deliver(d delivery) {
	if w.fn != nil {
		w.fn(d)
		return
	}
	w.ch <- d // room for one; each waiter gets exactly one delivery
}

// hub multiplexes every Wait of a Store onto a few Pub/Sub connections
// ("lanes").
//
// Every final transition pushes the request's wake list (the design card's
// wake-up, kept for any BLPOP consumer) and publishes a hint on the
// request's channel, the wake list's name scoped to the database
// (keys.channel; luaHint in scripts.go): a sharded SPUBLISH on Redis ≥ 7,
// whose channel lives in the request's hash slot. A waited request's lane
// subscribes to that channel; when the subscription is confirmed it re-reads
// the durable record, so a decision made before the subscription is found
// by the read (once its wake-up was pushed: a decision whose owner still
// audits it is left to the hint that follows) and one made after it by the
// hint. A hint carries the durable record as the script that pushed the
// wake-up read it (luaHint's snapshot), and the lane delivers that record
// when final and when it is the record its waiters read: the same
// immutable part (fBase: the id, tool, arguments as proposed, caller,
// created, …). A wake-up is only a hint, never authority: anyone who can
// publish on the server (another deployment, on another database, whose
// channels are server-wide too) could send one. A hint that carries no
// record (an older process's) or another record makes the lane re-read
// its own; a hint for a request nobody waits on, or whose record is still
// pending, is ignored. The cost of a wake-up is one
// message, whatever the number of waiters: no read after it.
//
// Nothing is lost while a connection is down: the lane reconnects with a
// bounded backoff (minBackoff doubling to BlockTimeout, at most maxBackoff), subscribes again to
// every waited channel and re-reads each record on its confirmation. An idle
// lane PINGs every BlockTimeout and reconnects when the pong does not come
// within another. Every recheckRounds BlockTimeouts each lane has re-read
// all its records (pipelined, a share each BlockTimeout) as a safety net
// (see recheckRounds).
//
// Lanes: Options.WaitConns of them, ids spread by hash; on a Cluster,
// WaitConns per master (a shard channel must be subscribed on the master
// of its slot). Each lane has two goroutines, started with its first
// waiter: a worker that sends SUBSCRIBE/UNSUBSCRIBE and re-reads records,
// and a reader that receives messages. Both exit when Close is called.
type hub struct {
	s       *Store
	conns   int           // lanes per master (Options.WaitConns)
	timeout time.Duration // Options.BlockTimeout: idle PING interval, backoff cap
	cluster *redis.ClusterClient
	ctx     context.Context // cancelled by close; used for the hub's Redis calls
	cancel  context.CancelFunc
	stop    chan struct{}
	wg      sync.WaitGroup

	// mu guards lanes, order, closed and mode. register holds it while it
	// adds a waiter, so close (which takes it too) sees every waiter.
	mu     sync.Mutex
	lanes  map[string]*lane
	order  []*lane
	closed bool
	mode   string // "sharded" or "classic" once probed (probeScript)

	out outage

	// hooks are test hooks (export_test.go), set before first use.
	hooks hubHooks
}

// hubHooks lets tests observe the hub without sleeping.
type hubHooks struct {
	registered func(id string)                 // after a waiter is registered
	round      func(lane int, live int)        // after a lane re-read records or idled one BlockTimeout, with its live subscriptions
	backoff    func(lane int, d time.Duration) // before each pause after a Redis error
	recheck    int                             // recheckRounds override when > 0
}

// lane is one Pub/Sub connection's share of the waited requests.
type lane struct {
	h   *hub
	idx int // creation order, for hooks

	// mu guards every field below.
	mu        sync.Mutex
	waiting   map[string]*waited  // by channel (keys.channel)
	dealt     int                 // waited entries made so far: the next one's turn
	subs      map[string]struct{} // to subscribe
	unsubs    map[string]struct{} // to unsubscribe
	confirmed map[string]bool     // record to re-read: true for the safety net (final is enough), false after a subscription (final and woken)
	live      map[string]struct{} // subscribed and re-read: a hint will come
	ps        *redis.PubSub       // nil until the first subscription, and after renew
	psChanged chan struct{}       // closed and replaced when ps changes
	broken    *redis.PubSub       // the reader found this ps dead: the worker replaces it
	reading   bool                // the reader goroutine runs
	closed    bool
	kick      chan struct{} // wakes the worker
}

// baseSeed keys baseSum: random per process, so no record can be made to
// collide with another's.
var baseSeed = maphash.MakeSeed()

// baseSum stands for the immutable part (fBase) of a record a waiter read,
// so a lane keeps 8 bytes per waited request rather than the part itself
// (hundreds of bytes: with 10,000 long polls parked, most of what the hub
// held). 0 is no part: it trusts no hint's record.
func baseSum(base string) uint64 {
	if base == "" {
		return 0
	}
	return maphash.String(baseSeed, base)
}

// waited is one request id and the waiters on it.
type waited struct {
	id      string
	base    uint64 // baseSum of the immutable part of the record the waiters read (fBase); 0 trusts no hint's record
	waiters map[*waiter]struct{}
	turn    int // which safety-net round re-reads it (recheck): lanes deal them in turn
}

func newHub(s *Store, n int, timeout time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hub{s: s, conns: n, timeout: timeout, stop: make(chan struct{}), ctx: ctx, cancel: cancel, lanes: map[string]*lane{}}
	h.cluster, _ = s.rdb.(*redis.ClusterClient)
	h.out.h = h
	return h
}

// laneKey names the lane of channel ch: a hash shard, and on a Cluster the
// master that serves ch's slot.
func (h *hub) laneKey(ctx context.Context, id, ch string) (string, error) {
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	key := strconv.Itoa(int(f.Sum32() % uint32(h.conns)))
	if h.cluster == nil {
		return key, nil
	}
	m, err := h.cluster.MasterForKey(ctx, ch)
	if err != nil {
		return "", fmt.Errorf("find the master of %s: %w", ch, err)
	}
	return m.Options().Addr + "/" + key, nil
}

// register adds a waiter for id to its lane, starting the lane on first use.
// base is the immutable part (fBase) of the record the waiter read: a
// hint's record is delivered only when it has the same.
func (h *hub) register(ctx context.Context, id, base string, w *waiter) (*lane, error) {
	ch := h.s.k.channel(id)
	key, err := h.laneKey(ctx, id, ch)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	l := h.lanes[key]
	if l == nil {
		l = &lane{
			h: h, idx: len(h.order),
			waiting: map[string]*waited{}, subs: map[string]struct{}{}, unsubs: map[string]struct{}{},
			confirmed: map[string]bool{}, live: map[string]struct{}{},
			psChanged: make(chan struct{}), kick: make(chan struct{}, 1),
		}
		h.lanes[key] = l
		h.order = append(h.order, l)
		h.wg.Add(1)
		go l.work()
	}
	l.add(ch, id, base, w)
	h.mu.Unlock()
	if h.hooks.registered != nil {
		h.hooks.registered(id)
	}
	return l, nil
}

// add registers w on ch; a new channel is queued for subscription. base
// is the immutable part of the record w's Wait read; waiters that read
// different ones (the record was replaced between their reads) leave no
// hint's record trusted: each hint is followed by a read.
func (l *lane) add(ch, id, record string, w *waiter) {
	base := baseSum(record)
	l.mu.Lock()
	e := l.waiting[ch]
	if e == nil {
		l.dealt++
		e = &waited{id: id, base: base, waiters: map[*waiter]struct{}{}, turn: l.dealt}
		l.waiting[ch] = e
		l.subs[ch] = struct{}{}
		delete(l.unsubs, ch)
	} else if e.base != base {
		e.base = 0
	}
	e.waiters[w] = struct{}{}
	l.mu.Unlock()
	l.poke()
}

// remove drops w; the channel is unsubscribed when it was the last waiter.
func (l *lane) remove(ch string, w *waiter) {
	l.mu.Lock()
	e := l.waiting[ch]
	if e == nil {
		l.mu.Unlock()
		return
	}
	delete(e.waiters, w)
	if len(e.waiters) > 0 {
		l.mu.Unlock()
		return
	}
	l.forget(ch)
	l.mu.Unlock()
	l.poke()
}

// forget drops ch and queues its unsubscription. l.mu must be held.
func (l *lane) forget(ch string) {
	delete(l.waiting, ch)
	delete(l.live, ch)
	delete(l.confirmed, ch)
	if _, queued := l.subs[ch]; queued {
		delete(l.subs, ch) // never sent
	} else {
		l.unsubs[ch] = struct{}{}
	}
}

func (l *lane) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// deliver hands d to every waiter of ch and forgets ch.
func (l *lane) deliver(ch string, d delivery) {
	l.mu.Lock()
	e := l.waiting[ch]
	if e != nil {
		l.forget(ch)
	}
	l.mu.Unlock()
	if e == nil {
		return
	}
	for w := range e.waiters {
		w.deliver(d)
	}
	l.poke()
}

// probeScript reports how hint publishes on this server.
//
//	KEYS[1]   a channel nobody listens on
//
// Reply: "sharded" or "classic".
var probeScript = redis.NewScript(luaHint + `
return hint(KEYS[1], '')
`)

// probe learns once how the scripts publish hints on this server.
func (h *hub) probe() (string, error) {
	h.mu.Lock()
	mode := h.mode
	h.mu.Unlock()
	if mode != "" {
		return mode, nil
	}
	mode, err := probeScript.Run(h.ctx, h.s.rdb, []string{h.s.k.hubProbe()}).Text()
	if err != nil {
		return "", fmt.Errorf("probe SPUBLISH: %w", err)
	}
	if mode != "sharded" && mode != "classic" {
		return "", fmt.Errorf("probe SPUBLISH: unexpected reply %q", mode)
	}
	h.mu.Lock()
	h.mode = mode
	h.mu.Unlock()
	return mode, nil
}

// work is the lane's worker goroutine: it sends subscriptions, replaces a
// broken connection and re-reads records. It exits when h.stop is closed.
func (l *lane) work() {
	defer l.h.wg.Done()
	h := l.h
	every := recheckRounds
	if h.hooks.recheck > 0 {
		every = h.hooks.recheck
	}
	recheck := time.NewTicker(h.timeout)
	defer recheck.Stop()
	round := 0
	var backoff time.Duration
	for {
		select {
		case <-h.stop:
			return
		case <-l.kick:
		case <-recheck.C:
			round++
			l.recheck(round%every, every)
		}
		err := l.flush()
		if err == nil {
			err = l.reread()
		}
		if err != nil {
			h.out.fail(l, err)
			if !h.pause(l, &backoff) {
				return
			}
			l.poke() // retry what is left
			continue
		}
		backoff = 0
	}
}

// recheck queues for a re-read the waited records whose turn is turn (of
// every): each is re-read once in every rounds.
func (l *lane) recheck(turn, every int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch, e := range l.waiting {
		if e.turn%every == turn {
			l.confirmed[ch] = true
		}
	}
}

// flush replaces a broken connection and sends the queued SUBSCRIBE and
// UNSUBSCRIBE commands. A channel handed to go-redis stays subscribed in
// its PubSub even when sending failed: the reader's reconnect subscribes it
// again, and its confirmation triggers the re-read.
func (l *lane) flush() error {
	h := l.h
	l.mu.Lock()
	if l.broken != nil && l.broken != l.ps {
		l.broken = nil // already replaced
	}
	if l.broken != nil {
		old := l.ps
		l.ps = nil
		l.broken = nil
		clear(l.live)
		clear(l.unsubs)
		for ch := range l.waiting {
			l.subs[ch] = struct{}{}
		}
		l.changed()
		l.mu.Unlock()
		_ = old.Close()
		l.mu.Lock()
	}
	if len(l.subs) == 0 && len(l.unsubs) == 0 {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	mode, err := h.probe()
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	subs := keysOf(l.subs)
	unsubs := keysOf(l.unsubs)
	clear(l.subs)
	clear(l.unsubs)
	ps, fresh := l.ps, false
	if ps == nil {
		if len(subs) == 0 {
			l.mu.Unlock()
			return nil // nothing to listen to: no connection needed
		}
		if mode == "sharded" {
			ps = h.s.rdb.SSubscribe(h.ctx)
		} else {
			ps = h.s.rdb.Subscribe(h.ctx)
		}
		fresh = true
	}
	l.mu.Unlock()

	// On a Cluster every channel of one SSUBSCRIBE must be in one slot,
	// and each request has its own.
	size := subscribeBatch
	if h.cluster != nil {
		size = 1
	}
	var first error
	for start := 0; start < len(subs); start += size {
		batch := subs[start:min(start+size, len(subs))]
		var err error
		if mode == "sharded" {
			err = ps.SSubscribe(h.ctx, batch...)
		} else {
			err = ps.Subscribe(h.ctx, batch...)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("subscribe: %w", err)
		}
	}
	if fresh {
		// Published only now, with channels recorded: a Cluster PubSub
		// connects to the master of its first channel's slot.
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = ps.Close()
			return nil
		}
		l.ps = ps
		l.changed()
		if !l.reading {
			l.reading = true
			h.wg.Add(1)
			go l.read()
		}
		l.mu.Unlock()
	}
	for start := 0; start < len(unsubs); start += size {
		batch := unsubs[start:min(start+size, len(unsubs))]
		var err error
		if mode == "sharded" {
			err = ps.SUnsubscribe(h.ctx, batch...)
		} else {
			err = ps.Unsubscribe(h.ctx, batch...)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("unsubscribe: %w", err)
		}
	}
	return first
}

// changed tells the reader that l.ps changed. l.mu must be held.
func (l *lane) changed() {
	close(l.psChanged)
	l.psChanged = make(chan struct{})
}

func keysOf(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// reread reads the status of every confirmed channel's record and whether
// its wake list exists (pipelined) and delivers the final ones; the others
// become live. After a subscription a final record is delivered only once
// its wake-up was pushed: a decision whose owner has not woken the waiters
// yet (the lifecycle owner audits before Store.Wake) is left
// to the hint that follows. The safety-net recheck delivers any final
// record (a wake-up that never came). On an error the unread ones stay
// queued.
func (l *lane) reread() error {
	h := l.h
	l.mu.Lock()
	chans := make([]string, 0, len(l.confirmed))
	ids := make([]string, 0, len(l.confirmed))
	force := make([]bool, 0, len(l.confirmed))
	for ch, f := range l.confirmed {
		if e := l.waiting[ch]; e != nil {
			chans = append(chans, ch)
			ids = append(ids, e.id)
			force = append(force, f)
		}
	}
	clear(l.confirmed)
	l.mu.Unlock()
	if len(chans) == 0 {
		return nil
	}
	requeue := func(from int) {
		l.mu.Lock()
		for i, ch := range chans[from:] {
			if l.waiting[ch] != nil {
				l.confirmed[ch] = l.confirmed[ch] || force[from+i]
			}
		}
		l.mu.Unlock()
	}
	for start := 0; start < len(ids); start += rereadPage {
		end := min(start+rereadPage, len(ids))
		cmds := make([]*redis.StringCmd, 0, end-start)
		woken := make([]*redis.IntCmd, 0, end-start)
		_, err := h.s.rdb.Pipelined(h.ctx, func(p redis.Pipeliner) error {
			for i, id := range ids[start:end] {
				cmds = append(cmds, p.HGet(h.ctx, h.s.k.request(id), fStatus))
				var w *redis.IntCmd
				if !force[start+i] { // the safety net delivers any final record
					w = p.Exists(h.ctx, h.s.k.wake(ids[start+i]))
				}
				woken = append(woken, w)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			requeue(start)
			return fmt.Errorf("re-read records: %w", err)
		}
		for i, c := range cmds {
			ch := chans[start+i]
			st, err := c.Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				requeue(start + i)
				return fmt.Errorf("re-read %s: %w", ids[start+i], err)
			}
			final := err == nil && st != string(approval.StatusPending)
			if err == nil && !(final && (force[start+i] || woken[i].Val() > 0)) {
				l.mu.Lock()
				if l.waiting[ch] != nil {
					l.live[ch] = struct{}{}
				}
				l.mu.Unlock()
				continue // pending, or final with its wake-up still to come
			}
			if err := l.settle(ch, ids[start+i]); err != nil {
				requeue(start + i)
				return err
			}
		}
	}
	if h.hooks.round != nil {
		l.mu.Lock()
		n := len(l.live)
		l.mu.Unlock()
		h.hooks.round(l.idx, n)
	}
	return nil
}

// settle reads id's record and delivers it to ch's waiters when it is
// final or missing. A pending record (a stray hint) changes nothing.
func (l *lane) settle(ch, id string) error {
	f, err := l.h.s.rdb.HGetAll(l.h.ctx, l.h.s.k.request(id)).Result()
	if err != nil {
		return fmt.Errorf("read %s: %w", id, err)
	}
	l.settled(ch, f)
	return nil
}

// settled delivers record fields f to ch's waiters when the record is
// final, ErrNotFound when it is missing (no fields); a pending record (a
// stray hint) changes nothing.
func (l *lane) settled(ch string, f map[string]string) {
	switch {
	case len(f) == 0:
		l.deliver(ch, delivery{err: approval.ErrNotFound})
	case f[fStatus] != string(approval.StatusPending):
		l.deliver(ch, delivery{fields: f})
	}
}

// decodeSnapshot decodes a hint that carries its record (luaHint's
// snapshot: "*", then each field and value as its length in bytes, ":"
// and the bytes); false for any other hint (a status, published by an
// older process) or a malformed one, which the hub answers by reading the
// record.
func decodeSnapshot(msg string) (map[string]string, bool) {
	rest, ok := strings.CutPrefix(msg, "*")
	if !ok {
		return nil, false
	}
	n := 0
	if !snapshotPairs(rest, func(_, _ string) { n++ }) {
		return nil, false
	}
	f := make(map[string]string, n) // sized: the map is most of a wake-up's garbage
	snapshotPairs(rest, func(k, v string) { f[k] = v })
	return f, true
}

// snapshotFields reads the fields decodeFields needs from a snapshot (see
// decodeSnapshot) without building its map; false when it is not one.
func snapshotFields(msg string) (recordFields, bool) {
	var rf recordFields
	rest, ok := strings.CutPrefix(msg, "*")
	if !ok {
		return rf, false
	}
	ok = snapshotPairs(rest, func(k, v string) { rf.set(k, v) })
	return rf, ok
}

// snapshotPairs calls pair with each field and value of a snapshot's body
// (after the "*"), in order, as substrings of it; false when it is
// malformed.
func snapshotPairs(rest string, pair func(k, v string)) bool {
	var item [2]string
	for n := 0; rest != ""; n++ {
		size, tail, ok := strings.Cut(rest, ":")
		l, err := strconv.Atoi(size)
		if !ok || err != nil || l < 0 || l > len(tail) {
			return false
		}
		item[n%2], rest = tail[:l], tail[l:]
		if n%2 == 1 {
			pair(item[0], item[1])
		} else if rest == "" {
			return false // a field without its value
		}
	}
	return true
}

// read is the lane's reader goroutine: it receives hints and subscription
// confirmations on the lane's current connection. It exits when h.stop is
// closed.
func (l *lane) read() {
	h := l.h
	defer h.wg.Done()
	var (
		backoff time.Duration
		pinged  bool
	)
	for {
		l.mu.Lock()
		ps, changed := l.ps, l.psChanged
		if ps == l.broken {
			ps = nil // the worker replaces it
		}
		l.mu.Unlock()
		if ps == nil {
			select {
			case <-h.stop:
				return
			case <-changed:
				continue
			}
		}
		msg, err := ps.ReceiveTimeout(h.ctx, h.timeout)
		select {
		case <-h.stop:
			return
		default:
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if !pinged {
					pinged = true
					if h.hooks.round != nil {
						l.mu.Lock()
						n := len(l.live)
						l.mu.Unlock()
						h.hooks.round(l.idx, n)
					}
					if err := ps.Ping(h.ctx); err == nil {
						continue
					}
				}
				err = fmt.Errorf("no reply to PING within %v", h.timeout)
			}
			pinged = false
			h.out.fail(l, err)
			if !h.pause(l, &backoff) {
				return
			}
			l.mu.Lock()
			if l.ps == ps {
				l.broken = ps
			}
			l.mu.Unlock()
			l.poke()
			continue
		}
		pinged = false
		backoff = 0
		h.out.ok(l)
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
				continue
			}
			l.mu.Lock()
			_, ok := l.waiting[m.Channel]
			if ok {
				l.confirmed[m.Channel] = l.confirmed[m.Channel] // keep a pending recheck
			}
			l.mu.Unlock()
			if ok {
				l.poke()
			}
		case *redis.Message:
			l.hint(m.Channel, m.Payload)
		}
	}
}

// hint delivers the record behind a hint when it is final: the record
// the hint carries (luaHint's snapshot, read by the script that pushed the
// wake-up) when it is the one the waiters read (trusted), otherwise the
// record read again. A hint for a channel nobody waits on, or whose record
// is pending, is ignored; a read error queues the record for the worker's
// re-read.
func (l *lane) hint(ch, payload string) {
	l.mu.Lock()
	e := l.waiting[ch]
	var base uint64
	if e != nil {
		base = e.base
	}
	l.mu.Unlock()
	if e == nil {
		return
	}
	if f, ok := decodeSnapshot(payload); ok && len(f) > 0 && base != 0 && baseSum(f[fBase]) == base {
		l.settled(ch, f)
		return
	}
	// No record in the hint (an older process's, or a record that
	// vanished), or not the record the waiters read (a wake-up is never
	// authority: see hub): only a read of the record itself tells.
	if err := l.settle(ch, e.id); err != nil {
		l.mu.Lock()
		if l.waiting[ch] != nil {
			l.confirmed[ch] = true // a hint came: the wake-up was pushed
		}
		l.mu.Unlock()
		l.poke()
	}
}

// pause waits out the next backoff step; false means the hub is stopping.
func (h *hub) pause(l *lane, backoff *time.Duration) bool {
	*backoff = min(max(2**backoff, minBackoff), max(min(h.timeout, maxBackoff), minBackoff))
	if h.hooks.backoff != nil {
		h.hooks.backoff(l.idx, *backoff)
	}
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-h.stop:
		return false
	case <-t.C:
		return true
	}
}

// waits is the number of requests the hub's lanes wait on.
func (h *hub) waits() int {
	h.mu.Lock()
	lanes := append([]*lane(nil), h.order...)
	h.mu.Unlock()
	n := 0
	for _, l := range lanes {
		l.mu.Lock()
		n += len(l.waiting)
		l.mu.Unlock()
	}
	return n
}

// outage logs a loss of Redis once, with the number of waits it affects,
// and its end once every lane is back.
type outage struct {
	h *hub
	// mu guards down and since.
	mu    sync.Mutex
	down  map[*lane]struct{}
	since time.Time
}

func (o *outage) fail(l *lane, err error) {
	if o.h.ctx.Err() != nil {
		return // closing
	}
	o.mu.Lock()
	first := len(o.down) == 0
	if o.down == nil {
		o.down = map[*lane]struct{}{}
	}
	o.down[l] = struct{}{}
	if first {
		o.since = time.Now()
	}
	o.mu.Unlock()
	if first {
		o.h.s.log.Warn("store: wake hub lost Redis; waits resume when it is back", "waits", o.h.waits(), "err", err)
	}
}

func (o *outage) ok(l *lane) {
	o.mu.Lock()
	_, was := o.down[l]
	delete(o.down, l)
	last := was && len(o.down) == 0
	since := o.since
	o.mu.Unlock()
	if last {
		o.h.s.log.Info("store: wake hub reconnected; waited records are re-read", "waits", o.h.waits(), "down_for", time.Since(since).Round(time.Millisecond))
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
	lanes := append([]*lane(nil), h.order...)
	h.mu.Unlock()
	h.cancel()
	for _, l := range lanes {
		l.mu.Lock()
		l.closed = true
		ps := l.ps
		l.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
	}
	h.wg.Wait()
	for _, l := range lanes {
		l.mu.Lock()
		chans := make([]string, 0, len(l.waiting))
		for ch := range l.waiting {
			chans = append(chans, ch)
		}
		l.mu.Unlock()
		for _, ch := range chans {
			l.deliver(ch, delivery{err: ErrClosed})
		}
	}
}
