package slacksim

import (
	"context"
	"sync"
)

// holds are the answers held back by HoldAnswer. The zero value holds
// nothing.
type holds struct {
	mu     sync.Mutex         // guards next and all
	next   map[string][]*hold // by method: holds for its next calls, in order
	all    []*hold            // every hold made, to release them at Close
	closed bool               // Close released everything; new holds hold nothing
}

// hold is one held answer.
type hold struct {
	params   map[string]string // the call's parameters must include these
	taken    chan struct{}     // closed once a call took effect and waits
	released chan struct{}     // closed by release
	once     sync.Once
}

func (h *hold) release() { h.once.Do(func() { close(h.released) }) }

// matches reports whether a call with parameters p is the one h holds.
func (h *hold) matches(p params) bool {
	for k, v := range h.params {
		if p[k] != v {
			return false
		}
	}
	return true
}

// HoldAnswer holds back Slack's answer to the next call of method whose
// parameters include params (nil: any call; e.g. {"channel": id} holds
// only a post in that channel): the call takes effect at once (a posted message is on screen, clickable and
// in conversations.history), only its HTTP answer waits until release is
// called — as when Slack is slow to answer chat.postMessage while the
// message already shows. taken is closed once the call took effect and
// its answer waits. release is safe to call more than once; Close releases
// every held answer, and a caller that gives up (its context ends) gets
// no answer at all, as with a connection dropped.
func (w *Workspace) HoldAnswer(method string, params map[string]string) (taken <-chan struct{}, release func()) {
	h := &hold{params: params, taken: make(chan struct{}), released: make(chan struct{})}
	w.holds.mu.Lock()
	defer w.holds.mu.Unlock()
	if w.holds.closed {
		h.release()
	}
	if w.holds.next == nil {
		w.holds.next = map[string][]*hold{}
	}
	w.holds.next[method] = append(w.holds.next[method], h)
	w.holds.all = append(w.holds.all, h)
	return h.taken, h.release
}

// wait holds the answer of a call of method with parameters p that took
// effect, when a hold is waiting for it, until the hold is released or ctx
// ends.
func (s *holds) wait(ctx context.Context, method string, p params) {
	s.mu.Lock()
	var h *hold
	q := s.next[method]
	for i, c := range q {
		if c.matches(p) {
			h = c
			s.next[method] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if h == nil {
		return
	}
	close(h.taken)
	select {
	case <-h.released:
	case <-ctx.Done():
	}
}

// releaseAll lets every held answer go (Close).
func (s *holds) releaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, h := range s.all {
		h.release()
	}
}
