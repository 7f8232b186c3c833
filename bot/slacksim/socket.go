package slacksim

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// maxConnections is Slack's limit of simultaneous Socket Mode connections
// per app.
const maxConnections = 10

// hub holds the Socket Mode connections. Lock order: Workspace.mu may be
// held when calling into hub; hub never calls into Workspace while holding
// hub.mu.
type hub struct {
	mu      sync.Mutex // guards the fields below
	tickets map[string]bool
	conns   []*sockConn
	next    int      // round-robin index into conns
	queue   [][]byte // envelopes waiting for a connection
	closed  bool
}

// sockConn is one app connection. Its writer goroutine owns all writes of
// data frames; it exits when done is closed.
type sockConn struct {
	ws       *websocket.Conn
	send     chan []byte
	done     chan struct{}
	draining bool // told to reconnect; gets no new envelopes. Guarded by hub.mu.
}

func (h *hub) init() { h.tickets = map[string]bool{} }

// count returns the number of connections that take envelopes.
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if !c.draining {
			n++
		}
	}
	return n
}

func (h *hub) addTicket(t string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tickets[t] = true
}

// useTicket consumes a connection ticket.
func (h *hub) useTicket(t string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.tickets[t] {
		return false
	}
	delete(h.tickets, t)
	return true
}

// send hands an envelope to the next connection, round-robin, or queues it
// until an app connects.
func (h *hub) send(msg []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	for range len(h.conns) {
		c := h.conns[h.next%len(h.conns)]
		h.next++
		if c.draining {
			continue
		}
		select {
		case c.send <- msg:
			return
		default: // this connection is backed up; try the next
		}
	}
	h.queue = append(h.queue, msg)
}

// drainAll sends msg (a disconnect) to every connection and stops giving
// them envelopes.
func (h *hub) drainAll(msg []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.draining = true
		select {
		case c.send <- msg:
		default:
		}
	}
}

// register adds a connection and flushes queued envelopes to it. It
// reports false once the hub is closed or full.
func (h *hub) register(c *sockConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, x := range h.conns {
		if !x.draining {
			n++
		}
	}
	if h.closed || n >= maxConnections {
		return false
	}
	h.conns = append(h.conns, c)
	return true
}

func (h *hub) flush() {
	h.mu.Lock()
	q := h.queue
	h.queue = nil
	h.mu.Unlock()
	for _, m := range q {
		h.send(m)
	}
}

func (h *hub) unregister(c *sockConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.conns {
		if x == c {
			h.conns = append(h.conns[:i], h.conns[i+1:]...)
			return
		}
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	h.closed = true
	conns := append([]*sockConn(nil), h.conns...)
	h.mu.Unlock()
	for _, c := range conns {
		_ = c.ws.Close()
	}
}

// Connections returns the number of open Socket Mode connections.
func (w *Workspace) Connections() int { return w.hub.count() }

// RequestReconnect sends every Socket Mode connection a
// {"type":"disconnect","reason":"refresh_requested"} message, as Slack does
// before it recycles a connection. Clients open a new connection.
func (w *Workspace) RequestReconnect() {
	msg, _ := json.Marshal(map[string]any{
		"type":       "disconnect",
		"reason":     "refresh_requested",
		"debug_info": map[string]any{"host": "slacksim"},
	})
	w.hub.drainAll(msg)
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

// serveSocket accepts a Socket Mode connection opened with a ticket from
// apps.connections.open. The handler goroutine reads acks until the
// connection fails; a writer goroutine sends envelopes and pings.
func (w *Workspace) serveSocket(rw http.ResponseWriter, r *http.Request) {
	if !w.hub.useTicket(r.URL.Query().Get("ticket")) {
		http.Error(rw, "invalid ticket", http.StatusUnauthorized)
		return
	}
	ws, err := upgrader.Upgrade(rw, r, nil)
	if err != nil {
		return
	}
	c := &sockConn{ws: ws, send: make(chan []byte, 256), done: make(chan struct{})}
	// hello goes first: it is queued before the connection is registered,
	// so no envelope can overtake it.
	hello, _ := json.Marshal(map[string]any{
		"type":            "hello",
		"num_connections": w.hub.count() + 1,
		"debug_info":      map[string]any{"host": "slacksim", "approximate_connection_time": 18060},
		"connection_info": map[string]any{"app_id": AppID},
	})
	c.send <- hello
	w.mu.Lock()
	closed := w.closed
	if !closed {
		w.wg.Add(1)
	}
	w.mu.Unlock()
	if closed || !w.hub.register(c) {
		if !closed {
			w.wg.Done()
		}
		_ = ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.ClosePolicyViolation, "too_many_websockets"))
		_ = ws.Close()
		return
	}
	defer w.wg.Done()

	writerDone := make(chan struct{})
	go func() { // exits when c.done is closed or a write fails
		defer close(writerDone)
		w.writeLoop(c)
	}()
	w.hub.flush()
	w.mu.Lock()
	w.bumpLocked()
	w.mu.Unlock()

	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			break
		}
		var ack struct {
			EnvelopeID string          `json:"envelope_id"`
			Payload    json.RawMessage `json:"payload"`
		}
		if json.Unmarshal(data, &ack) == nil && ack.EnvelopeID != "" {
			w.ackEnvelope(ack.EnvelopeID, ack.Payload)
		}
	}
	w.hub.unregister(c)
	close(c.done)
	<-writerDone
	_ = ws.Close()
	w.mu.Lock()
	w.bumpLocked()
	w.mu.Unlock()
}

func (w *Workspace) writeLoop(c *sockConn) {
	ping := time.NewTicker(w.opts.PingInterval)
	defer ping.Stop()
	for {
		select {
		case msg := <-c.send:
			_ = c.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if err := c.ws.WriteMessage(websocket.TextMessage, msg); err != nil {
				_ = c.ws.Close() // makes the reader fail and close done
				<-c.done
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, []byte("slacksim"), time.Now().Add(5*time.Second)); err != nil {
				_ = c.ws.Close()
				<-c.done
				return
			}
		case <-c.done:
			return
		}
	}
}
