package api

// This file: the handlers, their JSON shapes, and refusals.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
	"github.com/countersign/countersign/approval/policyfile"
)

// The wire types of /v1 are the Go client's (agent/api/client): the
// server writes the very types the client reads, so the two cannot drift.
// Their names here are the OpenAPI document's (openapi.json).
type (
	// ErrorDetail is a refusal: its stable code (unauthenticated,
	// forbidden_tool, invalid_json, invalid_field, unknown_field,
	// body_too_large, rate_limited, not_found, unknown_tool,
	// call_id_reused, not_approved, already_claimed, abandoned,
	// not_claimed, invalid_claim_token, already_reported, not_pending,
	// internal), its message and the offending field.
	ErrorDetail = client.Error
	// ErrorBody is the body of every refusal: {"error": {...}} and, when
	// the refusal depends on the request's state, the request.
	ErrorBody = client.ErrorBody
	// ClaimView is the answer of the one claim that won: the claim token
	// the result must carry, and the request, now executing.
	ClaimView = client.Claimed
	// RequestView is how a request is shown to its caller (and in
	// webhooks).
	RequestView = client.Request
	// ResultView is what the caller reported of its execution.
	ResultView = client.Outcome
)

// Fact is one labelled value the caller supplies with a request.
type Fact = client.Fact

// CreateInput is the body of POST /v1/requests. It is the Go client's
// Call: the server reads the very type the client writes. Its
// Annotations (e.g. an MCP tool's) tighten the external rule for a tool
// the policy does not declare, never loosen it.
type CreateInput = client.Call

// ResultInput is the body of POST /v1/requests/{id}/result. It is the Go
// client's Report.
type ResultInput = client.Report

// signals are the gate's signals as the API writes them.
func signals(in []approval.Signal) []client.Signal {
	var out []client.Signal
	for _, g := range in {
		out = append(out, client.Signal{Code: g.Code, Text: g.Text})
	}
	return out
}

// view shows r to its caller.
func view(r *approval.Request) RequestView {
	v := RequestView{ID: r.ID, Tool: r.Tool, RunID: r.RunID, CallID: r.CallID, Status: client.Status(r.Status),
		Arguments: r.Args, Digest: r.Digest, Signals: signals(r.Signals)}
	created, deadline := r.Created, r.Deadline
	v.CreatedAt, v.Deadline = &created, &deadline
	for _, a := range r.Approvals {
		v.Approvers = append(v.Approvers, a.Approver)
	}
	if d := r.Decision; d != nil {
		v.Verdict = string(d.Verdict)
		at := d.At
		v.DecidedAt = &at
		if d.Verdict.Human() {
			v.Approver = d.Approver
		}
		switch d.Verdict {
		case approval.VerdictRespond:
			v.Response = d.Text
		case approval.VerdictExpire:
			v.Reason = "no decision before the deadline"
		default:
			v.Reason = d.Text
		}
	}
	switch {
	case r.Status == approval.StatusAbandoned:
		v.Reason = abandonedWhy(r)
	case r.Status == approval.StatusRefused:
		v.Reason = "approved, but refused when it was to run: " + r.Result
	case r.Status == approval.StatusPending && r.Reopened != nil:
		v.Reason = "approved, but not enough to run: " + r.Reopened.Reason + "; waiting for more approvals"
	}
	if len(r.OriginalArgs) > 0 {
		v.Edited, v.OriginalArguments = true, r.OriginalArgs
	}
	switch r.Status {
	case approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
		v.Result = &ResultView{Status: client.Status(r.Status), Output: r.Result}
	}
	return v
}

// authed checks the API key and the key's rate limit before h runs.
func (s *Server) authed(h func(w http.ResponseWriter, r *http.Request, c call)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := call{id: r.Header.Get("X-Request-Id")}
		if c.id == "" || len(c.id) > 100 {
			c.id = approval.NewID("http")
		}
		w.Header().Set("X-Request-Id", c.id)
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || strings.TrimSpace(token) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="countersign"`)
			s.refuse(w, r, c, http.StatusUnauthorized, ErrorDetail{Code: "unauthenticated", Message: "missing API key: send Authorization: Bearer <key>"})
			return
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
		k := s.keys[hex.EncodeToString(sum[:])]
		if k == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="countersign", error="invalid_token"`)
			s.refuse(w, r, c, http.StatusUnauthorized, ErrorDetail{Code: "unauthenticated", Message: "unknown API key"})
			return
		}
		c.key = k
		wait, ok, err := s.limit.Take(r.Context(), k.Name, k.rate)
		if err != nil {
			// Fail closed: without its budget a key could flood the
			// approvals channel with cards (and the store that keeps
			// the budget keeps the requests too).
			s.fail(w, r, c, "rate limit", err)
			return
		}
		if !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			s.refuse(w, r, c, http.StatusTooManyRequests, ErrorDetail{Code: "rate_limited",
				Message: fmt.Sprintf("rate limit of %d calls per minute reached for key %s; retry after %s", k.rate, k.Name, wait.Round(time.Second))})
			return
		}
		h(w, r, c)
	}
}

