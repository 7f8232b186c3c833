package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
)

// This file: the gateway's transports. /mcp's HTTP side: which go-sdk
// handler serves a request (by its protocol revision), the response of a
// held call started at once and kept flowing, the answer to a missing or
// wrong key; stdio (RunStdio, CheckStdio); and the API's clients, over
// HTTP or in process.

// Revision2026 is the first MCP revision without sessions (SEP-2575,
// SEP-2567): its requests carry the revision in the MCP-Protocol-Version
// header and their own _meta, and go-sdk v1.8.0 serves them only on a
// stateless streamable handler.
const Revision2026 = "2026-07-28"

// DefaultKeepAliveEvery is how often a held call's response carries an SSE
// comment while a person decides: well inside the idle timeouts of
// proxies (often 60 s) and of Node's fetch between body chunks (300 s).
const DefaultKeepAliveEvery = 15 * time.Second

// revisionHandlers serves each request with the go-sdk handler its
// revision needs: a request whose MCP-Protocol-Version header names
// 2026-07-28 or later goes to a stateless handler (go-sdk v1.8.0 answers
// those with -32022 "not supported" on a stateful one), every other
// request (2025-06-18, 2025-11-25, and an initialize, which carries no
// header yet) to the stateful handler with its sessions. Both serve the
// same server. A 2026-07-28 client's first request (server/discover)
// carries the header, so it learns there that 2026-07-28 is served. A
// stateless request is marked (sessionlessHeader): its client has no
// session to give an upstream session of its own (links.go).
func (g *Gateway) revisionHandlers() http.Handler {
	getServer := func(*http.Request) *mcp.Server { return g.server }
	stateful := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{PropagateRequestCancellation: true})
	stateless := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Revisions are dates: they compare as strings. sessionlessHeader
		// is the gateway's own word, never the client's.
		r.Header.Del(sessionlessHeader)
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= Revision2026 {
			r.Header.Set(sessionlessHeader, "1")
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// sessionPerKey binds each MCP session of h to the key that started it:
// go-sdk's stateful handler refuses (403 "session user mismatch") a
// request, the standalone stream's GET included, that names a session
// started with another key, so a key that learns another client's
// Mcp-Session-Id can neither read what is sent to that session nor act in
// it. The key reaches go-sdk as the token's user, its SHA-256 (never the
// key itself). Handler has refused a request without a known key before.
func sessionPerKey(h http.Handler) http.Handler {
	verify := func(_ context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
		sum := sha256.Sum256([]byte(key))
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:])}, nil
	}
	return auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

