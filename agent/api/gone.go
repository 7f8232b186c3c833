package api

// This file: withdrawing the request of a caller that went away. A long
// poll sent with withdraw_if_gone=true — a hook's: it waits without a
// pause until it has its answer — that ends without the decision
// (dropped: the caller hung up or was killed; or answered "pending" when
// its wait ran out) and is followed by no other poll of the request,
// from this process or any other, within the grace period
// (Options.WithdrawGrace) withdraws the request: the lifecycle cancels
// it, audits it and redraws its card, which says the caller gave up and
// nothing ran. A request asked for with withdraw_if_gone=true is watched
// from its answer on: a caller killed before its first poll is gone too.
// Callers that poll now and then never send the parameter and are never
// withdrawn.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// DefaultWithdrawGrace is how long a caller that asked to be withdrawn
// when gone has to poll again after a poll ended without its answer.
const DefaultWithdrawGrace = 5 * time.Second

// pollCountTTL is how long a request's poll count is kept after its last
// poll began: far longer than a poll (MaxWait) and a grace period.
const pollCountTTL = time.Hour

// Polls counts the long polls begun on each request. *store.Polls counts
// for every process of the deployment, so that a caller whose connection
// dropped and who polls again through another replica is seen to be back.
type Polls interface {
	// Begin counts one more poll of request id and returns the count.
	Begin(ctx context.Context, id string) (int64, error)
	// Count returns how many polls of request id have begun (0 for none,
	// or when the count was last touched more than an hour ago).
	Count(ctx context.Context, id string) (int64, error)
}

// watch is an opted-in poll: the count Polls.Begin gave it, and its key.
type watch struct {
	seq int64
	key string
}

// gone is a request whose opted-in poll ended without its answer.
type gone struct {
	watch
	at time.Time // when the poll ended
}

// goneSet holds the requests whose callers may have gone.
type goneSet struct {
	mu sync.Mutex // guards m
	m  map[string]gone
}

// withdrawIfGone reads the query's withdraw_if_gone (true or false),
// refusing another value.
func (s *Server) withdrawIfGone(w http.ResponseWriter, r *http.Request, c call) (withdraw, ok bool) {
	switch q := r.URL.Query().Get("withdraw_if_gone"); q {
	case "", "false":
		return false, true
	case "true":
		return true, true
	default:
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: "withdraw_if_gone", Message: fmt.Sprintf("withdraw_if_gone %q is not true or false", q)})
		return false, false
	}
}

// asked notes that request id, pending, was just asked for (or asked for
// again) by a caller that asked to be withdrawn when gone: unless a poll
// of it begins within the grace period, the caller went before it could
// wait (killed while asking).
func (s *Server) asked(ctx context.Context, c call, id string) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), watchCountTimeout)
	defer cancel()
	n, err := s.polls.Count(wctx, id)
	if err != nil {
		s.log.Warn("api request not watched: it will not be withdrawn if the caller goes before it polls", "request_id", id, "http_request_id", c.id, "key", c.keyName(), "err", err)
		return
	}
	s.pollEnded(id, &watch{seq: n, key: c.keyName()}, false)
}

// watchCountTimeout bounds a poll's count, which outlives the caller's
// request (beginWatch).
const watchCountTimeout = 2 * time.Second

// beginWatch counts the opted-in poll of request id that starts now. It
// returns nil when the count cannot be kept (the poll goes on, without
// withdrawal: the request then waits for its deadline, as before).
func (s *Server) beginWatch(ctx context.Context, c call, id string) *watch {
	// Counted even when the caller goes while it is counted (a process
	// killed just after it sent the poll): a count cut short could have
	// been kept by Redis all the same, and the poll, unwatched, would then
	// hide the caller's going, so its request would never be withdrawn.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), watchCountTimeout)
	defer cancel()
	n, err := s.polls.Begin(wctx, id)
	if err != nil {
		s.log.Warn("api poll not watched: its request will not be withdrawn if the caller goes", "request_id", id, "http_request_id", c.id, "key", c.keyName(), "err", err)
		return nil
	}
	return &watch{seq: n, key: c.keyName()}
}

// pollEnded notes that an opted-in poll (w; nil when not opted in)
// ended, with the decision (final) or without it.
func (s *Server) pollEnded(id string, w *watch, final bool) {
	if w == nil || final || s.stopping() {
		return // a poll this process ends as it stops: its caller asks another
	}
	s.gone.mu.Lock()
	if g, ok := s.gone.m[id]; !ok || g.seq <= w.seq {
		s.gone.m[id] = gone{watch: *w, at: s.now()}
	}
	s.gone.mu.Unlock()
	if s.onGone != nil {
		s.onGone(id)
	}
}