// toolAnnotations are the caller's hints about its tool as the gate reads
// them (nil: none given).
func toolAnnotations(a *client.Annotations) *approval.ToolAnnotations {
	if a == nil {
		return nil
	}
	return &approval.ToolAnnotations{ReadOnly: a.ReadOnly, Destructive: a.Destructive, OpenWorld: a.OpenWorld}
}

// create is POST /v1/requests.
func (s *Server) create(w http.ResponseWriter, r *http.Request, c call) {
	withdraw, ok := s.withdrawIfGone(w, r, c)
	if !ok {
		return
	}
	var in CreateInput
	if !s.decode(w, r, c, &in) {
		return
	}
	bad := func(field, format string, args ...any) {
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: field, Message: fmt.Sprintf(format, args...)})
	}
	in.Tool, in.CallID = strings.TrimSpace(in.Tool), strings.TrimSpace(in.CallID)
	switch {
	case in.Tool == "":
		bad("tool", "tool is required")
		return
	case in.CallID == "":
		bad("call_id", "call_id is required: the same call id returns the same request")
		return
	case len(in.CallID) > 200:
		bad("call_id", "call_id is longer than 200 bytes")
		return
	case len(in.RunID) > 200:
		bad("run_id", "run_id is longer than 200 bytes")
		return
	case len(in.Reason) > 4000:
		bad("reason", "reason is longer than 4000 bytes")
		return
	case in.Confidence != nil && (math.IsNaN(*in.Confidence) || *in.Confidence < 0 || *in.Confidence > 1):
		bad("confidence", "confidence must be between 0 and 1")
		return
	case len(in.Upstream) > 200:
		bad("upstream", "upstream is longer than 200 bytes")
		return
	case in.Gateway != "" && in.Gateway != approval.GatewayExtAuthz:
		bad("gateway", "gateway %q is not one Countersign knows (%q, or none)", in.Gateway, approval.GatewayExtAuthz)
		return
	case len(in.Route) > 200:
		bad("route", "route is longer than 200 bytes")
		return
	case len(in.OnBehalfOf) > policyfile.MaxCallerIdentity:
		bad("on_behalf_of", "on_behalf_of is longer than %d bytes", policyfile.MaxCallerIdentity)
		return
	case len(in.Facts) > MaxCallerFacts:
		bad("facts", "at most %d facts", MaxCallerFacts)
		return
	}
	for i, f := range in.Facts {
		switch {
		case strings.TrimSpace(f.Label) == "" || len(f.Label) > 100:
			bad(fmt.Sprintf("facts[%d].label", i), "a fact's label is required and at most 100 bytes")
			return
		case len(f.Value) > 2000:
			bad(fmt.Sprintf("facts[%d].value", i), "a fact's value is at most 2000 bytes")
			return
		}
	}
	if len(bytes.TrimSpace(in.Arguments)) == 0 || bytes.Equal(bytes.TrimSpace(in.Arguments), []byte("null")) {
		in.Arguments = json.RawMessage("{}")
	}
	if !bytes.HasPrefix(bytes.TrimSpace(in.Arguments), []byte("{")) {
		bad("arguments", "arguments must be a JSON object")
		return
	}
	a := ask{caller: approval.CallerAPI, tool: in.Tool, args: in.Arguments, runID: in.RunID, callID: in.CallID,
		reason: in.Reason, confidence: in.Confidence, annotations: toolAnnotations(in.Annotations),
		inputSchema: in.InputSchema, upstream: in.Upstream, judgeOnly: in.JudgeOnly, gateway: in.Gateway, route: in.Route, onBehalfOf: in.OnBehalfOf, fields: v1Fields}
	for _, f := range in.Facts {
		a.facts = append(a.facts, approval.Fact{Label: f.Label, Value: f.Value})
	}
	req, answer, status, ok := s.ask(w, r, c, a)
	switch {
	case !ok:
	case req != nil:
		if withdraw && req.Status == approval.StatusPending {
			// A caller that goes before its first poll is gone too.
			s.asked(r.Context(), c, req.ID)
		}
		writeJSON(w, status, s.show(r.Context(), req))
	default:
		writeJSON(w, status, answer)
	}
}

