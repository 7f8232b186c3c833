package bot

import (
	"bytes"
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/countersign/countersign/approval/bodytap"
)

// SlackCalls is told of every Slack Web API call the client makes, for
// the metrics (cmd/countersign wires the Prometheus series; the bot knows
// nothing of Prometheus). method is the Web API method ("chat.postMessage",
// "other" when the path is not one); status the HTTP status, or "error"
// when no response arrived.
type SlackCalls interface {
	SlackRequest(method, status string)
	// SlackError: the transport failed, the status is neither 2xx nor 429,
	// or the reply says "ok": false.
	SlackError(method string)
	// SlackRateLimited: HTTP 429 (slack-go retries after Retry-After).
	SlackRateLimited(method string)
}

// slackTransport tells SlackCalls of each call. The method is the last
// segment of the URL path (…/api/chat.postMessage). The body is inspected
// for "ok" as the caller reads it, never buffered ahead of it, except the
// replies of the methods in echoes, which it reads whole to take out the
// message they echo (trim).
type slackTransport struct {
	next  http.RoundTripper
	calls SlackCalls
}

// Transport is next (nil means http.DefaultTransport) telling calls of each
// Slack Web API call: the HTTP client NewClient is given.
func Transport(next http.RoundTripper, calls SlackCalls) http.RoundTripper {
	return &slackTransport{next: cmp.Or(next, http.DefaultTransport), calls: calls}
}

var slackMethod = regexp.MustCompile(`^[a-zA-Z]+(\.[a-zA-Z]+)+$`)

// maxOKHead bounds how much of a reply is kept to find its "ok" field.
const maxOKHead = 64 << 10

// RoundTrip sends req and tells the outcome.
func (t *slackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	method := path.Base(req.URL.Path)
	if !slackMethod.MatchString(method) {
		method = "other"
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.calls.SlackRequest(method, "error")
		t.calls.SlackError(method)
		return nil, err
	}
	t.calls.SlackRequest(method, strconv.Itoa(resp.StatusCode))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		t.calls.SlackRateLimited(method)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		t.calls.SlackError(method)
	case !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
	case echoes[method]:
		t.trim(method, resp)
	default:
		resp.Body = bodytap.Head(resp.Body, maxOKHead, func(head []byte, _, _ bool) {
			if ok, found := slackOK(head); found && !ok {
				t.calls.SlackError(method)
			}
		})
	}
	return resp, nil
}

// echoes are the Web API methods whose reply echoes, whole, the message
// just posted or updated ("message": its text, blocks and attachments),
// which nothing here reads: slack-go decodes every block of it into its
// own types, then drops it (SendMessageContext returns the channel, the
// ts and the text). For a card that decoding was most of the CPU a
// redraw cost.
var echoes = map[string]bool{"chat.postMessage": true, "chat.update": true}

// maxTrim bounds the reply trim reads whole (a card's echo is some 10
// KiB); a longer one is passed on as it is.
const maxTrim = 1 << 20

// trim hands the caller resp's reply without its top-level "message"
// (withoutMessage), and tells of an "ok": false. A reply that is too long
// or not one JSON object it can walk goes on unchanged; a read that fails
// fails the caller's read with the same error.
func (t *slackTransport) trim(method string, resp *http.Response) {
	body := resp.Body
	reply, err := io.ReadAll(io.LimitReader(body, maxTrim+1))
	switch {
	case err != nil:
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(reply), errReader{err}), body}
		return
	case len(reply) > maxTrim:
		resp.Body = bodytap.Head(readCloser{io.MultiReader(bytes.NewReader(reply), body), body}, maxOKHead,
			func(head []byte, _, _ bool) {
				if ok, found := slackOK(head); found && !ok {
					t.calls.SlackError(method)
				}
			})
		return
	}
	_ = body.Close()
	out, ok, walked := withoutMessage(reply)
	if walked && !ok {
		t.calls.SlackError(method)
	}
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// slackOK finds the top-level "ok" field of a Slack reply in head, which
// may be cut short.
func slackOK(head []byte) (ok, found bool) {
	dec := json.NewDecoder(bytes.NewReader(head))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false, false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return false, false
		}
		if key == "ok" {
			var v bool
			if err := dec.Decode(&v); err != nil {
				return false, false
			}
			return v, true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false, false
		}
	}
	return false, false
}
