package api

// This file: parked long polls. A GET /v1/requests/{id}?wait= held on an
// HTTP/1.1 connection is taken from net/http (hijacked) and parked: the
// connection, the request's id and key, and one goroutine blocked reading
// the connection with the wait's deadline — no handler, no net/http
// buffers, no Wait goroutine. The store's wake hub calls back when the
// request is final (Requests.Watch); the read is woken, the answer written
// on the connection, and the connection handed back to the HTTP server for
// the caller's next request (Options.Reuse), or closed.
//
// A parked poll costs about a fifth of a held handler's memory (see
// BenchmarkLongPoll), which is what lets one process hold tens of
// thousands. Polls that cannot be parked (HTTP/2, a HEAD, a GET with a
// body, a writer that cannot be hijacked) are held in their handler as
// before; both answer the same bytes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
)

// Bounds of a parked poll.
const (
	// parkedWriteTimeout bounds the writing of a parked poll's answer: a
	// caller that does not read it loses the connection.
	parkedWriteTimeout = 10 * time.Second
	// parkedAnswerTimeout bounds what answering takes besides the write:
	// re-reading a request still pending, naming its approvers.
	parkedAnswerTimeout = 10 * time.Second
	// maxPipelined bounds what a caller may send while its poll is parked
	// (the next requests of an HTTP/1.1 pipeline, replayed to the server
	// after the answer); a caller that sends more loses the connection.
	maxPipelined = 64 << 10
)

// parked is one parked long poll.
type parked struct {
	s      *Server
	c      call
	id     string
	header []byte // the header lines the handlers set before the hijack (X-Request-Id), as written
	conn   net.Conn
	keep   bool   // the caller keeps the connection for its next request
	sent   []byte // bytes the caller sent after its request, replayed on reuse
	watch  *watch // the caller asked to be withdrawn when gone (gone.go); nil when not

	mu    sync.Mutex // guards the fields below
	done  bool       // got or err is the outcome
	got   *approval.Request
	err   error
	stop  func() // unregisters from the hub; nil once the outcome is in
	ended bool   // release: answer now
}

// parkable tells whether the poll r may be parked: a bodiless GET over
// HTTP/1.x on a writer that can be hijacked.
func parkable(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet || r.ProtoMajor != 1 || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	for {
		if _, ok := w.(http.Hijacker); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
}

// park holds the poll of request id (pending when read) on the wake hub
// until wait ends. It answers w itself and reports true, or reports false
// having written nothing when the poll cannot be parked: the caller holds
// it in the handler. wt is the poll's watch when its caller asked to be
// withdrawn when gone (nil when not).
func (s *Server) park(w http.ResponseWriter, r *http.Request, c call, id string, wait time.Duration, wt *watch) bool {
	if !parkable(w, r) {
		return false
	}
	p := &parked{s: s, c: c, id: id, keep: s.reuse != nil && !r.Close, watch: wt}
	deadline := time.Now().Add(wait)
	final, stop, err := s.req.Watch(r.Context(), id, p.ready)
	switch {
	case err != nil:
		// Ended without the decision (its caller killed while the
		// watch was set up, say): watched, it is withdrawn if nobody
		// polls again within the grace period.
		s.pollEnded(id, wt, false)
		s.fail(w, r, c, "wait", err)
		return true
	case final != nil:
		writeJSON(w, http.StatusOK, s.show(r.Context(), final))
		return true
	}
	p.mu.Lock()
	if !p.done {
		p.stop = stop
	}
	p.mu.Unlock()
	var head bytes.Buffer
	_ = w.Header().Write(&head)
	p.header = head.Bytes()
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable after all: hold the poll in the handler.
		p.unwatch()
		return false
	}
	if n := rw.Reader.Buffered(); n > 0 { // pipelined after the request
		b, _ := rw.Reader.Peek(n)
		p.sent = bytes.Clone(b)
	}
	s.waiting.Add(1)
	s.parkedMu.Lock()
	p.mu.Lock()
	p.conn = conn
	p.ended = s.released // parked while the process stops: answered at once
	p.mu.Unlock()
	s.parked[p] = struct{}{}
	s.parkedMu.Unlock()
	go p.hold(deadline) // ends with the answer, or when the caller goes away
	if s.onPark != nil {
		s.onPark(true)
	}
	return true
}

// ready is the hub's callback: the request is final (or the wait failed).
// It must not block: it records the outcome and wakes hold's read.
func (p *parked) ready(got *approval.Request, err error) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return
	}
	p.done, p.got, p.err, p.stop = true, got, err, nil
	conn := p.conn
	p.mu.Unlock()
	if conn != nil {
		_ = conn.SetReadDeadline(time.Now())
	}
}

// release makes hold answer now, with the request as it is.
func (p *parked) release() {
	p.mu.Lock()
	p.ended = true
	conn := p.conn
	p.mu.Unlock()
	_ = conn.SetReadDeadline(time.Now())
}

