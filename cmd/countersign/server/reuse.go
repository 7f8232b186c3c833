package server

import (
	"net"
	"sync"
)

// reuseListener is the server's listener: the connections it accepts, and
// those handed back by Reuse, which the HTTP server then serves as it
// serves a new one (its next request read with the usual timeouts).
type reuseListener struct {
	net.Listener
	accepted chan accepted // from the accepting goroutine
	reused   chan net.Conn // from Reuse
	done     chan struct{} // closed by Close
	once     sync.Once
}

type accepted struct {
	conn net.Conn
	err  error
}

func newReuseListener(ln net.Listener) *reuseListener {
	l := &reuseListener{Listener: ln, accepted: make(chan accepted), reused: make(chan net.Conn), done: make(chan struct{})}
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

// reuse hands c to Accept, or closes it once the listener is closed.
func (l *reuseListener) reuse(c net.Conn) {
	select {
	case l.reused <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *reuseListener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}