// ask is one call for a person, whatever the surface that sent it (/v1
// or the HumanLayer endpoints): the handler has checked its own fields.
type ask struct {
	kind   approval.Kind
	caller string // approval.CallerAPI or approval.CallerHumanLayer
	tool   string
	args   json.RawMessage // a JSON object
	runID  string
	callID string
	reason string
	// confidence is the model's, nil when not given.
	confidence *float64
	// annotations are the tool's own hints (MCP), nil when not given.
	annotations *approval.ToolAnnotations
	facts       []approval.Fact
	choices     []approval.Choice
	state       json.RawMessage
	// inputSchema is an undeclared tool's schema from its caller (an MCP
	// tool's inputSchema), nil when none.
	inputSchema json.RawMessage
	// upstream names the MCP upstream the call came through, "" if none.
	upstream string
	// gateway and route name the gateway that checked the call and its
	// route (approval.Caller); onBehalfOf is the caller's identity it
	// asserted, mapped by the key's callers.
	gateway, route, onBehalfOf string
	// settle stores the gate's own answer (auto-approved, refused by a
	// deny rule) as a final request, so it can be read again by call id.
	settle bool
	// judgeOnly creates nothing when a person would be asked
	// (approval.Proposal.JudgeOnly): the answer is pending with no id.
	judgeOnly bool
	// fields names the caller's JSON fields in refusals.
	fields askFields
}

// askFields are the names, in the caller's JSON, of what ask carries
// (schema "" when the surface has no schema field).
type askFields struct{ tool, args, callID, schema string }

var v1Fields = askFields{tool: "tool", args: "arguments", callID: "call_id", schema: "input_schema"}

