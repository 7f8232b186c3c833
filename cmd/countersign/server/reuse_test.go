package server_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/countersign/countersign/cmd/countersign/server"
)

// TestReuseServesTheNextRequest: a connection a handler took over and
// answered on, handed back with Reuse, carries the caller's next request
// to the server's handler (as the API's parked long polls do); after
// Shutdown a connection handed back is closed.
func TestReuseServesTheNextRequest(t *testing.T) {
	t.Parallel()
	s, err := server.Listen("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	handedBack := make(chan struct{}, 2)
	took, release := make(chan struct{}, 1), make(chan struct{})
	s.Ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/take" && r.URL.Path != "/hold" {
			io.WriteString(w, "served "+r.URL.Path)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		hold := r.URL.Path == "/hold"
		if hold {
			took <- struct{}{}
		}
		go func() { // answers later on the connection, as a parked poll does
			if hold {
				<-release
			}
			_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\ntaken")
			s.Reuse(conn, nil)
			handedBack <- struct{}{}
		}()
	}))
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	for _, want := range []string{"taken", "served /next"} {
		path := "/take"
		if want != "taken" {
			path = "/next"
		}
		if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s on the same connection: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != want {
			t.Errorf("GET %s = %q, want %q", path, b, want)
		}
	}
	<-handedBack

	// Handed back, waiting idle for a next request when Shutdown comes:
	// closed.
	idleConn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idleConn.Close()
	_ = idleConn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(idleConn, "GET /take HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	idleBR := bufio.NewReader(idleConn)
	if resp, err := http.ReadResponse(idleBR, nil); err != nil {
		t.Fatal(err)
	} else {
		_, _ = io.ReadAll(resp.Body)
	}

	// Handed back after Shutdown began: closed rather than served.
	if _, err := io.WriteString(conn, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-took
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-handedBack // the idle connection's Reuse returned: Shutdown closed it
	_ = idleConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(idleBR); err != nil || len(b) != 0 {
		t.Errorf("idle handed-back connection after Shutdown: %q, %v; want it closed", b, err)
	}
	close(release)
	<-handedBack
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "taken" {
		t.Errorf("GET /hold = %q, want taken", b)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
		t.Errorf("after the answer: %q, %v; want the connection closed", b, err)
	}
}
