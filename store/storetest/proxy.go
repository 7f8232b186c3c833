package storetest

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy to a Redis server for fault tests. Through it a
// test can:
//   - Cut every connection (new ones are closed at once) and Restore;
//   - Pause the replies (commands still reach Redis and run) and Resume:
//     Redis stalls for the clients behind the proxy only;
//   - Arm a marker: the reply to the first EVAL or EVALSHA whose command
//     contains it is withheld for good (the script ran in Redis), so the
//     client's read timeout fires and go-redis runs the script again on a
//     new connection. Withheld counts such replies.
//
// Nothing in it waits on a clock: a paused or withheld reply waits for
// Resume, or for the client to give up on its connection.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // accept loop and pumps; they exit when ln and the conns close

	mu     sync.Mutex // guards down, conns, paused, marker, held
	down   bool
	conns  map[net.Conn]struct{}
	paused chan struct{} // non-nil while paused; closed by Resume
	marker []byte        // nil: nothing armed
	held   int           // replies withheld since Arm
}

// NewProxy starts a proxy to target (host:port), stopped in tb.Cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.Resume()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Restore accepts connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Pause holds every reply from Redis until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

// Resume lets the replies held since Pause through.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// Arm makes the proxy withhold the reply to the next script call whose
// command contains marker (an error reply, such as NOSCRIPT, means the
// script did not run and is passed on).
func (p *Proxy) Arm(marker string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.held = []byte(marker), 0
}

// Withheld reports how many replies were withheld since Arm.
func (p *Proxy) Withheld() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pc := &proxyConn{p: p, client: c, redis: up}
		p.wg.Go(pc.toRedis)
		p.wg.Go(pc.toClient)
	}
}

// proxyConn is one proxied connection.
type proxyConn struct {
	p             *Proxy
	client, redis net.Conn

	mu    sync.Mutex // guards armed
	armed bool       // the armed command passed: withhold its reply
}

func (pc *proxyConn) close() { _ = pc.client.Close(); _ = pc.redis.Close() }

// toRedis copies commands; it exits when either side closes.
func (pc *proxyConn) toRedis() {
	defer pc.close()
	buf := make([]byte, 64<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			pc.p.mu.Lock()
			if pc.p.marker != nil && bytes.Contains(bytes.ToLower(buf[:n]), []byte("eval")) && bytes.Contains(buf[:n], pc.p.marker) {
				pc.mu.Lock()
				pc.armed = true
				pc.mu.Unlock()
			}
			pc.p.mu.Unlock()
			if _, werr := pc.redis.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// toClient copies replies, held while paused, withheld when armed; it
// exits when either side closes.
func (pc *proxyConn) toClient() {
	defer pc.close()
	buf := make([]byte, 64<<10)
	for {
		n, err := pc.redis.Read(buf)
		if n > 0 {
			pc.mu.Lock()
			hold := pc.armed && buf[0] != '-'
			pc.armed = false
			pc.mu.Unlock()
			pc.p.mu.Lock()
			paused := pc.p.paused
			if hold {
				pc.p.marker = nil
				pc.p.held++
			}
			pc.p.mu.Unlock()
			if hold {
				for { // swallow everything until the client gives up
					if _, err := pc.redis.Read(buf); err != nil {
						return
					}
				}
			}
			if paused != nil {
				<-paused
			}
			if _, werr := pc.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