// ask is one call for a person from an API surface: it checks what only
// the API knows (the key's scope, idempotency by call id: the same call id
// returns the same request, never a second card), hands the call to the
// lifecycle (Lifecycle.Propose: the tool's identity, schema, gate, audit,
// request and card) and translates its answer. It answers refusals itself
// (ok false). Otherwise it returns the stored request and the HTTP status
// to answer with (201 when created now), or, for a call the gate settled
// without a human and a not to settle, the answer to give (req nil).
func (s *Server) ask(w http.ResponseWriter, r *http.Request, c call, a ask) (req *approval.Request, answer RequestView, status int, ok bool) {
	bad := func(field, format string, args ...any) {
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if !slices.Contains(c.key.Tools, "*") && !slices.Contains(c.key.Tools, a.tool) {
		s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: "forbidden_tool", Field: a.fields.tool,
			Message: fmt.Sprintf("key %s may not ask for tool %q", c.key.Name, a.tool)})
		return nil, answer, 0, false
	}
	// The lifecycle compacts the arguments it keeps (Propose); the digest
	// is of their canonical form, whatever their spacing.
	args := a.args
	digest, err := approval.Digest(args)
	if err != nil {
		bad(a.fields.args, "%s cannot be digested: %v", a.fields.args, err)
		return nil, answer, 0, false
	}
	requester, ok := s.requester(w, r, c, a)
	if !ok {
		return nil, answer, 0, false
	}
	ctx := r.Context()
	id := s.requestID(a.caller, a.kind, c.key.SHA256, a.callID)

	// The same call id returns the same request, never a second card: the
	// lifecycle finds the request the id names (Proposal.FindByID), and
	// the lookup and the creation are one step for concurrent retries in
	// this process (across processes the card writer binds one card only).
	defer s.creating.lock(id)()
	p := approval.Proposal{RequestID: id, RunID: a.runID, CallID: a.callID, Tool: a.tool, Args: args,
		Reason: a.reason, Confidence: a.confidence, Annotations: a.annotations, InputSchema: a.inputSchema,
		Requester: requester, Caller: approval.Caller{Kind: a.caller, Name: c.key.Name, Upstream: a.upstream, Gateway: a.gateway, Route: a.route},
		Kind: a.kind, Choices: a.choices, CallerState: a.state, CallerFacts: a.facts,
		External: true, Settle: a.settle, JudgeOnly: a.judgeOnly, Timeout: s.timeout, FindByID: true}
	if s.preview != nil {
		p.Preview = func(ctx context.Context) approval.Preview {
			pv, _ := s.preview(ctx, a.tool, args)
			return pv
		}
	}
	got, err := s.life.Propose(ctx, p)
	switch {
	case errors.Is(err, approval.ErrInvalidToolName), errors.Is(err, approval.ErrConfusableTool):
		bad(a.fields.tool, "%v", err)
		return nil, answer, 0, false
	case errors.Is(err, approval.ErrUnknownTool):
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "unknown_tool", Field: a.fields.tool,
			Message: fmt.Sprintf("tool %q is not declared in the policy and the policy has no external rule", a.tool)})
		return nil, answer, 0, false
	case errors.Is(err, approval.ErrInvalidSchema) && a.fields.schema != "":
		bad(a.fields.schema, "%v", err)
		return nil, answer, 0, false
	case errors.Is(err, approval.ErrInvalidArgs):
		bad(a.fields.args, "%v", err)
		return nil, answer, 0, false
	case err != nil:
		s.fail(w, r, c, "propose", err)
		return nil, answer, 0, false
	}
	switch {
	case got.Outcome == approval.ProposedFound:
		return s.sameCall(w, r, c, a, got.Request, digest, requester)
	case got.Outcome == approval.ProposedAsk && got.Request == nil: // judge only: nothing created
		return nil, RequestView{Tool: a.tool, RunID: a.runID, CallID: a.callID, Status: client.Pending, Arguments: got.Args,
			Digest: got.Digest, Signals: signals(got.Assessment.Signals)}, http.StatusOK, true
	case got.Outcome == approval.ProposedAsk:
		s.log.Info("api request created", "request_id", id, "http_request_id", c.id, "key", c.key.Name, "tool", a.tool, "run_id", a.runID, "actor", owner(c.key))
		return got.Request, answer, http.StatusCreated, true
	case got.Outcome == approval.ProposedDenied && a.kind == approval.KindContact:
		s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: codeRefusedByPolicy, Field: a.fields.args, Message: "refused by policy: " + got.Denial.Reason})
		return nil, answer, 0, false
	case got.Request != nil:
		return got.Request, answer, http.StatusOK, true // settled
	}
	now := got.Created
	answer = RequestView{Tool: a.tool, RunID: a.runID, CallID: a.callID, Arguments: got.Args, Digest: got.Digest,
		Signals: signals(got.Assessment.Signals), CreatedAt: &now, DecidedAt: &now}
	if got.Outcome == approval.ProposedDenied {
		answer.Status, answer.Verdict, answer.Reason = client.Rejected, string(approval.VerdictReject), "refused by policy: "+got.Denial.Reason
	} else { // let through without a person: the gate, or ask-once memory
		answer.Status, answer.Verdict, answer.AutoApproved = client.Approved, string(approval.VerdictApprove), true
	}
	return nil, answer, http.StatusOK, true
}

// sameCall answers a call whose id names stored, a request already
// made: stored when it is the same call (its first arguments' digest,
// its tool and, for a gateway's caller, its requester), else a conflict
// answered here (ok false).
func (s *Server) sameCall(w http.ResponseWriter, r *http.Request, c call, a ask, stored *approval.Request, digest, requester string) (*approval.Request, RequestView, int, bool) {
	first := stored.Args
	if len(stored.OriginalArgs) > 0 {
		first = stored.OriginalArgs
	}
	if d, _ := approval.Digest(first); d != digest || stored.Tool != a.tool {
		s.refuse(w, r, c, http.StatusConflict, ErrorDetail{Code: "call_id_reused", Field: a.fields.callID,
			Message: fmt.Sprintf("%s %q was already used for a different call (another tool or other arguments)", a.fields.callID, a.callID)})
		return nil, RequestView{}, 0, false
	}
	if a.onBehalfOf != "" && stored.Requester != requester {
		// Another caller's call is never theirs to find (and claim).
		s.refuse(w, r, c, http.StatusConflict, ErrorDetail{Code: "call_id_reused", Field: a.fields.callID,
			Message: fmt.Sprintf("%s %q was already used by another caller", a.fields.callID, a.callID)})
		return nil, RequestView{}, 0, false
	}
	return stored, RequestView{}, http.StatusOK, true
}