// goneWhy is the reason of a request withdrawn because its caller went.
func goneWhy(key string, grace time.Duration) string {
	return fmt.Sprintf("The caller gave up: it stopped waiting for the decision and did not come back within %s (key %s); nothing ran", duration.Format(grace), key)
}

// WithdrawDue withdraws the requests whose callers went away: an opted-in
// poll ended without the decision at least the grace period ago and no
// poll of the request began since, here or in another process. A request
// decided meanwhile is left as it is. It returns how many it withdrew.
// RunWithdrawals calls it; tests call it after moving the clock.
func (s *Server) WithdrawDue(ctx context.Context) int {
	if s.stopping() {
		// The polls this process released as it stops are not callers
		// gone: they poll again, elsewhere or after the restart.
		return 0
	}
	now := s.now()
	var due []string
	s.gone.mu.Lock()
	for id, g := range s.gone.m {
		if now.Sub(g.at) >= s.grace {
			due = append(due, id)
		}
	}
	s.gone.mu.Unlock()
	n := 0
	for _, id := range due {
		if s.withdrawGone(ctx, id) {
			n++
		}
	}
	if p, ok := s.polls.(*localPolls); ok {
		p.prune(now)
	}
	return n
}

// stopping reports whether the process is stopping (Release was called).
func (s *Server) stopping() bool {
	s.parkedMu.Lock()
	defer s.parkedMu.Unlock()
	return s.released
}

// withdrawGone withdraws request id if its caller is still gone.
func (s *Server) withdrawGone(ctx context.Context, id string) bool {
	s.gone.mu.Lock()
	g, ok := s.gone.m[id]
	s.gone.mu.Unlock()
	if !ok {
		return false
	}
	n, err := s.polls.Count(ctx, id)
	if err != nil {
		s.log.Warn("api poll count unreadable; withdrawal tried again", "request_id", id, "key", g.key, "err", err)
		return false // kept: tried again at the next sweep
	}
	s.gone.mu.Lock()
	if cur, ok := s.gone.m[id]; ok && cur.seq == g.seq {
		delete(s.gone.m, id)
	}
	s.gone.mu.Unlock()
	if n > g.seq {
		return false // a poll began since: the caller is back
	}
	_, err = s.life.Cancel(ctx, id, "countersign", goneWhy(g.key, s.grace))
	if _, decided := errors.AsType[*approval.DecidedError](err); decided || errors.Is(err, approval.ErrNotFound) {
		return false // decided (or gone) first: nothing to withdraw
	}
	if err != nil {
		s.log.Error("api request of a caller that went away not withdrawn; it waits for its deadline", "request_id", id, "key", g.key, "err", err)
		return false
	}
	s.log.Info("api request withdrawn: its caller went away", "request_id", id, "key", g.key, "grace", s.grace)
	return true
}

// RunWithdrawals calls WithdrawDue every half grace period until ctx
// ends; it returns when ctx is done.
func (s *Server) RunWithdrawals(ctx context.Context) {
	tick, stop := s.ticker(max(s.grace/2, 100*time.Millisecond))
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			s.WithdrawDue(ctx)
		}
	}
}

// localPolls is the Polls of one process, used when Options.Polls is nil:
// a caller that comes back through another process is not seen.
type localPolls struct {
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]*pollCount
}

type pollCount struct {
	n    int64
	last time.Time
}

var _ Polls = (*localPolls)(nil)

func newLocalPolls(now func() time.Time) *localPolls {
	return &localPolls{now: now, m: map[string]*pollCount{}}
}

// Begin implements Polls; it never fails.
func (p *localPolls) Begin(_ context.Context, id string) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.m[id]
	if c == nil {
		c = &pollCount{}
		p.m[id] = c
	}
	c.n++
	c.last = p.now()
	return c.n, nil
}

// Count implements Polls; it never fails.
func (p *localPolls) Count(_ context.Context, id string) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.m[id]; c != nil {
		return c.n, nil
	}
	return 0, nil
}

// prune forgets the counts last touched more than pollCountTTL ago.
func (p *localPolls) prune(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, c := range p.m {
		if now.Sub(c.last) > pollCountTTL {
			delete(p.m, id)
		}
	}
}