// unwatch unregisters from the hub unless the outcome is in.
func (p *parked) unwatch() {
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// hold is the parked poll's one goroutine: it reads the connection until
// the deadline, the outcome or a release, so a caller that goes away is
// noticed at once (and its place on the hub given up), then answers.
func (p *parked) hold(deadline time.Time) {
	_ = p.conn.SetReadDeadline(deadline)
	var buf [32]byte // pipelined bytes are rare: a small buffer, as each poll has one
loop:
	for {
		// Checked after each deadline is set: ready and release set
		// theirs after recording why, so one of the two sees it.
		p.mu.Lock()
		now := p.done || p.ended
		p.mu.Unlock()
		if now {
			break
		}
		n, err := p.conn.Read(buf[:])
		switch {
		case n > 0 && len(p.sent)+n <= maxPipelined:
			p.sent = append(p.sent, buf[:n]...)
		case n > 0 || (err != nil && !errors.Is(err, os.ErrDeadlineExceeded)):
			// The caller went away (or sent more than a pipeline).
			p.unwatch()
			_ = p.conn.Close()
			p.s.pollEnded(p.id, p.watch, false)
			p.s.unpark(p)
			return
		case err == nil:
		case !time.Now().Before(deadline):
			break loop // the wait is over, still pending
		}
	}
	p.unwatch()
	keep := p.answer()
	p.s.unpark(p)
	if keep {
		p.s.reuse(p.conn, p.sent) // may wait for the caller's next request
	}
}

// answer writes the outcome on the connection and tells whether the
// connection goes back to the HTTP server; it closes it otherwise.
func (p *parked) answer() (keep bool) {
	ctx, cancel := context.WithTimeout(context.Background(), parkedAnswerTimeout)
	defer cancel()
	p.mu.Lock()
	got, err, done, ended := p.got, p.err, p.done, p.ended
	p.mu.Unlock()
	s := p.s
	status, body := http.StatusOK, any(nil)
	if !done {
		// Still pending (or released): the caller asks again.
		got, err = s.req.Request(ctx, p.id)
	}
	switch {
	case errors.Is(err, approval.ErrNotFound): // gone while waited on, as own answers
		status, body = http.StatusNotFound, ErrorBody{Error: ErrorDetail{Code: "not_found", Message: fmt.Sprintf("no request %q for key %s", p.id, p.c.keyName())}}
	case err != nil:
		s.log.Error("api call failed", "http_request_id", p.c.id, "request_id", p.id, "key", p.c.keyName(),
			"method", http.MethodGet, "path", "/v1/requests/"+p.id, "step", "wait", "err", err)
		status, body = http.StatusInternalServerError, ErrorBody{Error: internalError(p.c)}
	default:
		body = s.show(ctx, got)
	}
	keep = p.keep && !ended
	s.pollEnded(p.id, p.watch, got != nil && got.Status != approval.StatusPending)
	err = p.write(status, body, keep)
	if s.onAnswer != nil {
		s.onAnswer(p.id)
	}
	if err != nil || !keep {
		_ = p.conn.Close()
		return false
	}
	_ = p.conn.SetDeadline(time.Time{})
	return true
}

// write writes one HTTP/1.1 answer: the headers set before the hijack,
// the JSON body as writeJSON writes it.
func (p *parked) write(status int, v any, keep bool) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(body) + 1)},
		"Date": {time.Now().UTC().Format(http.TimeFormat)}}
	if !keep {
		h.Set("Connection", "close")
	}
	var b bytes.Buffer
	b.Grow(len(p.header) + len(body) + 256)
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	b.Write(p.header)
	_ = h.Write(&b)
	b.WriteString("\r\n")
	b.Write(body)
	b.WriteByte('\n')
	_ = p.conn.SetWriteDeadline(time.Now().Add(parkedWriteTimeout))
	_, err = p.conn.Write(b.Bytes())
	return err
}

// unpark forgets p once its goroutine ends.
func (s *Server) unpark(p *parked) {
	s.waiting.Add(-1)
	if s.onPark != nil {
		s.onPark(false)
	}
	s.parkedMu.Lock()
	defer s.parkedMu.Unlock()
	delete(s.parked, p)
	if len(s.parked) == 0 && s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
}

// Release answers every parked long poll now, with its request as it is
// (pending: the caller asks again, of another replica), on a connection
// then closed; polls parked from now on are answered at once. It returns
// when every answer is written, or with ctx's error. The process calls it
// when it stops, after the HTTP server stopped taking requests.
func (s *Server) Release(ctx context.Context) error {
	s.parkedMu.Lock()
	s.released = true
	if len(s.parked) == 0 {
		s.parkedMu.Unlock()
		return nil
	}
	if s.drained == nil {
		s.drained = make(chan struct{})
	}
	drained := s.drained
	ps := make([]*parked, 0, len(s.parked))
	for p := range s.parked {
		ps = append(ps, p)
	}
	s.parkedMu.Unlock()
	for _, p := range ps {
		p.release()
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("api: release parked long polls: %w", ctx.Err())
	}
}
