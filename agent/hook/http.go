package hook

// This file: the hook as Claude Code's http hook. Claude Code posts the
// hook input to Countersign itself (POST /hooks/claude-code, the API key
// in an Authorization header Claude Code fills from the developer's
// environment) and reads the same answer from the response body: nothing
// to install on the developer's machine. The handler runs the very code
// the command hook runs (Run, Decide, Report), and its calls of the /v1
// API go through the API's own handler in this process — the same key
// check, rate limit, idempotency, claim and audit as the command hook's
// calls over the network.

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/agent/api/client"
)

// RouteHTTP is the http hook's route, as a ServeMux pattern; PathHTTP is
// the path its settings name.
const (
	PathHTTP  = "/hooks/claude-code"
	RouteHTTP = "POST " + PathHTTP
)

// Defaults of HTTPOptions.
const (
	DefaultTimeout       = 9 * time.Minute
	DefaultMaxTimeout    = 24 * time.Hour
	maxHTTPBody          = 2 << 20 // above the API's 1 MiB body: a larger input is refused by the API (413), saying so
	httpAnswerMargin     = 30 * time.Second
	defaultMaxHTTPClaims = 10000
	httpClaimTTL         = 24 * time.Hour
)

// HTTPOptions configure the http hook's handler. API is required.
type HTTPOptions struct {
	// API is the handler of Countersign's /v1 API, which the hook calls
	// in this process.
	API http.Handler
	// Timeout is how long a call waits for a decision when the hook's URL
	// sets none (?timeout=), default DefaultTimeout; ?timeout= may ask
	// for up to MaxTimeout (default DefaultMaxTimeout).
	Timeout, MaxTimeout time.Duration
	// Claims keeps a claim's token from a call's PreToolUse post to its
	// PostToolUse post; nil keeps them in this process (MemClaims).
	Claims Claims
	// Logger receives one line per post that went wrong, default discard.
	Logger *slog.Logger
}

// HTTP returns the handler of Claude Code's http hook (RouteHTTP): the
// body is the hook input, the answer the hook's JSON output, always 200 —
// a refusal is a deny, so the call is refused even where the hook is not
// set to "onFailure": "block". The URL's ?timeout= (a duration such as
// 11m) is the hook's --timeout.
func HTTP(o HTTPOptions) http.Handler {
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.MaxTimeout = cmp.Or(o.MaxTimeout, DefaultMaxTimeout)
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	if o.Claims == nil {
		o.Claims = NewMemClaims(defaultMaxHTTPClaims, httpClaimTTL, time.Now)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(RouteHTTP, o.serve)
	mux.HandleFunc("/hooks/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such endpoint: "+r.Method+" "+r.URL.Path+" (Claude Code's http hook posts to "+PathHTTP+")", http.StatusNotFound)
	})
	return mux
}

func (o HTTPOptions) serve(w http.ResponseWriter, r *http.Request) {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	ho := Options{Server: "this server", Timeout: o.Timeout}
	if q := r.URL.Query().Get("timeout"); q != "" {
		d, err := time.ParseDuration(q)
		switch {
		case err != nil || d <= 0:
			ho.Problem = fmt.Sprintf("the hook's URL has timeout=%q, not a duration such as 11m", q)
		case d > o.MaxTimeout:
			ho.Problem = fmt.Sprintf("the hook's URL has timeout=%s, above this server's limit of %s", d, o.MaxTimeout)
		default:
			ho.Timeout = d
		}
	}
	if key == "" {
		ho.Problem = `the http hook sent no API key: give it "headers": {"Authorization": "Bearer $COUNTERSIGN_API_KEY"} and "allowedEnvVars": ["COUNTERSIGN_API_KEY"], with COUNTERSIGN_API_KEY set where Claude Code starts`
	}
	if ho.Problem == "" {
		c := client.New("http://countersign.in-process", key)
		// The API's handler in this process, seeing the address Claude
		// Code posted from (for the API's tally of refusals).
		c.HTTP = client.InProcess(o.API, r.RemoteAddr)
		// A long poll whose caller goes (Claude Code timed the hook out
		// and hung up) is withdrawn; Decide withdraws it itself first.
		c.WithdrawIfGone = true
		ho.API = c
		sum := sha256.Sum256([]byte(key))
		ho.Claims = keyedClaims{Claims: o.Claims, key: hex.EncodeToString(sum[:8])}
	}
	// The answer may come long after the server's write timeout.
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(ho.Timeout + httpAnswerMargin)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		o.Logger.Warn("claude code http hook: extend the write deadline", "err", err)
	}
	var warnings bytes.Buffer
	ho.Warnings = &warnings
	w.Header().Set("Content-Type", "application/json")
	var answer bytes.Buffer
	code := Run(r.Context(), http.MaxBytesReader(w, r.Body, maxHTTPBody), &answer, &warnings, ho)
	if warnings.Len() > 0 || code != 0 {
		o.Logger.Warn("claude code http hook", "remote", r.RemoteAddr, "warning", strings.TrimSpace(warnings.String()), "exit", code)
	}
	if code != 0 {
		// No answer could be made: Claude Code treats a non-2xx status as
		// the hook's failure (a refusal with "onFailure": "block").
		http.Error(w, "countersign: no answer could be made", http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(answer.Bytes())
}

// keyedClaims keeps the claims of one API key apart from another's: a
// tool_use_id posted with another key finds nothing.
type keyedClaims struct {
	Claims
	key string
}

func (k keyedClaims) Put(toolUseID, requestID, token string) error {
	return k.Claims.Put(k.key+"/"+toolUseID, requestID, token)
}

func (k keyedClaims) Take(toolUseID string) (string, string, bool, error) {
	return k.Claims.Take(k.key + "/" + toolUseID)
}

// MemClaims keeps claims in this process's memory, for the http hook: at
// most max of them, each for ttl. A PostToolUse post that reaches another
// process (or this one after a restart) finds none, and the result is not
// reported: the call ran once all the same.
type MemClaims struct {
	max int
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]memClaim
}

type memClaim struct {
	requestID, token string
	at               time.Time
}

var _ Claims = (*MemClaims)(nil)

// NewMemClaims returns an empty MemClaims.
func NewMemClaims(max int, ttl time.Duration, now func() time.Time) *MemClaims {
	return &MemClaims{max: max, ttl: ttl, now: now, m: map[string]memClaim{}}
}

// Put keeps request id and token for the tool use; when max are kept,
// the oldest (or an expired one) makes room.
func (c *MemClaims) Put(toolUseID, requestID, token string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.m[toolUseID]; !ok && len(c.m) >= c.max {
		oldest := ""
		for id, k := range c.m {
			if now.Sub(k.at) > c.ttl {
				oldest = id
				break
			}
			if oldest == "" || k.at.Before(c.m[oldest].at) {
				oldest = id
			}
		}
		delete(c.m, oldest)
	}
	c.m[toolUseID] = memClaim{requestID: requestID, token: token, at: now}
	return nil
}

// Take returns and forgets what Put kept; ok is false when nothing is (or
// it is older than ttl).
func (c *MemClaims) Take(toolUseID string) (requestID, token string, ok bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.m[toolUseID]
	delete(c.m, toolUseID)
	if !ok || c.now().Sub(k.at) > c.ttl {
		return "", "", false, nil
	}
	return k.requestID, k.token, true, nil
}
