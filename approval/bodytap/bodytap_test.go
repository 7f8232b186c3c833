package bodytap_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/countersign/countersign/approval/bodytap"
)

// body is a reply read in chunks of two bytes, and whether it was closed.
type body struct {
	io.Reader
	closed bool
}

func (b *body) Close() error { b.closed = true; return nil }

func newBody(s string) *body { return &body{Reader: iotest.HalfReader(strings.NewReader(s))} }

func TestHead(t *testing.T) {
	t.Parallel()
	type got struct {
		head     string
		cut, eof bool
		calls    int
	}
	for _, tt := range []struct {
		name   string
		body   string
		max    int
		readN  int // bytes read before Close; -1 reads to EOF
		want   got
		passed string // what the reader got
	}{
		{name: "whole, to EOF", body: `{"ok":true}`, max: 64, readN: -1, want: got{head: `{"ok":true}`, eof: true, calls: 1}, passed: `{"ok":true}`},
		{name: "exactly max", body: "abcd", max: 4, readN: -1, want: got{head: "abcd", eof: true, calls: 1}, passed: "abcd"},
		{name: "cut at max, all passed", body: "abcdefgh", max: 3, readN: -1, want: got{head: "abc", cut: true, eof: true, calls: 1}, passed: "abcdefgh"},
		{name: "closed before EOF", body: "abcdefgh", max: 64, readN: 4, want: got{head: "abcd", calls: 1}, passed: "abcd"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var g got
			b := newBody(tt.body)
			rc := bodytap.Head(b, tt.max, func(head []byte, cut, eof bool) {
				g.head, g.cut, g.eof = string(head), cut, eof
				g.calls++
			})
			var passed []byte
			var err error
			if tt.readN < 0 {
				passed, err = io.ReadAll(rc)
			} else {
				passed = make([]byte, tt.readN)
				_, err = io.ReadFull(rc, passed)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := rc.Close(); err != nil || !b.closed {
				t.Fatalf("Close() = %v, body closed %v; want nil, true", err, b.closed)
			}
			if string(passed) != tt.passed {
				t.Errorf("read %q, want %q", passed, tt.passed)
			}
			if g != tt.want {
				t.Errorf("done got %+v, want %+v (once, at EOF or Close)", g, tt.want)
			}
		})
	}
}

func TestLines(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body string
		max        int
		want       []string
	}{
		{name: "SSE lines", body: "event: x\ndata: {\"a\":1}\n\ndata: {\"b\":2}\n\n", max: 64, want: []string{"event: x", `data: {"a":1}`, "", `data: {"b":2}`, ""}},
		{name: "a JSON body without a newline", body: `{"jsonrpc":"2.0","id":1}`, max: 64, want: []string{`{"jsonrpc":"2.0","id":1}`}},
		{name: "a line longer than max is skipped whole", body: "short\n" + strings.Repeat("x", 20) + "\nafter\n", max: 8, want: []string{"short", "after"}},
		{name: "a long last line is skipped", body: "ok\n" + strings.Repeat("y", 20), max: 8, want: []string{"ok"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			dones := 0
			rc := bodytap.Lines(newBody(tt.body), tt.max, func(l []byte) { got = append(got, string(l)) }, func() { dones++ })
			passed, err := io.ReadAll(rc)
			if err != nil {
				t.Fatal(err)
			}
			_ = rc.Close()
			if string(passed) != tt.body {
				t.Errorf("read %q, want the body %q", passed, tt.body)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("lines %q, want %q", got, tt.want)
			}
			if dones != 1 {
				t.Errorf("done called %d times, want once", dones)
			}
		})
	}
}

// TestLinesFailedBody: a body that fails inside its last line still gives
// it, and done waits for Close.
func TestLinesFailedBody(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	var got []string
	done := false
	b := &body{Reader: io.MultiReader(strings.NewReader("a\nb"), iotest.ErrReader(boom))}
	rc := bodytap.Lines(b, 64, func(l []byte) { got = append(got, string(l)) }, func() { done = true })
	if _, err := io.ReadAll(rc); !errors.Is(err, boom) {
		t.Fatalf("ReadAll error %v, want %v", err, boom)
	}
	if !slices.Equal(got, []string{"a", "b"}) || done {
		t.Fatalf("before Close: lines %q, done %v; want [a b], false", got, done)
	}
	_ = rc.Close()
	if !done {
		t.Error("Close did not finish the tap")
	}
}