// requester is who asked for a: the person the caller a gateway
// asserted is, by the key's callers (api.keys[].callers); else the key's
// Slack user; else the key itself. A key with callers requires a caller
// it names; a key without refuses one (nothing says who it is). It
// answers refusals itself (ok false).
func (s *Server) requester(w http.ResponseWriter, r *http.Request, c call, a ask) (string, bool) {
	switch user, known := c.key.Callers[a.onBehalfOf]; {
	case a.onBehalfOf != "" && known:
		return user, true
	case a.onBehalfOf != "" && len(c.key.Callers) == 0:
		s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: "unknown_caller", Field: "on_behalf_of",
			Message: fmt.Sprintf("key %s names no callers in the policy (api.keys[].callers), so the caller %q cannot be told who they are", c.key.Name, a.onBehalfOf)})
		return "", false
	case a.onBehalfOf != "":
		s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: "unknown_caller", Field: "on_behalf_of",
			Message: fmt.Sprintf("the caller %q is not one of key %s's callers in the policy (api.keys[].callers)", a.onBehalfOf, c.key.Name)})
		return "", false
	case len(c.key.Callers) > 0:
		s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: "caller_required", Field: "on_behalf_of",
			Message: fmt.Sprintf("key %s acts for the callers the policy names (api.keys[].callers): the call must say whose it is, and names no caller", c.key.Name)})
		return "", false
	case c.key.SlackUser != "":
		return c.key.SlackUser, true
	}
	return a.caller + ":" + c.key.Name, true
}

// get is GET /v1/requests/{id}, a long poll with ?wait=.
func (s *Server) get(w http.ResponseWriter, r *http.Request, c call) {
	var wait time.Duration
	if q := r.URL.Query().Get("wait"); q != "" {
		d, err := duration.Parse(q)
		if err != nil || d < 0 {
			s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: "wait", Message: fmt.Sprintf("wait %q is not a duration such as 30s", q)})
			return
		}
		wait = min(d, s.maxWait)
	}
	withdraw, ok := s.withdrawIfGone(w, r, c)
	if !ok {
		return
	}
	req, ok := s.own(w, r, c)
	if !ok {
		return
	}
	if wait > 0 && req.Status == approval.StatusPending {
		// The record read above is not kept while the poll is held (with
		// 10,000 polls held that was a tenth of the server's memory): a
		// poll that ends still pending answers with the record read again.
		id := req.ID
		req = nil
		var wt *watch // the caller asked to be withdrawn when gone (gone.go)
		if withdraw {
			wt = s.beginWatch(r.Context(), c, id)
		}
		if s.park(w, r, c, id, wait, wt) {
			return
		}
		// Not parkable (HTTP/2, say): held in this handler. A long poll
		// may outlast the server's write timeout (which bounds ordinary
		// answers): this answer gets the wait plus a margin.
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.log.Warn("extend the long poll's write deadline", "request_id", id, "err", err)
		}
		s.waiting.Add(1)
		wctx, cancel := context.WithTimeout(r.Context(), wait)
		got, err := s.req.Wait(wctx, id)
		cancel()
		s.waiting.Add(-1)
		switch {
		case err == nil:
			req = got
		case r.Context().Err() != nil:
			s.pollEnded(id, wt, false)
			return // the caller went away
		case wctx.Err() != nil:
			// Still pending: the caller asks again.
			if req, ok = s.own(w, r, c); !ok {
				return
			}
			s.pollEnded(id, wt, req.Status != approval.StatusPending)
		default:
			s.pollEnded(id, wt, false) // ended without the decision
			s.fail(w, r, c, "wait", err)
			return
		}
	}
	writeJSON(w, http.StatusOK, s.show(r.Context(), req))
}

