package server

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"
)

// reuseListener is the server's listener: the connections it accepts, and
// those handed back by Reuse once their next request begins, which the
// HTTP server then serves as it serves a new one.
type reuseListener struct {
	net.Listener
	accepted chan accepted // from the accepting goroutine
	reused   chan net.Conn // from Reuse
	done     chan struct{} // closed by Close
	once     sync.Once
	mu       sync.Mutex            // guards idle and closed
	idle     map[net.Conn]struct{} // handed back, waiting for their next request
	closed   bool
}

type accepted struct {
	conn net.Conn
	err  error
}

func newReuseListener(ln net.Listener) *reuseListener {
	l := &reuseListener{Listener: ln, accepted: make(chan accepted), reused: make(chan net.Conn), done: make(chan struct{}),
		idle: map[net.Conn]struct{}{}}
	go l.accept() // ends when the listener is closed
	return l
}

// accept takes the listener's connections and errors to Accept.
func (l *reuseListener) accept() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
		if err != nil {
			if ne, ok := err.(interface{ Temporary() bool }); !ok || !ne.Temporary() {
				return // closed: Accept reports it, and then done
			}
		}
	}
}

// Accept returns the next connection, accepted or handed back.
func (l *reuseListener) Accept() (net.Conn, error) {
	select {
	case a := <-l.accepted:
		return a.conn, a.err
	case c := <-l.reused:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// reuse waits, as for any kept-alive connection, up to idle for the
// caller's next request on c (sent: what the caller has sent of it
// already), then hands c to Accept; it closes c when the caller sends
// nothing in time, hangs up, or the listener is closed.
func (l *reuseListener) reuse(c net.Conn, sent []byte, idle time.Duration) {
	if len(sent) == 0 {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = c.Close()
			return
		}
		l.idle[c] = struct{}{} // Close closes it
		l.mu.Unlock()
		var first [1]byte
		_ = c.SetReadDeadline(time.Now().Add(idle))
		n, err := c.Read(first[:])
		l.mu.Lock()
		delete(l.idle, c)
		l.mu.Unlock()
		if n == 0 || err != nil {
			_ = c.Close()
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		sent = first[:]
	}
	c = &replayConn{Conn: c, r: bytes.NewReader(bytes.Clone(sent))}
	select {
	case l.reused <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// replayConn is a connection whose first bytes read are those its caller
// sent before it was handed back.
type replayConn struct {
	net.Conn
	r io.Reader // nil once read
}

func (c *replayConn) Read(b []byte) (int, error) {
	if c.r != nil {
		n, err := c.r.Read(b)
		if n > 0 {
			return n, nil
		}
		c.r = nil
		if err != nil && err != io.EOF {
			return 0, err
		}
	}
	return c.Conn.Read(b)
}

func (l *reuseListener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
		l.mu.Lock()
		l.closed = true
		for c := range l.idle {
			_ = c.Close()
		}
		l.mu.Unlock()
	})
	return err
}
