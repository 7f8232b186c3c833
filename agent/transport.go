package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/approval/option"
)

// ModelCalls is told of every request to the OpenAI-compatible endpoint,
// for the metrics (cmd/countersign wires the Prometheus series; the agent
// knows nothing of Prometheus).
type ModelCalls interface {
	// ModelRequest: one request, by HTTP status ("error" when no response
	// arrived).
	ModelRequest(status string)
	// ModelTime: from sending the request until its body was read (the
	// whole stream), or until the transport failed.
	ModelTime(d time.Duration)
	// ModelTokens: the usage a reply (or a stream's usage chunk) reported.
	ModelTokens(prompt, completion int)
}

// modelTransport times requests to the OpenAI-compatible endpoint and
// reads the tokens of the replies' usage: from the JSON body, or from the
// data: lines of a stream (stream_options.include_usage). The body reaches
// the caller unchanged and as it arrives.
type modelTransport struct {
	next  http.RoundTripper
	calls ModelCalls
	now   func() time.Time
}

// ModelTransport is next (nil means http.DefaultTransport) telling calls of
// each model request: the HTTP client of the go-openai client.
func ModelTransport(next http.RoundTripper, calls ModelCalls, now func() time.Time) http.RoundTripper {
	return &modelTransport{next: cmp.Or(next, http.DefaultTransport), calls: calls, now: option.FuncOr(now, time.Now)}
}

// maxUsageBody bounds how much of a non-streamed reply is kept to find its
// usage; a larger reply is passed through but its tokens are not counted.
const maxUsageBody = 4 << 20

// RoundTrip sends req, and tells the latency and usage once the body is read.
func (t *modelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := t.now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.calls.ModelRequest("error")
		t.calls.ModelTime(t.now().Sub(start))
		return nil, err
	}
	t.calls.ModelRequest(strconv.Itoa(resp.StatusCode))
	done := func() { t.calls.ModelTime(t.now().Sub(start)) }
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &sseUsageBody{ReadCloser: resp.Body, done: done, usage: t.countUsage}
		return resp, nil
	}
	resp.Body = &usageBody{rc: resp.Body, done: func(body []byte, complete bool) {
		done()
		if complete && resp.StatusCode/100 == 2 {
			t.countUsage(body)
		}
	}}
	return resp, nil
}

// countUsage tells the tokens of a chat completion (or stream chunk); JSON
// without usage tells nothing.
func (t *modelTransport) countUsage(body []byte) {
	var r struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		return
	}
	t.calls.ModelTokens(r.Usage.PromptTokens, r.Usage.CompletionTokens)
}

// usageBody passes a reply through and keeps its first maxUsageBody bytes.
// When the caller reaches EOF or closes the body (whichever comes first),
// done gets the kept bytes and whether they are the whole body. JSON
// decoders often stop at the end of the value without reading EOF, so Close
// counts too.
type usageBody struct {
	rc       io.ReadCloser
	buf      bytes.Buffer
	overflow bool
	eof      bool
	once     sync.Once
	done     func(kept []byte, complete bool)
}

// Read reads from the wrapped body, keeping a copy.
func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 && !b.overflow {
		if b.buf.Len()+n > maxUsageBody {
			b.overflow = true
			b.buf.Write(p[:maxUsageBody-b.buf.Len()])
		} else {
			b.buf.Write(p[:n])
		}
	}
	if errors.Is(err, io.EOF) {
		b.eof = true
		b.finish()
	}
	return n, err
}

// Close closes the wrapped body and reports what was read.
func (b *usageBody) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

func (b *usageBody) finish() {
	b.once.Do(func() {
		complete := !b.overflow
		if !b.eof {
			// Closed before EOF: whole only if what was kept parses.
			complete = complete && json.Valid(b.buf.Bytes())
		}
		b.done(b.buf.Bytes(), complete)
	})
}

// sseUsageBody passes a server-sent-event stream through, looking at each
// complete "data:" line for a usage object. It keeps at most one partial
// line.
type sseUsageBody struct {
	io.ReadCloser
	line  []byte
	once  sync.Once
	done  func()
	usage func([]byte)
}

// Read reads from the stream and scans the lines read so far.
func (b *sseUsageBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.scan(p[:n])
	if errors.Is(err, io.EOF) {
		b.finish()
	}
	return n, err
}

// Close closes the stream.
func (b *sseUsageBody) Close() error {
	err := b.ReadCloser.Close()
	b.finish()
	return err
}

const maxSSELine = 1 << 20

func (b *sseUsageBody) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(b.line)+len(p) <= maxSSELine {
				b.line = append(b.line, p...)
			} else {
				b.line = b.line[:0] // too long to be a usage chunk worth keeping
			}
			return
		}
		line := append(b.line, p[:i]...)
		b.line = b.line[:0]
		p = p[i+1:]
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:"))
		if ok && bytes.Contains(data, []byte(`"usage"`)) {
			b.usage(bytes.TrimSpace(data))
		}
	}
}

func (b *sseUsageBody) finish() { b.once.Do(b.done) }
