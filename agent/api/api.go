// Package api is Countersign's native HTTP API (/v1): agents Countersign
// did not write ask for approval of a tool call, wait for the decision
// (long poll) and report what they did. Every request goes through the
// same gate, lifecycle owner, Slack card and audit stream as the agent
// loop's own; only its source differs (approval.Caller, no task thread).
//
// The API never decides: it has no endpoint that approves or rejects, so
// a caller can never decide its own request. Decisions come only from
// Slack. docs/api.md describes the endpoints; openapi.json (served at
// /v1/openapi.json) is their contract, checked against the handlers by a
// test.
package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	_ "embed"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clock"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
)

// Lifecycle is what the API needs of the owner of request transitions
// (*approval.Lifecycle).
type Lifecycle interface {
	// Propose judges a call (the tool's identity, schema, deny rules, the
	// gate), audits it and, when a person must decide, creates its
	// request and has its card posted; with Settle, the gate's own answer
	// is stored as a final request. Errors wrap
	// approval.ErrInvalidToolName, ErrConfusableTool, ErrUnknownTool,
	// ErrInvalidArgs (ErrInvalidSchema for an unusable input schema) or
	// ErrNotSaved.
	Propose(ctx context.Context, p approval.Proposal) (approval.Proposed, error)
	// ClaimTokenRequest moves an approved request (r, as the API just
	// read it) to executing at most once and returns the claim token
	// FinishClaim requires; every later claim is refused with the request
	// as it now is: approval.ErrAlreadyClaimed, approval.ErrAbandoned or
	// approval.ErrNotApproved.
	ClaimTokenRequest(ctx context.Context, r *approval.Request, owner string) (*approval.Request, string, error)
	// FinishClaim records the outcome of the claim whose token is given,
	// audits it and redraws the card: approval.ErrClaimToken,
	// ErrNotClaimed, ErrAlreadyClaimed, ErrAbandoned or ErrNotApproved
	// (with the request as it now is) otherwise.
	FinishClaim(ctx context.Context, id, token, owner string, o approval.Outcome) (*approval.Request, error)
	// Cancel ends a pending request without a decision (its caller
	// withdrew it): recorded, audited, waiters woken, card redrawn. A final
	// request gives an *approval.DecidedError with the request as it is.
	Cancel(ctx context.Context, id, by, reason string) (*approval.Request, error)
}

var _ Lifecycle = (*approval.Lifecycle)(nil)

// Requests is what the API reads of the request store (*store.Store).
type Requests interface {
	// Request returns the stored request, or approval.ErrNotFound.
	Request(ctx context.Context, id string) (*approval.Request, error)
	// Wait returns the request once it is final, served by the store's
	// wake hub; an error when ctx ends first.
	Wait(ctx context.Context, id string) (*approval.Request, error)
	// Watch is Wait without a goroutine: it returns the request when it
	// is final already; otherwise ready is called once, from the hub's
	// goroutine (it must not block), with what Wait would return, unless
	// stop is called first.
	Watch(ctx context.Context, id string, ready func(*approval.Request, error)) (final *approval.Request, stop func(), err error)
	// Pending returns every pending request, oldest first.
	Pending(ctx context.Context) ([]*approval.Request, error)
}

// Key is one API key as the policy file lists it (api.keys): its SHA-256,
// never the key, the tools it may ask for, the Slack user it acts for and
// its rate per minute in this process.
type Key = policyfile.APIKey

// HashKey returns the lowercase hex SHA-256 of an API key, as the policy
// file lists it.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Defaults for Options.
const (
	DefaultMaxBodyBytes = 1 << 20
	DefaultMaxWait      = 60 * time.Second
	DefaultTimeout      = 24 * time.Hour
	// MaxCallerFacts bounds the facts a caller may send with a request.
	MaxCallerFacts = 20
	// MaxResultBytes bounds the result text a caller reports.
	MaxResultBytes = 4000
)

// Options configure a Server. Lifecycle, Requests, Audit and IDSecret
// are required.
type Options struct {
	Lifecycle Lifecycle
	Requests  Requests
	Audit     approval.Auditor
	// IDSecret is the deployment's secret (store.Store.Secret: the same
	// bytes in every process of the deployment, other bytes in any other):
	// request ids are an HMAC of the key and the caller's call id under
	// it, so the same call id names the same request within the
	// deployment and one no other deployment can compute.
	IDSecret []byte
	Keys     []Key
	// Preview returns the system-of-record preview of a declared tool that
	// has a preview source; ok is false when it has none.
	Preview func(ctx context.Context, tool string, args json.RawMessage) (p approval.Preview, ok bool)
	// MaxBodyBytes bounds a request body, default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxWait bounds a long poll (?wait=), default DefaultMaxWait.
	MaxWait time.Duration
	// Timeout is a request's deadline when its tool's policy sets none,
	// default DefaultTimeout.
	Timeout time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// Logger receives one line per refusal or failure, default discard.
	Logger *slog.Logger
	// Names names the approvers in the answers (approver_name); nil shows
	// ids.
	Names Names
	// Limiter spends each key's calls (rate_per_minute). Nil keeps a
	// budget per key in this process only; serve passes the store's, one
	// budget per key shared by every replica.
	Limiter Limiter
	// Polls counts the long polls begun on each request, for withdrawing
	// the requests of callers that went away (gone.go). Nil counts in
	// this process only; serve passes the store's, which every replica
	// shares.
	Polls Polls
	// WithdrawGrace is how long a caller whose long poll (sent with
	// withdraw_if_gone) ended without the decision has to poll again
	// before its request is withdrawn, default DefaultWithdrawGrace.
	WithdrawGrace time.Duration
	// Ticker makes the ticker RunWithdrawals waits on, default
	// time.NewTicker.
	Ticker func(d time.Duration) (c <-chan time.Time, stop func())
	// Reuse hands a connection back to the HTTP server once a parked long
	// poll (park.go) has answered on it, for the caller's next request,
	// with what the caller has sent of that request already; serve passes
	// its server's. It may block while the connection is idle. Nil closes
	// the connection after the answer (Connection: close).
	Reuse func(conn net.Conn, sent []byte)
}

