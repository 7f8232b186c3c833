// Package authzen is Countersign as an OpenID AuthZEN Policy Decision
// Point: the Authorization API 1.0 evaluation endpoints
// (POST /access/v1/evaluation, /access/v1/evaluations) with discovery
// (GET /.well-known/authzen-configuration), and the draft Access Request
// and Approval Profile (POST /access/v1/requests, GET its task's status
// endpoint) for the calls a person must approve.
//
// An evaluation is a tool call: resource {type "tool", id <tool>,
// properties.arguments}, action "call", subject the one the call is made
// for. It is asked of the /v1 API (the same door as every surface: the
// caller's API key, its scope and rate limit, the policy and the audit are
// the API's) with judge_only: a call the policy lets through is true, one
// it refuses false with the policy's reason, and one that needs a person
// is a requestable denial that creates nothing. Its access request
// proposes the call (the card); once approved, the caller evaluates again
// and that evaluation claims the request, so it passes once: a second
// evaluation of the same call is denied as already ran.
//
// It imports only agent/api/client and the standard library.
package authzen

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/agent/api/client"
)

// API is what the service needs of Countersign's /v1 API, for one key
// (*client.Client).
type API interface {
	// Request asks for approval of a call (c.JudgeOnly: only what the
	// policy says). A refusal is a *client.Error.
	Request(ctx context.Context, c client.Call) (*client.Request, error)
	// Get returns the request (wait 0: at once). ErrNotFound is a
	// *client.Error with status 404.
	Get(ctx context.Context, id string, wait time.Duration) (*client.Request, error)
	// Claim claims an approved request: exactly one claim wins; every
	// other is a *client.Error (already_claimed, needs_approvals,
	// refused, abandoned, not_approved).
	Claim(ctx context.Context, id string) (*client.Claimed, error)
	// Result reports what came of the request claimed with token.
	Result(ctx context.Context, id, token string, status client.Status, output string) (*client.Request, error)
}

var _ API = (*client.Client)(nil)

// The paths served (PathDiscovery exactly; the others below PathAccess).
const (
	PathDiscovery   = "/.well-known/authzen-configuration"
	PathAccess      = "/access/v1/"
	PathEvaluation  = "/access/v1/evaluation"
	PathEvaluations = "/access/v1/evaluations"
	PathRequests    = "/access/v1/requests"
)

// CapabilityAccessRequest is the profile's capability URN, listed in the
// discovery document.
const CapabilityAccessRequest = "urn:openid:authzen:capability:access-request"

// callIDPrefix marks the /v1 call ids of AuthZEN calls: a task is only
// ever a request this surface made.
const callIDPrefix = "authzen-"

// Options configure a Service.
type Options struct {
	// API returns a client of the /v1 API calling with key (the caller's
	// bearer key). Required.
	API func(key string) API
	// Secret is the deployment's secret (the same on every replica, at
	// least 16 bytes); the binding tokens of requestable denials are keyed
	// by a key derived from it. Required.
	Secret []byte
	// DenialTTL is how long a requestable denial may be submitted as an
	// access request, default 10 minutes.
	DenialTTL time.Duration
	// MaxBody is the largest request body read, default 1 MiB.
	MaxBody int64
	// Now is the clock of the binding tokens, default time.Now.
	Now func() time.Time
	// Logger logs evaluations that failed for a system reason. Default:
	// discard.
	Logger *slog.Logger
}

// Service serves the AuthZEN endpoints. It is safe for concurrent use.
type Service struct {
	opts Options
	// idem remembers the body of each Idempotency-Key seen by this
	// process (bounded), so a key reused for another body is refused.
	idem idempotency
}

// New returns a Service.
func New(o Options) (*Service, error) {
	switch {
	case o.API == nil:
		return nil, errors.New("authzen: Options.API is required")
	case len(o.Secret) < 16:
		return nil, errors.New("authzen: Options.Secret must be at least 16 bytes")
	}
	m := hmac.New(sha256.New, o.Secret)
	m.Write([]byte("countersign authzen binding key"))
	o.Secret = m.Sum(nil) // a key of its own: never the secret's other uses'
	if o.DenialTTL <= 0 {
		o.DenialTTL = 10 * time.Minute
	}
	if o.MaxBody <= 0 {
		o.MaxBody = 1 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{opts: o, idem: idempotency{seen: map[string]string{}}}, nil
}

// Handler serves PathDiscovery and everything below PathAccess.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathDiscovery, s.discovery)
	mux.HandleFunc("POST "+PathEvaluation, s.authed(s.evaluation))
	mux.HandleFunc("POST "+PathEvaluations, s.authed(s.evaluations))
	mux.HandleFunc("POST "+PathRequests, s.authed(s.submit))
	mux.HandleFunc("GET "+PathRequests+"/{id}", s.authed(s.task))
	mux.HandleFunc(PathAccess, func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, "not_found", "", "no AuthZEN endpoint at "+r.Method+" "+r.URL.Path)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The spec's correlation: X-Request-ID is echoed on every answer.
		if id := r.Header.Get("X-Request-ID"); id != "" && len(id) <= 200 {
			w.Header().Set("X-Request-ID", id)
		}
		mux.ServeHTTP(w, r)
	})
}