// claim is POST /v1/requests/{id}/claim: the caller is about to run an
// approved request. The lifecycle judges the claim against the policy in
// force (approval.Lifecycle.Claim); this handler only translates. The one
// claim that wins gets the claim token its result must carry (200); every
// later claim, from this caller or any other, gets the request as it now
// is (409 already_claimed: executing, or its result), never a second go.
// A request the judgement refused is 409 refused (naming the rule), one
// that needs more approvals under the policy in force 409
// needs_approvals (pending again: the caller waits and claims again); one
// that may not run otherwise is 409 not_approved, or abandoned once its
// claim window ended unclaimed. A
// claim Redis's replicas did not confirm (WaitReplicas, failing over) is
// withdrawn: 503 not_confirmed, Retry-After 1; claiming again settles it.
func (s *Server) claim(w http.ResponseWriter, r *http.Request, c call) {
	req, ok := s.own(w, r, c)
	if !ok {
		return
	}
	got, token, err := s.life.ClaimTokenRequest(r.Context(), req, owner(c.key))
	if err != nil {
		s.claimRefused(w, r, c, req, got, err)
		return
	}
	s.log.Info("api request claimed", "request_id", req.ID, "http_request_id", c.id, "key", c.key.Name, "actor", owner(c.key))
	writeJSON(w, http.StatusOK, ClaimView{Token: token, Request: s.show(r.Context(), got)})
}

// claimRefused answers a claim that did not win, with the request as it
// now is (cur; before when the refusal came without it).
func (s *Server) claimRefused(w http.ResponseWriter, r *http.Request, c call, before, cur *approval.Request, err error) {
	if cur == nil {
		cur = before
	}
	var e ErrorDetail
	var refused *approval.RefusedError
	var more *approval.MoreApprovalsError
	switch {
	case errors.As(err, &refused):
		e = ErrorDetail{Code: "refused", Message: refusedWhy(refused)}
	case errors.As(err, &more):
		e = ErrorDetail{Code: "needs_approvals", Message: fmt.Sprintf(
			"not run: %s; the request is pending again and its card asks for the rest: wait for it (GET with wait) and claim again", more.Reason)}
	case errors.Is(err, approval.ErrAlreadyClaimed):
		e = ErrorDetail{Code: "already_claimed", Message: fmt.Sprintf("the request was already claimed (it is %s): it runs at most once, and not here; its outcome is in request", cur.Status)}
	case errors.Is(err, approval.ErrAbandoned):
		e = ErrorDetail{Code: "abandoned", Message: abandonedWhy(cur)}
	case errors.Is(err, approval.ErrNotApproved):
		e = ErrorDetail{Code: "not_approved", Message: fmt.Sprintf("the request is %s, not approved: nothing may run", cur.Status)}
	case errors.Is(err, approval.ErrNotFound):
		s.refuse(w, r, c, http.StatusNotFound, ErrorDetail{Code: "not_found", Message: fmt.Sprintf("no request %q for key %s", before.ID, c.key.Name)})
		return
	case errors.Is(err, approval.ErrClaimNotConfirmed):
		s.log.Warn("api claim not confirmed by a replica, withdrawn", "request_id", before.ID, "http_request_id", c.id, "key", c.key.Name, "err", err)
		w.Header().Set("Retry-After", "1")
		s.refuse(w, r, c, http.StatusServiceUnavailable, ErrorDetail{Code: "not_confirmed",
			Message: "the claim could not be confirmed on Redis's replicas (failing over?), so it was withdrawn: do not run; claim again"})
		return
	default:
		s.fail(w, r, c, "claim", err)
		return
	}
	v := s.show(r.Context(), cur)
	s.refuseWith(w, r, c, http.StatusConflict, e, &v)
}

// refusedWhy says why the judgement at a claim refused a request, naming
// the deny rule when one refused it.
func refusedWhy(e *approval.RefusedError) string {
	why := "approved, but refused when it was to run: " + e.Reason
	if e.Rule != "" {
		why += " (deny rule " + e.Rule + ")"
	}
	return why + "; nothing ran and nothing may"
}

// abandonedWhy says why an abandoned request may not run.
func abandonedWhy(r *approval.Request) string {
	window := "its claim window"
	if r.ClaimWindow > 0 {
		window = "its claim window (" + r.ClaimWindow.String() + ")"
	}
	return "approved, but nobody claimed it within " + window + " of the approval: the caller had gone, so nothing ran and nothing may"
}

