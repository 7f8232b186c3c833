package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/approval/bodytap"
)

// This file: keeping an upstream's progress and log notifications ahead
// of the answer they precede.
//
// An upstream sends a call's progress and log messages before its answer,
// on the same stream. go-sdk's client hands the answer to the caller at
// once but queues notifications for a handler goroutine, so the gateway
// could answer its client before relaying the last notifications (they
// would then be lost: the client's stream ends with the answer). The
// gateway counts the progress and log notifications as they are read
// (order.seen: as the bytes arrive for a streamable HTTP upstream, as
// messages off the connection for any other) and, in its handlers, those
// it has relayed (order.done); before
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
	// Each SSE data line (or the JSON body) is counted as the caller reads.
	resp.Body = bodytap.Lines(resp.Body, maxNotification, t.o.count, nil)
	return resp, nil
}

// maxNotification bounds a line of an upstream's reply kept to count its
// notifications: a longer one (a large result) is not a notification.
const maxNotification = 1 << 20

// count counts line (an SSE data line, or a JSON body) when it is a
// progress or log notification.
func (o *order) count(line []byte) {
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
	if counted(m.Method) {
		o.saw()
	}
}

// countingTransport counts the progress and log notifications read off
// a transport's connection: for every upstream transport but streamable
// HTTP (orderTransport counts those: wrapping go-sdk's streamable client
// connection would hide what it is told of the session from it).
type countingTransport struct {
	base mcp.Transport
	o    *order
}

func (t countingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return countingConn{Connection: c, o: t.o}, nil
}

type countingConn struct {
	mcp.Connection
	o *order
}

func (c countingConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if r, ok := m.(*jsonrpc.Request); ok && err == nil && !r.ID.IsValid() && counted(r.Method) {
		c.o.saw()
	}
	return m, err
}

// counted tells whether the gateway's handlers count notifications of
// method as handled.
func counted(method string) bool {
	return method == "notifications/progress" || method == "notifications/message"
}