// base is the PDP's identifier as the caller reached it: the scheme
// (X-Forwarded-Proto behind a proxy) and host of the request.
func base(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		scheme = p
	}
	return scheme + "://" + r.Host
}

// discovery is the PDP metadata (Authorization API 1.0 §9; the access
// request endpoint and capability of the profile).
func (s *Service) discovery(w http.ResponseWriter, r *http.Request) {
	b := base(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"policy_decision_point":       b,
		"access_evaluation_endpoint":  b + PathEvaluation,
		"access_evaluations_endpoint": b + PathEvaluations,
		"access_request_endpoint":     b + PathRequests,
		"capabilities":                []string{CapabilityAccessRequest},
	})
}

// caller is one authenticated call: its key's /v1 client and the key's
// digest, which binding tokens carry.
type caller struct {
	api    API
	keySum [32]byte
}

// authed requires a bearer API key before h runs; the key itself is
// checked by the /v1 API on the first call (unknown: 401 there).
func (s *Service) authed(h func(w http.ResponseWriter, r *http.Request, c caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		scheme, key, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		key = strings.TrimSpace(key)
		if !ok || !strings.EqualFold(scheme, "bearer") || key == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="countersign"`)
			problem(w, http.StatusUnauthorized, "unauthenticated", "", "missing API key: send Authorization: Bearer <key>")
			return
		}
		h(w, r, caller{api: s.opts.API(key), keySum: sha256.Sum256([]byte(key))})
	}
}

// readBody decodes the JSON object body of r into v, answering a refusal
// itself (false).
func (s *Service) readBody(w http.ResponseWriter, r *http.Request, v any) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, s.opts.MaxBody+1))
	switch {
	case err != nil:
		problem(w, http.StatusBadRequest, "invalid_request", "", "reading the body: "+err.Error())
		return nil, false
	case int64(len(body)) > s.opts.MaxBody:
		problem(w, http.StatusRequestEntityTooLarge, "body_too_large", "", fmt.Sprintf("the body is over %d bytes", s.opts.MaxBody))
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		field := ""
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field = te.Field
			err = fmt.Errorf("%s must be %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		problem(w, http.StatusBadRequest, "invalid_request", field, "the body is not a valid AuthZEN request: "+err.Error())
		return nil, false
	}
	return body, true
}

func jsonKind(k string) string {
	switch k {
	case "struct", "map":
		return "an object"
	case "slice":
		return "an array"
	case "bool":
		return "a boolean"
	}
	return "a " + k
}

// Subject, Action and Resource are the Authorization API's entities.
type (
	Subject struct {
		Type       string          `json:"type"`
		ID         string          `json:"id"`
		Properties json.RawMessage `json:"properties,omitempty"`
	}
	Action struct {
		Name       string          `json:"name"`
		Properties json.RawMessage `json:"properties,omitempty"`
	}
	Resource struct {
		Type       string          `json:"type"`
		ID         string          `json:"id"`
		Properties json.RawMessage `json:"properties,omitempty"`
	}
)

// Evaluation is one access evaluation request (the single endpoint's
// body, and one item of the batch's).
type Evaluation struct {
	Subject  *Subject       `json:"subject,omitempty"`
	Action   *Action        `json:"action,omitempty"`
	Resource *Resource      `json:"resource,omitempty"`
	Context  map[string]any `json:"context,omitempty"`
}

// Decision is an evaluation's answer.
type Decision struct {
	Decision bool           `json:"decision"`
	Context  map[string]any `json:"context,omitempty"`
}

// Actions that mean "call the tool": the profile's own name, and MCP's
// method for a gateway that maps it.
const (
	ActionCall    = "call"
	ActionMCPCall = "tools/call"
	// ResourceTool is the resource type of a tool.
	ResourceTool = "tool"
)

// call is an evaluation read as a tool call.
type call struct {
	subject  Subject
	action   Action
	resource Resource
	tool     string
	args     json.RawMessage // compact JSON object
	reason   string          // context.reason, shown as the caller's
	approval string          // context.authzen_access_request_approval.approval_id
	// id is the /v1 call id: the same subject, tool and arguments are
	// the same call, whoever evaluates it and however often.
	id string
}

// badField is an evaluation's refusal naming its field.
type badField struct{ field, msg string }

func (e *badField) Error() string { return e.field + ": " + e.msg }

// readCall reads e as a tool call; prefix names its place in the body
// ("evaluations[2]." in a batch) for the refusal.
func readCall(e Evaluation, prefix string) (call, error) {
	bad := func(field, msg string) (call, error) { return call{}, &badField{prefix + field, msg} }
	switch {
	case e.Subject == nil:
		return bad("subject", "is required")
	case strings.TrimSpace(e.Subject.Type) == "":
		return bad("subject.type", "is required")
	case strings.TrimSpace(e.Subject.ID) == "":
		return bad("subject.id", "is required")
	case e.Action == nil:
		return bad("action", "is required")
	case strings.TrimSpace(e.Action.Name) == "":
		return bad("action.name", "is required")
	case e.Resource == nil:
		return bad("resource", "is required")
	case strings.TrimSpace(e.Resource.Type) == "":
		return bad("resource.type", "is required")
	case strings.TrimSpace(e.Resource.ID) == "":
		return bad("resource.id", "is required (the tool's name)")
	}
	c := call{subject: *e.Subject, action: *e.Action, resource: *e.Resource, tool: strings.TrimSpace(e.Resource.ID), args: json.RawMessage("{}")}
	if len(e.Resource.Properties) > 0 && string(e.Resource.Properties) != "null" {
		var props map[string]json.RawMessage
		if err := json.Unmarshal(e.Resource.Properties, &props); err != nil {
			return bad("resource.properties", "must be an object")
		}
		if raw, ok := props["arguments"]; ok && string(raw) != "null" {
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
				return bad("resource.properties.arguments", "must be a JSON object (the tool call's arguments)")
			}
			c.args = buf.Bytes()
		}
	}
	if v, ok := e.Context["reason"]; ok {
		r, isStr := v.(string)
		if !isStr {
			return bad("context.reason", "must be a string")
		}
		c.reason = r
	}
	if v, ok := e.Context["authzen_access_request_approval"]; ok {
		m, isObj := v.(map[string]any)
		id, isStr := m["approval_id"].(string)
		if !isObj || !isStr || id == "" {
			return bad("context.authzen_access_request_approval", "must be the approval_context of the approved task, unchanged")
		}
		c.approval = id
	}
	digest, err := canonical(c.args)
	if err != nil {
		return bad("resource.properties.arguments", err.Error())
	}
	h := sha256.New()
	for _, part := range []string{c.subject.Type, c.subject.ID, c.tool, digest} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	c.id = callIDPrefix + hex.EncodeToString(h.Sum(nil)[:16])
	return c, nil
}

// canonical is the arguments' canonical JSON (keys sorted, numbers as
// written), so the same arguments are the same call however spaced or
// ordered.
func canonical(args json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// apiCall is c as the /v1 API takes it.
func (c call) apiCall(judgeOnly bool) client.Call {
	return client.Call{Tool: c.tool, Arguments: c.args, CallID: c.id, Reason: c.reason, JudgeOnly: judgeOnly,
		Facts: []client.Fact{{Label: "AuthZEN subject", Value: c.subject.Type + " " + c.subject.ID}}}
}

// bindingToken binds a requestable denial to the exact evaluation (the
// key that asked, the subject, the tool and its arguments) until exp: the
// access request must carry it, and it fits no other call.
func (s *Service) bindingToken(c caller, callID string, exp time.Time) string {
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(exp.Unix()))
	m := hmac.New(sha256.New, s.opts.Secret)
	m.Write([]byte("countersign authzen binding\x00"))
	m.Write(c.keySum[:])
	m.Write([]byte(callID))
	m.Write(ts[:])
	return "azb1." + strconv.FormatInt(exp.Unix(), 10) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errExpiredDenial: the binding token is genuine but past its time.
var errExpiredDenial = errors.New("the requestable denial has expired: evaluate again")

// checkBinding verifies token against the submitted call.
func (s *Service) checkBinding(c caller, callID, token string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != "azb1" {
		return errors.New("not a binding token of this PDP")
	}
	sec, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return errors.New("not a binding token of this PDP")
	}
	exp := time.Unix(sec, 0)
	if !hmac.Equal([]byte(s.bindingToken(c, callID, exp)), []byte(token)) {
		return errors.New("the denial was given for another subject, tool or arguments (or another key)")
	}
	if !s.opts.Now().Before(exp) {
		return errExpiredDenial
	}
	return nil
}

// idempotency remembers, per key and Idempotency-Key, the call a
// submission was for. It guards seen; it keeps at most maxIdem entries
// (the oldest go first): a retry comes within seconds.
type idempotency struct {
	mu    sync.Mutex
	seen  map[string]string
	order []string
}

const maxIdem = 4096

// check records that key was used for callID; false when it was used
// for another call.
func (m *idempotency) check(key, callID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev, ok := m.seen[key]; ok {
		return prev == callID
	}
	if len(m.order) >= maxIdem {
		delete(m.seen, m.order[0])
		m.order = m.order[1:]
	}
	m.seen[key] = callID
	m.order = append(m.order, key)
	return true
}

// Problem is an error answer (RFC 9457 problem details); Field names the
// offending field of the body, when one is.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
}

// problem writes a refusal. code is the profile's error name (its URN)
// for the access request errors, else Countersign's.
func problem(w http.ResponseWriter, status int, code, field, detail string) {
	typ := "urn:countersign:authzen:error:" + code
	switch code {
	case "not_requestable", "expired_denial", "invalid_denial_binding", "duplicate_request", "unknown_task", "task_expired", "invalid_task_state":
		typ = "urn:openid:authzen:access-request:error:" + code
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail, Field: field})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