// result is POST /v1/requests/{id}/result: the holder of the claim token
// reports what came of the request it claimed, at most once.
func (s *Server) result(w http.ResponseWriter, r *http.Request, c call) {
	var in ResultInput
	if !s.decode(w, r, c, &in) {
		return
	}
	var st approval.Status
	switch in.Status {
	case client.Executed:
		st = approval.StatusExecuted
	case client.Failed:
		st = approval.StatusFailed
	default:
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: "status", Message: `status must be "executed" or "failed"`})
		return
	}
	if len(in.Output) > MaxResultBytes {
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: "output", Message: fmt.Sprintf("output is longer than %d bytes", MaxResultBytes)})
		return
	}
	if strings.TrimSpace(in.ClaimToken) == "" {
		s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: "claim_token",
			Message: "claim_token is required: claim the request before running it (POST /v1/requests/{id}/claim) and send the token that claim returned"})
		return
	}
	req, ok := s.own(w, r, c)
	if !ok {
		return
	}
	ctx := r.Context()
	done, err := s.life.FinishClaim(context.WithoutCancel(ctx), req.ID, in.ClaimToken, owner(c.key), approval.Outcome{Status: st, Result: in.Output})
	if err == nil {
		writeJSON(w, http.StatusOK, s.show(r.Context(), done))
		return
	}
	cur := done
	if cur == nil {
		cur = req
	}
	v := s.show(r.Context(), cur)
	switch {
	case errors.Is(err, approval.ErrClaimToken):
		s.refuseWith(w, r, c, http.StatusForbidden, ErrorDetail{Code: "invalid_claim_token", Field: "claim_token",
			Message: "claim_token is not the token of the claim that won: only the caller that claimed the request reports its result"}, &v)
	case errors.Is(err, approval.ErrNotClaimed):
		s.refuseWith(w, r, c, http.StatusConflict, ErrorDetail{Code: "not_claimed", Field: "claim_token",
			Message: "the request is approved but nobody claimed it: claim it (POST /v1/requests/{id}/claim) before running it"}, &v)
	case errors.Is(err, approval.ErrAlreadyClaimed):
		s.refuseWith(w, r, c, http.StatusConflict, ErrorDetail{Code: "already_reported", Message: "a result was already reported for this request"}, &v)
	case errors.Is(err, approval.ErrAbandoned):
		s.refuseWith(w, r, c, http.StatusConflict, ErrorDetail{Code: "abandoned", Message: abandonedWhy(cur)}, &v)
	case errors.Is(err, approval.ErrNotApproved):
		s.refuseWith(w, r, c, http.StatusConflict, ErrorDetail{Code: "not_approved", Message: fmt.Sprintf("the request is %s, not approved: nothing may run", cur.Status)}, &v)
	default:
		s.fail(w, r, c, "finish", err)
	}
}

// own loads the request named in the path when it belongs to c's key;
// another key's request is not found (its existence is not told).
func (s *Server) own(w http.ResponseWriter, r *http.Request, c call) (*approval.Request, bool) {
	id := r.PathValue("id")
	req, err := s.req.Request(r.Context(), id)
	switch {
	case errors.Is(err, approval.ErrNotFound) || (err == nil && (req.Caller.Kind != approval.CallerAPI || req.Caller.Name != c.key.Name)):
		s.refuse(w, r, c, http.StatusNotFound, ErrorDetail{Code: "not_found", Message: fmt.Sprintf("no request %q for key %s", id, c.key.Name)})
		return nil, false
	case err != nil:
		s.fail(w, r, c, "read request", err)
		return nil, false
	}
	return req, true
}

// decode reads a JSON object into v strictly: a body over the limit, a
// body that is not one JSON object, an unknown field or a field of the
// wrong type is refused, naming the field.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, c call, v any) bool {
	tooLarge := func() bool {
		s.refuse(w, r, c, http.StatusRequestEntityTooLarge, ErrorDetail{Code: "body_too_large", Message: fmt.Sprintf("the body is larger than %d bytes", s.maxBody)})
		return false
	}
	var body []byte
	if in, ok := client.Body(r.Context()); ok {
		// A caller in this process (client.PerKey) handed the body over
		// as the value it would have encoded: taken as it is when it is
		// v's type and surely within the limit, else encoded and read as
		// any body is.
		dst, src := reflect.ValueOf(v).Elem(), reflect.ValueOf(in)
		if src.IsValid() && src.Type() == dst.Type() && handedSize(in) <= s.maxBody {
			dst.Set(src)
			return true
		}
		b, err := json.Marshal(in)
		if err != nil {
			s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_json", Message: "the body could not be encoded: " + err.Error()})
			return false
		}
		if int64(len(b)) > s.maxBody {
			return tooLarge()
		}
		body = b
	} else {
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return tooLarge()
		} else if err != nil {
			s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_json", Message: "the body could not be read"})
			return false
		}
		body = b
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return true
	}
	e := ErrorDetail{Code: "invalid_json", Message: "the body is not a valid JSON object: " + err.Error()}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		e = ErrorDetail{Code: "invalid_field", Field: te.Field, Message: fmt.Sprintf("%s must be %s, got %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)}
	} else if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		e = ErrorDetail{Code: "unknown_field", Field: name, Message: fmt.Sprintf("unknown field %q", name)}
	}
	s.refuse(w, r, c, http.StatusBadRequest, e)
	return false
}