// Server serves the /v1 API. It is safe for concurrent use.
type Server struct {
	life    Lifecycle
	req     Requests
	audit   approval.Auditor
	keys    map[string]*keyState // by SHA-256 hex
	secret  []byte               // Options.IDSecret
	macs    sync.Pool            // of HMAC-SHA256 under secret (requestID)
	preview func(context.Context, string, json.RawMessage) (approval.Preview, bool)
	maxBody int64
	maxWait time.Duration
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	names   Names
	limit   Limiter
	waiting atomic.Int64 // long polls in progress, parked or held
	reuse   func(net.Conn, []byte)
	// The parked long polls (park.go), answered now by Release.
	parkedMu sync.Mutex
	parked   map[*parked]struct{}
	released bool          // Release was called: park no more
	drained  chan struct{} // closed when the last parked poll has answered after Release
	onPark   func(bool)    // test hook: a poll was parked (true) or ended (false); export_test.go
	onAnswer func(string)  // test hook: a parked poll of this request id has written its answer
	unauth   refusalTally  // refusals without a valid key, per source (refusals.go)
	keyed    refusalTally  // refusals of a valid key, per key and code
	polls    Polls
	grace    time.Duration // Options.WithdrawGrace
	gone     goneSet       // requests whose opted-in polls ended without the decision (gone.go)
	ticker   func(time.Duration) (<-chan time.Time, func())
	onGone   func(string) // test hook: an opted-in poll of this request id ended without the decision
	// creating serialises the creation of one request id in this process,
	// so concurrent retries of a call id make one card.
	creating idLocks
}

type keyState struct {
	Key
	rate int // calls per minute: RatePerMinute, or DefaultRatePerMinute
}

// DefaultRatePerMinute is a key's rate when the policy sets none.
const DefaultRatePerMinute = 120

// New checks opts and returns a Server.
func New(opts Options) (*Server, error) {
	if err := cmp.Or(
		option.Required("api: Options.Lifecycle", opts.Lifecycle == nil),
		option.Required("api: Options.Requests", opts.Requests == nil),
		option.Required("api: Options.Audit", opts.Audit == nil),
		option.Required("api: Options.IDSecret", len(opts.IDSecret) == 0),
	); err != nil {
		return nil, err
	}
	s := &Server{life: opts.Lifecycle, req: opts.Requests, audit: opts.Audit, secret: bytes.Clone(opts.IDSecret),
		keys: map[string]*keyState{}, preview: opts.Preview,
		maxBody: opts.MaxBodyBytes, maxWait: opts.MaxWait, timeout: opts.Timeout, now: opts.Now, log: opts.Logger,
		names: cmp.Or[Names](opts.Names, noNames{}), limit: opts.Limiter, reuse: opts.Reuse, parked: map[*parked]struct{}{},
		polls: opts.Polls, grace: opts.WithdrawGrace, ticker: opts.Ticker, gone: goneSet{m: map[string]gone{}}}
	s.maxBody = option.PositiveOr(s.maxBody, DefaultMaxBodyBytes)
	s.maxWait = option.PositiveOr(s.maxWait, DefaultMaxWait)
	s.timeout = option.PositiveOr(s.timeout, DefaultTimeout)
	s.now = option.FuncOr(s.now, time.Now)
	s.log = cmp.Or(s.log, slog.New(slog.DiscardHandler))
	if s.limit == nil {
		s.limit = newLocalLimiter(s.now)
	}
	if s.polls == nil {
		s.polls = newLocalPolls(s.now)
	}
	s.grace = option.PositiveOr(s.grace, DefaultWithdrawGrace)
	s.ticker = option.FuncOr(s.ticker, clock.NewTicker)
	for _, k := range opts.Keys {
		h := strings.ToLower(k.SHA256)
		if len(h) != sha256.Size*2 {
			return nil, fmt.Errorf("api: key %q: SHA256 must be 64 hex digits", k.Name)
		}
		if _, dup := s.keys[h]; dup {
			return nil, fmt.Errorf("api: key %q: the same key is listed twice", k.Name)
		}
		s.keys[h] = &keyState{Key: k, rate: option.PositiveOr(k.RatePerMinute, DefaultRatePerMinute)}
	}
	return s, nil
}

