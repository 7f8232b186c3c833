package agent

// This file: the worker pool. MaxRuns slots bound the runs doing model or
// tool work at once; a run that waits for decisions gives its slot back and
// takes one again when a decision arrives, so the number of waiting runs
// is bounded by memory only (a parked goroutine, its lease heartbeat and a
// registration in the store's wake hub). Runs beyond the bound wait in a
// FIFO queue of at most MaxQueued; the task thread is told its place.

import (
	"context"
	"fmt"
	"sync"

	"github.com/countersign/countersign/approval"
)

// admission is what admit did with a run.
type admission int

const (
	admitStarted admission = iota // a slot is reserved for it: launch it
	admitOn                       // a worker is on it and will look at its inbox again
	admitQueued                   // it waits in the queue for a slot
	admitFull                     // the queue is full: refused
	admitClosed                   // the agent is closed
)

// admit reserves a slot for run id, or queues it when the pool is full.
// For admitQueued it returns how many runs are ahead of it. After
// admitStarted the caller must launch (or unreserve) the run.
func (a *Agent) admit(id string) (admission, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return admitClosed, 0
	}
	if _, on := a.owned[id]; on {
		// A worker is on this run, possibly past its last look at the
		// inbox (or parked on decisions): make it look again before it
		// leaves.
		a.owned[id] = true
		return admitOn, 0
	}
	if i := a.queuedAt(id); i >= 0 {
		return admitQueued, i
	}
	if len(a.queue) == 0 {
		select {
		case a.slots <- struct{}{}:
			a.owned[id] = false
			return admitStarted, 0
		default:
		}
	}
	if len(a.queue) >= a.maxQueued {
		return admitFull, 0
	}
	a.queue = append(a.queue, id)
	return admitQueued, len(a.queue) - 1
}

// queuedAt returns run id's place in the queue, -1 when not queued. a.mu
// must be held.
func (a *Agent) queuedAt(id string) int {
	for i, q := range a.queue {
		if q == id {
			return i
		}
	}
	return -1
}

// unadmit undoes an admission whose task could not be queued in Redis.
func (a *Agent) unadmit(id string, how admission) {
	a.mu.Lock()
	switch how {
	case admitStarted:
		delete(a.owned, id)
		a.mu.Unlock()
		a.freeSlot()
		return
	case admitQueued:
		if i := a.queuedAt(id); i >= 0 {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
		}
	}
	a.mu.Unlock()
}

// freeSlot gives a slot back and starts queued runs while slots are free.
// A run blocked taking a slot back for its decision gets the slot first.
func (a *Agent) freeSlot() {
	<-a.slots
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.queue) > 0 && !a.closed {
		select {
		case a.slots <- struct{}{}:
		default:
			return
		}
		id := a.queue[0]
		a.queue = a.queue[1:]
		a.owned[id] = false
		a.launch(id, false)
	}
}

// launch starts the worker of run id, for which admit reserved a slot.
// a.mu must be held.
func (a *Agent) launch(id string, leased bool) {
	a.wg.Add(1)
	go func() { // exits when the run is idle, stopped, or the agent closes
		defer a.wg.Done()
		sh := &share{a: a, n: 1} // the slot admit reserved
		for {
			a.work(sh, id, leased)
			leased = false
			a.mu.Lock()
			if a.owned[id] && a.ctx.Err() == nil {
				a.owned[id] = false
				a.mu.Unlock()
				continue
			}
			break
		}
		delete(a.owned, id) // a.mu is held
		backlog := a.backlog && len(a.queue) == 0
		if backlog {
			a.backlog = false
		}
		a.mu.Unlock()
		sh.give()
		if backlog && a.ctx.Err() == nil {
			// Runs were turned away while the queue was full: take them
			// now rather than at the next periodic Resume.
			if _, err := a.Resume(a.ctx); err != nil && a.ctx.Err() == nil {
				a.log.Warn("resume backlog", "err", err)
			}
		}
	}()
}

// queued tells the task thread its place in the queue and logs it once.
// t is the task's thread, nil for a run adopted without a task in hand.
func (a *Agent) queued(ctx context.Context, id string, t *approval.Origin, ahead int) {
	a.log.InfoContext(ctx, "run pool full; run queued", "run_id", id, "ahead", ahead, "max_runs", cap(a.slots))
	if t == nil {
		return
	}
	text := fmt.Sprintf("⏳ Queued — %d ahead of you. All %d workers are busy; your task starts on its own when one is free.", ahead, cap(a.slots))
	if ahead == 0 {
		text = fmt.Sprintf("⏳ Queued — next in line. All %d workers are busy; your task starts on its own when one is free.", cap(a.slots))
	}
	if err := a.notify.Say(ctx, *t, text); err != nil {
		a.log.WarnContext(ctx, "say queued", "run_id", id, "err", err)
	}
}

// share is a run's hold on one pool slot, shared by the run's goroutines:
// the slot is taken when the first of them needs it and given back when
// the last is done, so a run holds at most one slot and none while it only
// waits for decisions.
type share struct {
	a  *Agent
	mu sync.Mutex // guards n; held while taking a slot, so one goroutine blocks for the run
	n  int        // goroutines of the run holding the slot
}

// take joins the run's hold, taking a slot first when the run has none
// (blocking until one is free or ctx ends).
func (s *share) take(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		select {
		case s.a.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.n++
	return nil
}

// give leaves the run's hold; the last to leave gives the slot back.
func (s *share) give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
	if s.n == 0 {
		s.a.freeSlot()
	}
}
