package bot

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
)

// Card redraw policy.
const (
	// cardUpdateWaits bounds the rate-limit waits of one chat.update
	// attempt; past it the writer backs off and tries again later.
	cardUpdateWaits = 4
	// cardRetryFirst and cardRetryMax bound the back-off between attempts
	// to redraw a card that could not be updated.
	cardRetryFirst = 2 * time.Second
	cardRetryMax   = 5 * time.Minute
	// defaultCardWriters bounds the cards redrawn at once.
	defaultCardWriters = 16
)

// cardWriter is the one writer of approval cards in this process. Every
// redraw of a request's card goes through Refresh: redraws of one card are
// serialised and coalesced (a refresh asked while one is in flight makes
// exactly one more), each is rendered from the durable record read just
// before sending, so an older state is never drawn after a newer one; a
// card that could not be updated is tried again with back-off until it
// shows the latest state. The rate limits of chat.update are shared by
// every goroutine of the process (Bot.retryLimited).
type cardWriter struct {
	// draw renders request id's card from its record and sends it
	// (Bot.drawCard); hint is the latest copy a caller gave.
	draw   func(ctx context.Context, id string, hint *approval.Request) error
	sleep  func(ctx context.Context, d time.Duration) error // the bot's clock
	log    *slog.Logger
	slots  chan struct{} // bounds writers sending at once
	settle time.Duration // Options.CardSettle: the first redraw waits this long

	mu      sync.Mutex      // guards root, backoff, stop, closing and jobs
	root    context.Context // the bot's work context: sends end with it
	backoff context.Context // back-off waits end with it, at Close
	stop    context.CancelFunc
	closing bool
	jobs    map[string]*cardJob
	drawn   map[string]*approval.Request // last copy drawn per pending card, to show a loss
	idle    chan struct{}                // closed while jobs is empty

	wg sync.WaitGroup // counts writer goroutines
}

// cardJob is the redraw state of one card.
type cardJob struct {
	hint  *approval.Request // the latest copy a caller gave
	dirty bool              // a redraw was asked after the last one started
}

// newCardWriter returns a writer of at most n cards at once (default
// defaultCardWriters) that draws with draw. It holds the bot's functions,
// not the bot: the writer is a part of the bot that never calls back into
// the rest of it.
func newCardWriter(draw func(ctx context.Context, id string, hint *approval.Request) error,
	sleep func(ctx context.Context, d time.Duration) error, log *slog.Logger, n int, settle time.Duration) *cardWriter {
	n = option.PositiveOr(n, defaultCardWriters)
	idle := make(chan struct{})
	close(idle)
	return &cardWriter{draw: draw, sleep: sleep, log: log, slots: make(chan struct{}, n), settle: settle, jobs: map[string]*cardJob{}, idle: idle,
		drawn: map[string]*approval.Request{}}
}

// maxDrawn bounds the copies kept to draw lost requests.
const maxDrawn = 10000

// drew remembers r as drawn while it may still be lost (pending or
// approved), forgets it once it is past that.
func (w *cardWriter) drew(r *approval.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch r.Status {
	case approval.StatusPending, approval.StatusApproved, approval.StatusExecuting:
		if len(w.drawn) >= maxDrawn {
			clear(w.drawn) // bounded memory; at worst a lost card is drawn thinner
		}
		w.drawn[r.ID] = r
	default:
		delete(w.drawn, r.ID)
	}
}

// forget drops the copy drawn of request id when it was drawn on c (a
// card deleted as not the request's).
func (w *cardWriter) forget(id string, c approval.CardRef) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.drawn[id]; d != nil && d.Card == c {
		delete(w.drawn, id)
	}
}

// boundAt keeps r, the record as read once its card was bound (at its
// revision, Request.Rev > 0), as the copy drawn on that card: what the
// card shows, so a click on it may be decided on it (current). The link
// to the task thread the card was drawn with is kept.
func (w *cardWriter) boundAt(r *approval.Request) {
	if r.Rev == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.drawn[r.ID]
	if d == nil || d.Card != r.Card || d.Rev >= r.Rev {
		return
	}
	c := *r
	c.Origin.Permalink = cmp.Or(c.Origin.Permalink, d.Origin.Permalink)
	w.drawn[r.ID] = &c
}

