package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
)

// InProcess returns an HTTP client whose requests are served by h, the
// API's handler, in this process: the same code path as over the network
// (key, rate limit, audit) with no socket, and, for a Client's calls, no
// JSON (Body, ValueWriter). The MCP gateway, Envoy's ext_authz, AuthZEN
// and the http hook mounted by serve call the API through it.
// remoteAddr is the address the handler sees the call come from (the
// http hook passes the one Claude Code posted from, for the API's tally
// of refusals; "" for none).
func InProcess(h http.Handler, remoteAddr string) *http.Client {
	return &http.Client{Transport: inProcess{h: h, remote: remoteAddr}}
}

// inProcess serves each request with h and returns what it wrote. A
// Client's call through it is typed: the client hands its body over as a
// value and takes the answer as the value the handler would have encoded
// (exchange), no JSON either way.
type inProcess struct {
	h      http.Handler
	remote string
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := &recorder{header: http.Header{}}
	// A RoundTripper leaves the request as it was given: the handler
	// answers a copy.
	if err := t.serve(req.Clone(req.Context()), rec); err != nil {
		return nil, err
	}
	rec.WriteHeader(http.StatusOK) // when the handler wrote none
	return &http.Response{StatusCode: rec.status, Status: http.StatusText(rec.status), Header: rec.header,
		Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// serve has h answer req (the caller's to change) as if it came from
// t.remote, into rec.
func (t inProcess) serve(req *http.Request, rec http.ResponseWriter) error {
	req.RemoteAddr, req.RequestURI = t.remote, req.URL.RequestURI()
	if req.Body == nil {
		req.Body = http.NoBody
	}
	t.h.ServeHTTP(rec, req)
	return req.Context().Err() // the handler may have answered nothing
}

// exchange is a typed call (Client.do through a transport of PerKey's):
// req's context holds the body handed over, which the handler reads as
// the body (Body), and the handler hands over its answer as a value
// (ValueWriter), which is out's, or the refusal's; an answer the handler
// wrote as bytes instead (a route it does not serve) is decoded. req is
// Client.do's own, served as it is. The answer's slices are the
// handler's own: the caller only reads them.
func (t inProcess) exchange(req *http.Request, out any) error {
	rec := &valueRecorder{recorder: recorder{header: http.Header{}}}
	if err := t.serve(req, rec); err != nil {
		return err
	}
	rec.WriteHeader(http.StatusOK) // when the handler wrote none
	if rec.value == nil {
		if rec.status >= 300 {
			var eb ErrorBody
			_ = json.Unmarshal(rec.body.Bytes(), &eb)
			return refusal(rec.status, rec.header, eb, rec.body.String())
		}
		return json.Unmarshal(rec.body.Bytes(), out)
	}
	if rec.status >= 300 {
		eb, _ := rec.value.(ErrorBody)
		return refusal(rec.status, rec.header, eb, "")
	}
	v, dst := reflect.ValueOf(rec.value), reflect.ValueOf(out).Elem()
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Type() != dst.Type() {
		return fmt.Errorf("countersign: in-process answer is a %s, not a %s", v.Type(), dst.Type())
	}
	dst.Set(v)
	return nil
}

// bodyKey is the context key of a typed call's body, a handed.
type bodyKey struct{}

// handed is a typed call's body (nil v: none).
type handed struct{ v any }

// Body returns the body an in-process caller handed over as a value
// (PerKey's clients): what the client would have encoded (a Call, a
// Report…), nil for none. ok is false when the body is to be read from
// the request (every other caller).
func Body(ctx context.Context) (v any, ok bool) {
	h, ok := ctx.Value(bodyKey{}).(handed)
	return h.v, ok
}

// ValueWriter is implemented by the ResponseWriter of a typed in-process
// call: the API's handler hands over the value it would have encoded as
// JSON, with its status.
type ValueWriter interface {
	WriteValue(status int, v any)
}

// recorder is the response an in-process call writes.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// valueRecorder is the response of a typed call: a value, or bytes.
type valueRecorder struct {
	recorder
	value any
}

func (r *valueRecorder) WriteValue(status int, v any) {
	r.WriteHeader(status)
	r.value = v
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

// PerKey is the API option of a surface asking /v1 in this process
// (extauthz.Options.API, authzen.Options.API): a client per key reaching
// the API handler h with no socket and no JSON (the handler reads the
// call as the value the client holds and hands its answer back as one:
// Body, ValueWriter); everything else (the key, its rate limit, the
// checks, the lifecycle, the audit) is the handler's, as over HTTP. T is the interface the
// surface declares, which *Client implements (each package checks it
// with var _ API = (*client.Client)(nil)).
func PerKey[T any](h http.Handler) func(key string) T {
	hc := InProcess(h, "")
	return func(key string) T {
		c := New("http://countersign.internal", key)
		c.HTTP = hc
		return any(c).(T)
	}
}
