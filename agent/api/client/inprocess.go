package client

import (
	"bytes"
	"io"
	"net/http"
)

// InProcess returns an HTTP client whose requests are served by h, the
// API's handler, in this process: the same code path as over the network
// (key, rate limit, audit) with no socket. The MCP gateway and Envoy's
// ext_authz mounted by serve, and the http hook, call the API through it.
// remoteAddr is the address the handler sees the call come from (the
// http hook passes the one Claude Code posted from, for the API's tally
// of refusals; "" for none).
func InProcess(h http.Handler, remoteAddr string) *http.Client {
	return &http.Client{Transport: inProcess{h: h, remote: remoteAddr}}
}

// inProcess serves each request with h and returns what it wrote.
type inProcess struct {
	h      http.Handler
	remote string
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.RemoteAddr, r.RequestURI = t.remote, req.URL.RequestURI()
	if r.Body == nil {
		r.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	t.h.ServeHTTP(rec, r)
	if err := req.Context().Err(); err != nil {
		return nil, err // the handler may have answered nothing
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{StatusCode: rec.status, Status: http.StatusText(rec.status), Header: rec.header,
		Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}, nil
}

// recorder is the response an in-process call writes.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
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
// the API handler h (InProcess: no socket). T is the interface the
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