// refuseKey answers an HTTP request whose bearer key is missing or not a
// key of the API: 403 with a JSON-RPC error saying so, before any MCP
// session starts. Not 401: an MCP client (the TypeScript SDK, MCP
// Inspector, Claude Code) takes any 401 as "this server wants OAuth" and
// starts an OAuth flow (it probes /.well-known/oauth-protected-resource
// and fails with "Interactive OAuth requires a TTY" or an OAuth error)
// instead of showing that the key is wrong; a 403 without
// WWW-Authenticate is shown with the body's message. The answer is the
// same few bytes whatever was sent, but for the JSON-RPC id of the
// request (echoed when it is a short number or string, so that a client
// such as go-sdk's matches the error to its call and shows its message):
// nothing of the gateway or its tools is in it, and it is never bigger
// than the request.
func refuseKey(w http.ResponseWriter, r *http.Request, present bool) {
	msg := "Countersign: bad API key (send Authorization: Bearer <key>)"
	if !present {
		msg = "Countersign: no API key (send Authorization: Bearer <key>)"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32001,"message":%q,"data":{"code":"unauthenticated"}}}`+"\n", requestID(r), msg)
}

// requestID is the JSON-RPC id of the request r carries when it is a
// number or a string of at most 64 bytes, else null. It reads at most 4 KiB
// of the body.
func requestID(r *http.Request) string {
	if r.Method != http.MethodPost || r.Body == nil {
		return "null"
	}
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 4<<10))
	if json.Unmarshal(body, &msg) != nil || len(msg.ID) == 0 || len(msg.ID) > 66 {
		return "null"
	}
	var id any
	if err := json.Unmarshal(msg.ID, &id); err != nil {
		return "null"
	}
	switch id.(type) {
	case float64, string:
		return string(msg.ID)
	}
	return "null"
}

// heldWriter is the response of one POST to /mcp. go-sdk writes a call's
// events to it; while the call is held for a person, hold starts the
// response (status and headers) at once and keeps SSE comments flowing,
// which every SSE reader ignores (go-sdk's and the TypeScript SDK's
// included), so that no client or proxy gives up on a response that has
// not started or has gone quiet.
type heldWriter struct {
	http.ResponseWriter
	mu      sync.Mutex // guards writes to the response and ended
	ended   bool       // the POST's handler returned: the response may no longer be written
	comment []byte     // scratch, under mu
}

func (w *heldWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
}

func (w *heldWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

// Flush flushes the response (go-sdk flushes after each event).
func (w *heldWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *heldWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// keepAlive writes one SSE comment line (": text") and flushes; the first
// one sends the status and headers go-sdk has set. It does nothing when
// the response is not an event stream (go-sdk answers application/json
// only when configured to) or when the POST has ended.
func (w *heldWriter) keepAlive(text string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || w.Header().Get("Content-Type") != "text/event-stream" {
		return nil
	}
	// The server's write timeout bounds an ordinary answer (30 s under
	// serve); a held call's answer lives as long as a person takes, so
	// each comment moves its write deadline on by heldWriteMargin: a
	// reader that stops reading is still cut, a held call never is.
	rc := http.NewResponseController(w.ResponseWriter)
	if err := rc.SetWriteDeadline(time.Now().Add(heldWriteMargin)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	w.comment = append(append(append(w.comment[:0], ": "...), text...), "\n\n"...)
	if _, err := w.ResponseWriter.Write(w.comment); err != nil {
		return err
	}
	return rc.Flush()
}

// heldWriteMargin is how long after a keep-alive comment a held call's
// answer may still be written: more than two keep-alive periods (15 s),
// as long as the server's own write timeout.
const heldWriteMargin = 45 * time.Second

// end marks the POST's handler returned.
func (w *heldWriter) end() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}

// hold starts the response of the HTTP POST that brought a call (extra
// names it) now that the call waits for a person, and writes an SSE
// comment every KeepAliveEvery until the returned function is called (the
// wait ended). Over stdio, or for a POST it does not know, it does
// nothing. The comments say only what the client already knows: that its
// call waits, and the request's id.
func (g *Gateway) hold(extra *mcp.RequestExtra, requestID, tool string) (release func()) {
	if extra == nil || extra.Header == nil {
		return func() {}
	}
	v, ok := g.held.Load(extra.Header.Get(callHeader))
	if !ok {
		return func() {}
	}
	w := v.(*heldWriter)
	text := fmt.Sprintf("countersign: %s waits for a human approval (request %s)", tool, requestID)
	if err := w.keepAlive(text); err != nil {
		g.opts.Logger.Warn("mcp held response not started", "request_id", requestID, "err", err)
	}
	t := time.NewTicker(g.opts.KeepAliveEvery)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // exits when release is called
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := w.keepAlive(text); err != nil {
					g.opts.Logger.Warn("mcp keep-alive not sent", "request_id", requestID, "err", err)
				}
			}
		}
	}()
	return func() {
		t.Stop()
		close(stop)
		<-done
	}
}

// ownCopy is a copy of res for one call's answer: go-sdk writes to the
// result a handler returns (its result type and _meta under 2026-07-28),
// so identical calls sharing one execution (execute) each answer with
// their own copy and the shared result is never written.
func ownCopy(res *mcp.CallToolResult) *mcp.CallToolResult {
	if res == nil {
		return nil
	}
	c := *res
	c.Meta = maps.Clone(res.Meta)
	return &c
}

// bearer returns the key of an Authorization: Bearer header.
func bearer(h http.Header) string {
	if h == nil {
		return ""
	}
	k, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(k)
}

// headerTransport adds fixed headers to each request to an upstream.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.headers {
		r.Header.Set(k, v)
	}
	return t.base.RoundTrip(r)
}

// CheckStdio checks the settings of `countersign mcp` before anything is
// built: the server's http(s) URL, the API key the calls are made with,
// and the policy file naming the upstreams. Each error names the
// environment variable (and flag) the setting is read from.
func CheckStdio(serverURL, apiKey, configFile string) []error {
	errs := client.CheckServer(serverURL, apiKey)
	if configFile == "" {
		errs = append(errs, errors.New("COUNTERSIGN_CONFIG (--config): required (the policy file with mcp.upstreams)"))
	}
	return errs
}

// RunStdio serves one MCP client over stdin/stdout until it disconnects
// or ctx ends (`countersign mcp`).
func (g *Gateway) RunStdio(ctx context.Context) error {
	return g.server.Run(ctx, &mcp.StdioTransport{})
}

// Clients is Options.API for the Countersign server at baseURL, reached
// with hc: a client of its HTTP API (agent/api/client) for each key.
func Clients(baseURL string, hc *http.Client) func(key string) API {
	return func(key string) API {
		c := client.New(baseURL, key)
		c.HTTP = hc
		return c
	}
}
