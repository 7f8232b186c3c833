// Package bodytap passes a response body through to whoever reads it and
// tells the caller what went by, without reading ahead of the reader: the
// one wrapper of an HTTP reply's body for the bot's Slack calls (the
// reply's "ok" field), the agent's model calls (the tokens a reply or a
// stream reports) and the MCP gateway's upstream streams (the
// notifications in them). A tap is done at EOF or at Close, whichever
// comes first: JSON decoders often stop at the end of a value without
// reading EOF. It imports only the standard library (a leaf, like
// approval/clip), so bot, agent and agent/mcp share it.
package bodytap

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// tap is the part every tap shares: the body, and done called once.
type tap struct {
	rc   io.ReadCloser
	once sync.Once
	done func()
}

func (t *tap) finish() { t.once.Do(t.done) }

// Close closes the body; the tap is done.
func (t *tap) Close() error {
	err := t.rc.Close()
	t.finish()
	return err
}

// Head passes rc through and keeps its first max bytes. Once done, done
// gets them, whether more than max bytes went by (cut), and whether the
// reader reached EOF (else it closed the body first).
func Head(rc io.ReadCloser, max int, done func(head []byte, cut, eof bool)) io.ReadCloser {
	h := &head{max: max}
	h.tap = tap{rc: rc, done: func() { done(h.buf.Bytes(), h.cut, h.eof) }}
	return h
}

type head struct {
	tap
	max int
	buf bytes.Buffer
	cut bool
	eof bool
}

// Read reads from the body, keeping its head.
func (h *head) Read(p []byte) (int, error) {
	n, err := h.rc.Read(p)
	if room := h.max - h.buf.Len(); n > room {
		h.cut = true
		h.buf.Write(p[:max(room, 0)])
	} else {
		h.buf.Write(p[:n])
	}
	if errors.Is(err, io.EOF) {
		h.eof = true
		h.finish()
	}
	return n, err
}

// Lines passes rc through and gives line each line that went by (without
// its newline; the last one when the body ends without a newline, as a
// JSON body does), keeping at most one partial line of at most max bytes
// (a longer line is not given). done is called once, when the tap is
// done; nil is nothing to do.
func Lines(rc io.ReadCloser, max int, line func([]byte), done func()) io.ReadCloser {
	if done == nil {
		done = func() {}
	}
	return &lines{tap: tap{rc: rc, done: done}, max: max, line: line}
}

type lines struct {
	tap
	max     int
	line    func([]byte)
	partial []byte
	long    bool // the partial line went past max: it is skipped
}

// Read reads from the body and gives the lines completed so far.
func (l *lines) Read(p []byte) (int, error) {
	n, err := l.rc.Read(p)
	l.scan(p[:n])
	if err != nil && len(l.partial) > 0 && !l.long {
		l.line(l.partial) // the body ended (or failed) inside its last line
		l.partial = l.partial[:0]
	}
	if errors.Is(err, io.EOF) {
		l.finish()
	}
	return n, err
}

func (l *lines) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.keep(p)
			return
		}
		l.keep(p[:i])
		if !l.long {
			l.line(l.partial)
		}
		l.partial, l.long = l.partial[:0], false
		p = p[i+1:]
	}
}

// keep adds p to the partial line, unless that makes it longer than max.
func (l *lines) keep(p []byte) {
	if l.long || len(l.partial)+len(p) > l.max {
		l.partial, l.long = l.partial[:0], true
		return
	}
	l.partial = append(l.partial, p...)
}