// KnowsKey tells whether key is one of the API's keys (by its SHA-256;
// the comparison of a hash leaks nothing of the key).
func (s *Server) KnowsKey(key string) bool {
	_, ok := s.keys[HashKey(key)]
	return ok
}

// Waiting is how many long polls are being held now.
func (s *Server) Waiting() int64 { return s.waiting.Load() }

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 document of the API.
func OpenAPI() []byte { return slices.Clone(openAPI) }

// The API's routes, as ServeMux patterns.
const (
	RouteCreate  = "POST /v1/requests"
	RouteList    = "GET /v1/requests"
	RouteGet     = "GET /v1/requests/{id}"
	RouteClaim   = "POST /v1/requests/{id}/claim"
	RouteResult  = "POST /v1/requests/{id}/result"
	RouteCancel  = "POST /v1/requests/{id}/cancel"
	RouteKeySelf = "GET /v1/keys/self"
	RouteOpenAPI = "GET /v1/openapi.json"
)

// Routes lists every route Handler serves (openapi.json documents each).
func Routes() []string {
	return []string{RouteCreate, RouteList, RouteGet, RouteClaim, RouteResult, RouteCancel, RouteKeySelf, RouteOpenAPI}
}

// Handler returns the API's routes, all under /v1/.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	handlers := map[string]http.HandlerFunc{
		RouteCreate:  s.authed(s.create),
		RouteList:    s.authed(s.list),
		RouteGet:     s.authed(s.get),
		RouteClaim:   s.authed(s.claim),
		RouteResult:  s.authed(s.result),
		RouteCancel:  s.authed(s.cancel),
		RouteKeySelf: s.authed(s.keySelf),
		RouteOpenAPI: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(openAPI)
		},
	}
	for _, route := range Routes() {
		mux.HandleFunc(route, handlers[route])
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		s.refuse(w, r, call{}, http.StatusNotFound, ErrorDetail{Code: "not_found", Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// call is what one HTTP call carries through the handlers.
type call struct {
	id  string // the HTTP request id (X-Request-Id), for logs and audit
	key *keyState
}

func (c call) keyName() string {
	if c.key == nil {
		return ""
	}
	return c.key.Name
}

// requestIDEncoding writes request ids as approval.NewID does.
var requestIDEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// requestID is the id of the request a key's call id names on a surface
// (the caller kind, and the request kind: HumanLayer's function calls and
// contact requests have call ids of their own): the same call id always
// gives the same request in this deployment (idempotency). It is an
// HMAC-SHA256 under the deployment's secret (Options.IDSecret): without
// the key it cannot be guessed, and another deployment — on the same
// Redis server, with the same key and call id — names another request.
func (s *Server) requestID(caller string, kind approval.Kind, keyHash, callID string) string {
	space := "countersign-api" // /v1, as ids were made before other surfaces
	if caller != approval.CallerAPI || kind != approval.KindCall {
		space = "countersign-" + caller + "-" + string(kind)
	}
	mac, _ := s.macs.Get().(hash.Hash)
	if mac == nil {
		mac = hmac.New(sha256.New, s.secret)
	}
	mac.Reset()
	var msg [320]byte // call ids are at most 200 bytes: no allocation
	mac.Write(append(append(append(append(append(msg[:0], space...), 0), keyHash...), 0), callID...))
	var sum [sha256.Size]byte
	mac.Sum(sum[:0])
	s.macs.Put(mac)
	var id [4 + 26]byte // "req_" and 16 bytes in base32 without padding
	copy(id[:], "req_")
	requestIDEncoding.Encode(id[4:], sum[:16])
	for i, c := range id {
		if 'A' <= c && c <= 'Z' {
			id[i] = c + 'a' - 'A'
		}
	}
	return string(id[:])
}

// idLocks serialises what is done under one request id in this process,
// and nothing else: calls with other ids never wait for it (a lock per
// stripe of ids did: two different calls on one of 64 stripes took turns
// for a whole round trip to Redis, about one check in a hundred at 2,000
// a second).
type idLocks struct {
	mu   sync.Mutex
	held map[string]*idLock // the ids locked or waited for
}

// idLock is one id's lock and how many hold it or wait for it.
type idLock struct {
	sync.Mutex
	n int
}

// lock locks id and returns its unlock.
func (l *idLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	k := l.held[id]
	if k == nil {
		if l.held == nil {
			l.held = map[string]*idLock{}
		}
		k = &idLock{}
		l.held[id] = k
	}
	k.n++
	l.mu.Unlock()
	k.Lock()
	return func() {
		k.Unlock()
		l.mu.Lock()
		if k.n--; k.n == 0 {
			delete(l.held, id)
		}
		l.mu.Unlock()
	}
}

// owner is who claims and finishes an API request's execution.
func owner(k *keyState) string { return approval.CallerAPI + ":" + k.Name }

// hlOwner is who claims a HumanLayer call on its caller's behalf.
func hlOwner(k *keyState) string { return approval.CallerHumanLayer + ":" + k.Name }