// current returns the copy this process drew of request id when it may be
// decided on without reading the record: pending, at a stored revision,
// and drawn on its bound card. Nil otherwise. Whether it is still the
// record is the decision's to find (approval.Decision.Rev).
func (w *cardWriter) current(id string) *approval.Request {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.drawn[id]
	if d == nil || d.Rev == 0 || d.Status != approval.StatusPending || !d.Card.Bound() {
		return nil
	}
	return d
}

func (w *cardWriter) lastDrawn(id string) *approval.Request {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drawn[id]
}

// removeLocked forgets id's job; w.mu is held.
func (w *cardWriter) removeLocked(id string) {
	delete(w.jobs, id)
	if len(w.jobs) == 0 {
		close(w.idle)
	}
}

// start gives the writer its context (the bot's work context).
func (w *cardWriter) start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.root = ctx
	w.backoff, w.stop = context.WithCancel(ctx)
}

// wait stops back-off retries and waits for the writers in flight.
func (w *cardWriter) wait() {
	w.mu.Lock()
	w.closing = true
	if w.stop != nil {
		w.stop()
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *cardWriter) refresh(r *approval.Request) {
	if r == nil || r.ID == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.root == nil {
		w.log.Warn("card refresh before the bot started; dropped", "request_id", r.ID)
		return
	}
	if w.closing && len(w.jobs) == 0 {
		// Close is waiting for the writers and none is left to take this
		// redraw: a new writer now would race that wait (a transition that
		// ends after the bot stopped, e.g. a run finishing at shutdown).
		// The record is the truth; the card is redrawn at its next change.
		w.log.Warn("card refresh after the bot closed; dropped", "request_id", r.ID, "status", r.Status)
		return
	}
	if j, ok := w.jobs[r.ID]; ok {
		j.dirty = true
		j.hint = newer(j.hint, r)
		return
	}
	if len(w.jobs) == 0 {
		w.idle = make(chan struct{})
	}
	w.jobs[r.ID] = &cardJob{hint: r, dirty: true}
	w.wg.Add(1)
	// Exits when the card shows the latest state asked for, or when the
	// bot's context ends, or at Close after a failed attempt.
	go w.run(r.ID)
}

// newer is cur, keeping old's card location when cur does not know it.
func newer(old, cur *approval.Request) *approval.Request {
	if old != nil && old.Card.Bound() && !cur.Card.Bound() {
		c := *cur
		c.Card = old.Card
		return &c
	}
	return cur
}

func (w *cardWriter) run(id string) {
	defer w.wg.Done()
	w.mu.Lock()
	ctx, backoff := w.root, w.backoff
	w.mu.Unlock()
	if w.settle > 0 {
		// Redraws asked meanwhile join this one (the job exists). Cut
		// short at Close, which still draws what was asked.
		_ = w.sleep(backoff, w.settle)
	}
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		w.drop(id)
		return
	}
	defer func() { <-w.slots }()
	wait := cardRetryFirst
	for {
		w.mu.Lock()
		j := w.jobs[id]
		if !j.dirty {
			w.removeLocked(id)
			w.mu.Unlock()
			return
		}
		j.dirty = false
		hint := j.hint
		w.mu.Unlock()

		err := w.draw(ctx, id, hint)
		if err == nil {
			wait = cardRetryFirst
			continue
		}
		w.mu.Lock()
		j.dirty = true // not drawn: the next round draws the latest state
		closing := w.closing
		w.mu.Unlock()
		if ctx.Err() != nil || closing {
			w.log.Error("approval card not brought up to date", "request_id", id, "err", err)
			w.drop(id)
			return
		}
		w.log.Warn("approval card not updated; trying again", "request_id", id, "in", wait, "err", err)
		if w.sleep(backoff, wait) != nil {
			w.log.Error("approval card not brought up to date", "request_id", id, "err", err)
			w.drop(id)
			return
		}
		wait = min(wait*2, cardRetryMax)
	}
}

// again asks the writer drawing card id for one more round (stillDrawn).
func (w *cardWriter) again(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if j, ok := w.jobs[id]; ok {
		j.dirty = true
	}
}

func (w *cardWriter) drop(id string) {
	w.mu.Lock()
	w.removeLocked(id)
	w.mu.Unlock()
}
