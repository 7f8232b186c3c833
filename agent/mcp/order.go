package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"
)

// This file: keeping an upstream's progress and log notifications ahead
// of the answer they precede.
//
// An upstream sends a call's progress and log messages before its answer,
// on the same stream. go-sdk's client hands the answer to the caller at
// once but queues notifications for a handler goroutine, so the gateway
// could answer its client before relaying the last notifications (they
// would then be lost: the client's stream ends with the answer). For a
// streamable HTTP upstream the gateway counts, as the bytes arrive, the
// progress and log notifications in the upstream's responses (order.seen)
// and, in its handlers, those it has relayed (order.done); before
// answering a client it waits until every notification seen so far is
// handled. A notification go-sdk refuses before any handler runs would
// never be counted done: the wait gives up after orderWait.

// orderWait bounds the wait for notifications to be relayed.
const orderWait = 2 * time.Second

// order counts one upstream connection's progress and log notifications.
type order struct {
	mu   sync.Mutex    // guards the fields below
	seen uint64        // read off the wire
	done uint64        // handled (relayed or dropped)
	more chan struct{} // closed (and replaced) when done grows
}

func newOrder() *order { return &order{more: make(chan struct{})} }

func (o *order) saw() {
	o.mu.Lock()
	o.seen++
	o.mu.Unlock()
}

func (o *order) handled() {
	o.mu.Lock()
	o.done++
	close(o.more)
	o.more = make(chan struct{})
	o.mu.Unlock()
}

// settle waits until every notification seen so far is handled, ctx ends
// or orderWait passes.
func (o *order) settle(ctx context.Context) {
	if o == nil {
		return
	}
	o.mu.Lock()
	want := o.seen
	o.mu.Unlock()
	var timeout <-chan time.Time
	for {
		o.mu.Lock()
		done, more := o.done, o.more
		o.mu.Unlock()
		if done >= want {
			return
		}
		if timeout == nil {
			t := time.NewTimer(orderWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-more:
		case <-ctx.Done():
			return
		case <-timeout:
			return
		}
	}
}

// orderTransport counts the progress and log notifications in the
// event streams of an upstream's HTTP responses.
type orderTransport struct {
	base http.RoundTripper
	o    *order
}

func (t orderTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, o: t.o}
	return resp, nil
}

// countingBody counts the notifications in the SSE data lines (or the
// JSON body) it passes on.
type countingBody struct {
	io.ReadCloser
	o    *order
	line []byte // the current line so far
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	rest := p[:n]
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			b.line = append(b.line, rest...)
			break
		}
		b.line = append(b.line, rest[:i]...)
		b.count(b.line)
		b.line = b.line[:0]
		rest = rest[i+1:]
	}
	if err != nil && len(b.line) > 0 {
		b.count(b.line)
		b.line = b.line[:0]
	}
	return n, err
}

func (b *countingBody) count(line []byte) {
	line = bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(line), []byte("data:")))
	if len(line) == 0 || line[0] != '{' {
		return
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(line, &m) != nil || len(m.ID) > 0 {
		return
	}
	if m.Method == "notifications/progress" || m.Method == "notifications/message" {
		b.o.saw()
	}
}