// handedSize bounds from above the size of in encoded as JSON, for the
// bodies a caller in this process hands over (a Call, a Report): the
// limit on a body holds for them too. Any other value is as large as the
// limit allows no more of (it is encoded and measured).
func handedSize(in any) int64 {
	n := 0
	switch in := in.(type) {
	case CreateInput:
		n = len(in.Tool) + len(in.Arguments) + len(in.RunID) + len(in.CallID) + len(in.Reason) + len(in.InputSchema) +
			len(in.Upstream) + len(in.Gateway) + len(in.Route) + len(in.OnBehalfOf)
		for _, f := range in.Facts {
			n += len(f.Label) + len(f.Value)
		}
	case ResultInput:
		n = len(in.ClaimToken) + len(in.Status) + len(in.Output)
	default:
		return math.MaxInt64
	}
	// Every string may double (or grow sixfold, \u escapes) when quoted,
	// and the names and punctuation are under 1 KiB.
	return int64(6*n + 1024)
}

// jsonKind names a Go kind as a JSON type.
func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "float64", "float32", "int", "int64":
		return "a number"
	case "bool":
		return "true or false"
	case "slice":
		return "a list"
	case "struct", "map":
		return "an object"
	}
	return "another type"
}

// refuse answers a refusal as a JSON error, audits it and logs one line.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, c call, status int, e ErrorDetail) {
	s.refuseWith(w, r, c, status, e, nil)
}

// refuseWith is refuse, answering also the request as it now is.
//
// Refusals are counted per source — without a valid key per remote
// address, of a valid key per key and code — and audited and logged at
// most once a minute per source (refusals.go); their path and message are
// cut.
func (s *Server) refuseWith(w http.ResponseWriter, r *http.Request, c call, status int, e ErrorDetail, req *RequestView) {
	ev := approval.APIRefusedEvent{Key: c.keyName(), Method: clip.Bytes(r.Method, approval.MaxField), Path: clip.Bytes(r.URL.Path, refusalText),
		Status: status, Code: e.Code, Field: e.Field, Message: clip.Bytes(e.Message, refusalText), HTTPReqID: c.id}
	tally, source := &s.unauth, ""
	if c.key == nil {
		source, ev.Source = refusalSource(r)
	} else {
		tally, source = &s.keyed, keyRefusalSource(c.key, e.Code)
	}
	ev, write, due := tally.note(s.now(), source, ev)
	for _, d := range due {
		s.writeRefusal(r.Context(), d, "")
	}
	if write {
		s.writeRefusal(r.Context(), ev, clip.Bytes(r.PathValue("id"), approval.MaxField))
	}
	writeJSON(w, status, ErrorBody{Error: e, Request: req})
}

// fail answers "internal error" for a system failure; the detail goes to
// the log only.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, c call, what string, err error) {
	s.log.Error("api call failed", "http_request_id", c.id, "request_id", r.PathValue("id"), "key", c.keyName(),
		"method", r.Method, "path", r.URL.Path, "step", what, "err", err)
	writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: internalError(c)})
}

// internalError is the refusal of a system failure: the detail is in the
// operator's log, under the call's HTTP request id.
func internalError(c call) ErrorDetail {
	return ErrorDetail{Code: "internal", Message: "internal error; the operator's logs have the detail (request " + c.id + ")"}
}

// record audits rec; a failing audit is logged (what it describes happened
// or was refused either way).
func (s *Server) record(ctx context.Context, rec approval.Record) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.audit.Append(actx, rec); err != nil {
		s.log.Error("audit append failed", "event", rec.Event, "request_id", rec.RequestID, "err", err)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if vw, ok := w.(client.ValueWriter); ok {
		vw.WriteValue(status, v) // a caller in this process takes the value (client.PerKey)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
