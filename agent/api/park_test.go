package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store/storetest"
)

// rawPoll dials h's server and sends a long poll for id (plus extra bytes,
// as a pipelining client would), returning the connection and its reader.
func rawPoll(t *testing.T, h *harness, id, reqID, extra string) (net.Conn, *bufio.Reader) {
	t.Helper()
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	req := "GET /v1/requests/" + id + "?wait=30s HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + fullKey + "\r\nX-Request-Id: " + reqID + "\r\n\r\n"
	if _, err := io.WriteString(conn, req+extra); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// readAnswer reads one answer from br and decodes its body.
func readAnswer(t *testing.T, conn net.Conn, br *bufio.Reader) (*http.Response, client.Request) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	defer resp.Body.Close()
	var v client.Request
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("decode the answer: %v", err)
	}
	return resp, v
}

func (h *harness) newRequest(callID string) string {
	h.t.Helper()
	r, err := h.client(fullKey).Request(h.ctx, client.Call{Tool: "refund", CallID: callID, Arguments: json.RawMessage(`{"amount":64}`)})
	if err != nil || r.Status != client.Pending {
		h.t.Fatalf("Request = %+v, %v; want pending", r, err)
	}
	return r.ID
}

// TestParkedPollAnswersOnItsConnection: a long poll over HTTP/1.1 is
// parked (no handler holds it), answered by the decision on its own
// connection with the headers and body a held poll gets, and the
// connection — with what the caller pipelined behind the poll, sent before
// and while it was parked — goes back to the server for the next request.
func TestParkedPollAnswersOnItsConnection(t *testing.T) {
	type handedBack struct {
		conn net.Conn
		sent []byte
	}
	reused := make(chan handedBack, 1)
	h := newHarness(t, harnessOptions{reuse: func(c net.Conn, sent []byte) { reused <- handedBack{c, sent} }})
	id := h.newRequest("park-1")
	next := "GET /v1/keys/self HTTP/1.1\r\nHost: countersign\r\nAuthorization: Bearer " + fullKey + "\r\n\r\n"
	conn, br := rawPoll(t, h, id, "poll-1", next[:20])
	h.waitParked(1)
	if n := h.server.Waiting(); n != 1 {
		t.Errorf("Waiting() = %d while parked, want 1", n)
	}
	if _, err := io.WriteString(conn, next[20:]); err != nil { // pipelined while parked
		t.Fatal(err)
	}
	h.decide(id, approval.VerdictApprove, "U0BOB0001", "")
	resp, v := readAnswer(t, conn, br)
	if resp.StatusCode != http.StatusOK || v.Status != client.Approved || v.Approver != "U0BOB0001" || v.ID != id {
		t.Errorf("answer %d %+v; want 200, approved by U0BOB0001", resp.StatusCode, v)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "poll-1" {
		t.Errorf("X-Request-Id = %q, want poll-1 (set before the poll was parked)", got)
	}
	if resp.Close || resp.Header.Get("Date") == "" {
		t.Errorf("Close %v, Date %q; want a kept connection and a Date", resp.Close, resp.Header.Get("Date"))
	}
	var back handedBack
	select {
	case back = <-reused:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection was not handed back to the server")
	}
	defer back.conn.Close()
	if string(back.sent) != next {
		t.Errorf("handed back with %q sent; want the pipelined request %q", back.sent, next)
	}
	// The same connection: what the server writes on it, the caller reads.
	if _, err := io.WriteString(back.conn, "HTTP/1.1 204 No Content\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if r2, err := http.ReadResponse(br, nil); err != nil || r2.StatusCode != http.StatusNoContent {
		t.Errorf("next answer on the connection = %v, %v; want the server's 204", r2, err)
	}
	h.waitUnparked(1)
	if n := h.server.Waiting(); n != 0 {
		t.Errorf("Waiting() = %d after the answer, want 0", n)
	}
}

// TestParkedPollCallerGoesAway: a caller that closes its connection, or
// floods it with more than a pipeline, gives up its place at once: the
// poll ends, nothing is written, and the decision later wakes nobody.
func TestParkedPollCallerGoesAway(t *testing.T) {
	for _, tt := range []struct {
		name string
		act  func(t *testing.T, conn net.Conn)
	}{
		{"closes", func(t *testing.T, conn net.Conn) { _ = conn.Close() }},
		{"sends more than a pipeline", func(t *testing.T, conn net.Conn) {
			// The server closes the connection past 64 KiB: the write
			// fails then, or succeeds into the kernel's buffers.
			_, _ = conn.Write([]byte(strings.Repeat("x", 256<<10)))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reused := make(chan net.Conn, 1)
			h := newHarness(t, harnessOptions{reuse: func(c net.Conn, _ []byte) { reused <- c }})
			id := h.newRequest("gone-1")
			conn, br := rawPoll(t, h, id, "poll-gone", "")
			h.waitParked(1)
			tt.act(t, conn)
			h.waitUnparked(1)
			if n := h.server.Waiting(); n != 0 {
				t.Errorf("Waiting() = %d, want 0", n)
			}
			h.decide(id, approval.VerdictApprove, "U0BOB0001", "")
			if tt.name != "closes" {
				_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				if b, err := io.ReadAll(br); len(b) != 0 {
					t.Errorf("the flooding caller read %q, %v; want the connection closed with nothing written", b, err)
				}
			}
			select {
			case <-reused:
				t.Error("a connection whose caller left was handed back")
			default:
			}
		})
	}
}

// TestReleaseAnswersParkedPolls: when the process stops, every parked poll
// is answered at once with its request as it is (pending: ask again) and
// its connection closed; a poll that arrives after is answered at once.
func TestReleaseAnswersParkedPolls(t *testing.T) {
	reused := make(chan net.Conn, 3)
	h := newHarness(t, harnessOptions{reuse: func(c net.Conn, _ []byte) { reused <- c }})
	ids := []string{h.newRequest("rel-1"), h.newRequest("rel-2")}
	type poll struct {
		conn net.Conn
		br   *bufio.Reader
	}
	var polls []poll
	for i, id := range ids {
		conn, br := rawPoll(t, h, id, fmt.Sprintf("poll-rel-%d", i), "")
		polls = append(polls, poll{conn, br})
	}
	h.waitParked(len(ids))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.server.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := h.server.Waiting(); n != 0 {
		t.Errorf("Waiting() = %d after Release, want 0", n)
	}
	conn, br := rawPoll(t, h, ids[0], "poll-late", "")
	polls = append(polls, poll{conn, br})
	for i, p := range polls {
		resp, v := readAnswer(t, p.conn, p.br)
		if resp.StatusCode != http.StatusOK || v.Status != client.Pending || !resp.Close {
			t.Errorf("poll %d: %d %s, Close %v; want 200 pending with Connection: close", i, resp.StatusCode, v.Status, resp.Close)
		}
		if b, _ := io.ReadAll(p.br); len(b) != 0 {
			t.Errorf("poll %d: %q after the answer, want the connection closed", i, b)
		}
	}
	if len(reused) != 0 {
		t.Errorf("%d connections handed back after Release, want none", len(reused))
	}
}

// TestLongPollHeldOverHTTP2: a poll that cannot be parked (HTTP/2 streams
// share their connection) is held in its handler and answered the same.
func TestLongPollHeldOverHTTP2(t *testing.T) {
	h := newHarness(t, harnessOptions{http2: true})
	id := h.newRequest("h2-1")
	c := h.client(fullKey)
	out := make(chan *client.Request, 1)
	go func() { r, _ := c.Get(h.ctx, id, 30*time.Second); out <- r }() // ends with the answer
	h.waitPolls(1)
	h.decide(id, approval.VerdictReject, "U0BOB0001", "no")
	select {
	case r := <-out:
		if r == nil || r.Status != client.Rejected || r.Reason != "no" {
			t.Errorf("Get over HTTP/2 = %+v, want rejected with the reason", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no answer over HTTP/2 within 30s")
	}
	if n := len(h.parks); n != 0 {
		t.Errorf("%d polls parked over HTTP/2, want none", n)
	}
}

// TestParkable: only a bodiless GET over HTTP/1.x on a writer that can be
// taken over is parked.
func TestParkable(t *testing.T) {
	rec := httptest.NewRecorder() // cannot be hijacked
	for _, tt := range []struct {
		name string
		r    func() *http.Request
		w    http.ResponseWriter
		want bool
	}{
		{"recorder", func() *http.Request { return httptest.NewRequest("GET", "/v1/requests/x?wait=1s", nil) }, rec, false},
		{"GET over HTTP/1.1", func() *http.Request { return httptest.NewRequest("GET", "/v1/requests/x?wait=1s", nil) }, hijacker{rec}, true},
		{"wrapped", func() *http.Request { return httptest.NewRequest("GET", "/v1/requests/x?wait=1s", nil) }, wrapper{hijacker{rec}}, true},
		{"HEAD", func() *http.Request { return httptest.NewRequest("HEAD", "/v1/requests/x?wait=1s", nil) }, hijacker{rec}, false},
		{"HTTP/2", func() *http.Request {
			r := httptest.NewRequest("GET", "/v1/requests/x?wait=1s", nil)
			r.ProtoMajor, r.ProtoMinor = 2, 0
			return r
		}, hijacker{rec}, false},
		{"GET with a body", func() *http.Request {
			return httptest.NewRequest("GET", "/v1/requests/x?wait=1s", strings.NewReader("{}"))
		}, hijacker{rec}, false},
	} {
		if got := api.Parkable(tt.w, tt.r()); got != tt.want {
			t.Errorf("%s: parkable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

type hijacker struct{ http.ResponseWriter }

func (hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, http.ErrNotSupported }

type wrapper struct{ http.ResponseWriter }

func (w wrapper) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestParkedPollRequestGone: a request whose record is gone when its
// parked poll ends is answered 404 not_found, as a held poll's re-read
// answers, not as a failure of the server.
func TestParkedPollRequestGone(t *testing.T) {
	rdb, prefix := storetest.New(t)
	h := newHarness(t, harnessOptions{rdb: rdb, prefix: prefix, maxWait: 300 * time.Millisecond})
	id := h.newRequest("gone-record")
	conn, br := rawPoll(t, h, id, "poll-gone-record", "")
	h.waitParked(1)
	if err := rdb.Del(context.Background(), prefix+":req:{"+id+"}").Err(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body client.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusNotFound || body.Error.Code != "not_found" {
		t.Errorf("answer %d %+v (%v); want 404 not_found", resp.StatusCode, body, err)
	}
}
