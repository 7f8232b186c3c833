// Package server is the HTTP front of a Countersign process: the port Slack
// (HTTP mode), the API, the MCP gateway, the audit view and the probes
// reach (and, on a port of its own when COUNTERSIGN_METRICS_ADDR is set,
// /metrics: one more Server). It listens from the first moment of start-up and answers 503
// until the process is ready, so an orchestrator sees "starting" rather
// than a closed port; it bounds what a slow client can hold; and its
// Shutdown lets the requests in flight (Slack acks included) finish.
//
//	f, err := server.Listen(addr, log) // 503 "starting" from here on
//	...
//	f.Ready(mux)                      // the full handler, once built
//	...
//	err = f.Shutdown(ctx)             // first step of the process's Close
//
// It imports only the standard library: the handler it serves is built by
// cmd/countersign.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The server's bounds (docs/deploy.md "Timeouts and limits"): a client
// that sends slowly, or not at all, holds a connection at most this long.
// The Slack endpoints bound the reading of a body tighter still
// (bot.HTTPHandler).
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second // headers and body
	WriteTimeout      = 30 * time.Second // the whole answer, audit view pages included
	IdleTimeout       = 60 * time.Second // a keep-alive connection between requests
	MaxHeaderBytes    = 64 << 10
)

// Server is a listening HTTP server whose handler is swapped once, from
// "starting" to the process's handler. Create it with Listen.
type Server struct {
	srv     *http.Server
	ln      *reuseListener
	handler atomic.Pointer[http.Handler] // what srv serves: 503 while starting, then Ready's
	served  chan struct{}                // closed when srv.Serve has returned
}

// CheckAddr checks a listen address before anything is built: host:port
// with a port from 0 to 65535 (host may be empty: every interface). The
// error names the environment variable it is read from, COUNTERSIGN_ADDR.
func CheckAddr(addr string) error { return CheckListenAddr("COUNTERSIGN_ADDR", addr) }

// CheckListenAddr is CheckAddr for the address read from the environment
// variable named variable (COUNTERSIGN_METRICS_ADDR, say), which the error
// names.
func CheckListenAddr(variable, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("%s: not host:port: %q (want e.g. :8080 or 127.0.0.1:8080)", variable, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%s: port %q is not a number from 0 to 65535", variable, port)
	}
	return nil
}

// ListenGRPC opens the listener of a gRPC service on addr (host:port),
// Envoy's ext_authz (COUNTERSIGN_EXTAUTHZ_ADDR): the process opens its
// listeners here, and agent/extauthz serves gRPC on it. Close it by
// stopping the server that serves it.
func ListenGRPC(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// Listen listens on addr (host:port) and serves 503 "starting" to every
// request until Ready. Errors from serving, other than a shutdown, are
// logged to log. The server runs until Shutdown.
func Listen(addr string, log *slog.Logger) (*Server, error) {
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(tcp, log), nil
}

// Serve is Listen on a listener already open (the demo reserves its
// address before the local workspace that must know it starts, and hands
// the very listener over: a port closed and opened again could be taken
// meanwhile).
func Serve(tcp net.Listener, log *slog.Logger) *Server {
	ln := newReuseListener(tcp)
	s := &Server{ln: ln, served: make(chan struct{})}
	s.Ready(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
	go func() { // exits when Shutdown closes the listener
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	return s
}

// Ready makes h the handler of every request from now on.
func (s *Server) Ready(h http.Handler) { s.handler.Store(&h) }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.handler.Load()).ServeHTTP(w, r)
}

// Reuse serves the caller's next requests on conn, a connection a handler
// took over (http.Hijacker) and has answered on, sent being what the
// caller has already sent of its next request: the API's parked long
// polls give theirs back this way, so callers keep their connections. As
// any kept-alive connection, it waits up to IdleTimeout for the next
// request (in the caller's goroutine) and is closed without one; a
// connection given after Shutdown began is closed.
func (s *Server) Reuse(conn net.Conn, sent []byte) { s.ln.reuse(conn, sent, IdleTimeout) }

// Addr is the address the server listens on (the port chosen when addr's
// was 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops taking new connections and waits, until ctx ends, for
// the requests in flight to finish.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("http server: %w", err)
	}
	select {
	case <-s.served:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("http server: %w", ctx.Err())
	}
}
