package api

// This file: the HumanLayer-compatible endpoints (/humanlayer/v1). An agent
// written with HumanLayer's SDKs (humanlayer/core/cloud.py, humanlayer-ts
// src/cloud.ts) sets HUMANLAYER_API_BASE to <countersign>/humanlayer/v1 and
// HUMANLAYER_API_KEY to a Countersign API key and changes nothing else. The
// shapes are the SDKs' models (FunctionCall, HumanContact, their Spec and
// Status, ResponseOption); every call takes the /v1 path (authed, ask,
// the store's record), so keys, scope, rate limits, idempotency, the gate,
// cards and audit are the same. docs/api.md "HumanLayer-compatible
// endpoints" says what maps to what and what differs.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
)

// The HumanLayer-compatible routes, as ServeMux patterns, under
// HumanLayerPrefix.
const (
	HumanLayerPrefix           = "/humanlayer/v1/"
	RouteHumanLayerCreateCall  = "POST /humanlayer/v1/function_calls"
	RouteHumanLayerGetCall     = "GET /humanlayer/v1/function_calls/{call_id}"
	RouteHumanLayerCreateAsk   = "POST /humanlayer/v1/contact_requests"
	RouteHumanLayerGetAsk      = "GET /humanlayer/v1/contact_requests/{call_id}"
	RouteHumanLayerRespondCall = "POST /humanlayer/v1/agent/function_calls/{call_id}/respond"
	RouteHumanLayerRespondAsk  = "POST /humanlayer/v1/agent/human_contacts/{call_id}/respond"
	RouteHumanLayerEscalate    = "POST /humanlayer/v1/agent/function_calls/{call_id}/escalate_email"
	RouteHumanLayerEscalateAsk = "POST /humanlayer/v1/agent/human_contacts/{call_id}/escalate_email"
)

// HumanLayerRoutes lists every route HumanLayerHandler serves.
func HumanLayerRoutes() []string {
	return []string{RouteHumanLayerCreateCall, RouteHumanLayerGetCall, RouteHumanLayerCreateAsk, RouteHumanLayerGetAsk,
		RouteHumanLayerRespondCall, RouteHumanLayerRespondAsk, RouteHumanLayerEscalate, RouteHumanLayerEscalateAsk}
}

// Error codes only the HumanLayer endpoints answer.
const (
	// codeDecisionNotAllowed: the caller tried to decide (respond to) its
	// own request; decisions come only from Slack.
	codeDecisionNotAllowed = "decision_not_allowed"
	// codeRefusedByPolicy: a deny rule refused a contact request (a
	// question has no "rejected" answer to give back).
	codeRefusedByPolicy = "refused_by_policy"
	// codeNoResponse: a contact request ended without an answer (expired,
	// cancelled, declined).
	codeNoResponse = "no_response"
	// codeNotSupported: an SDK call Countersign does not serve.
	codeNotSupported = "not_supported"
)

// Bounds on what a HumanLayer caller sends.
const (
	maxChoices       = 10 // a modal's radio buttons hold 10
	maxChoiceName    = 100
	maxChoiceTitle   = 200
	maxChoiceText    = 2000
	maxQuestionBytes = 4000
	maxSubjectBytes  = 200
	maxStateBytes    = 16 << 10
)

// hlOption is HumanLayer's ResponseOption (reject_options of a function
// call, response_options of a contact request).
type hlOption struct {
	Name        string  `json:"name"`
	Title       *string `json:"title"`
	Description *string `json:"description"`
	PromptFill  *string `json:"prompt_fill"`
	Interactive bool    `json:"interactive"`
}

// hlCallSpec is HumanLayer's FunctionCallSpec.
type hlCallSpec struct {
	Fn     string          `json:"fn"`
	Kwargs json.RawMessage `json:"kwargs"`
	// Channel is accepted and ignored: the card goes to the policy's
	// approvals channel, which no caller chooses. Answered as null.
	Channel       json.RawMessage `json:"channel"`
	RejectOptions []hlOption      `json:"reject_options"`
	State         json.RawMessage `json:"state"`
}

// hlCallStatus is HumanLayer's FunctionCallStatus. Every field is written,
// null when unset, as the SDK's model_dump does.
type hlCallStatus struct {
	RequestedAt      *time.Time `json:"requested_at"`
	RespondedAt      *time.Time `json:"responded_at"`
	Approved         *bool      `json:"approved"`
	Comment          *string    `json:"comment"`
	RejectOptionName *string    `json:"reject_option_name"`
	SlackMessageTS   *string    `json:"slack_message_ts"`
}

// hlInfo is Countersign's own addition to every answer (the SDKs ignore
// fields they do not know): the request behind the call.
type hlInfo struct {
	RequestID string          `json:"request_id"`
	Status    approval.Status `json:"status"`
	Approver  string          `json:"approver,omitempty"`
}

// hlCall is HumanLayer's FunctionCall.
type hlCall struct {
	RunID       string          `json:"run_id"`
	CallID      string          `json:"call_id"`
	Spec        hlCallSpec      `json:"spec"`
	Status      json.RawMessage `json:"status"` // in: null or no decision; out: hlCallStatus
	Countersign *hlInfo         `json:"countersign,omitempty"`
}

// hlAskSpec is HumanLayer's HumanContactSpec.
type hlAskSpec struct {
	Msg             string          `json:"msg"`
	Subject         *string         `json:"subject"`
	Channel         json.RawMessage `json:"channel"`
	ResponseOptions []hlOption      `json:"response_options"`
	State           json.RawMessage `json:"state"`
}

// hlAskStatus is HumanLayer's HumanContactStatus.
type hlAskStatus struct {
	RequestedAt        *time.Time `json:"requested_at"`
	RespondedAt        *time.Time `json:"responded_at"`
	Response           *string    `json:"response"`
	ResponseOptionName *string    `json:"response_option_name"`
}

// hlAsk is HumanLayer's HumanContact.
type hlAsk struct {
	RunID       string          `json:"run_id"`
	CallID      string          `json:"call_id"`
	Spec        hlAskSpec       `json:"spec"`
	Status      json.RawMessage `json:"status"`
	Countersign *hlInfo         `json:"countersign,omitempty"`
}

// question is what a contact request's Args hold: the digest binds an
// answer to the question shown.
type question struct {
	Msg     string `json:"msg"`
	Subject string `json:"subject,omitempty"`
}

var (
	hlCallFields = askFields{tool: "spec.fn", args: "spec.kwargs", callID: "call_id"}
	hlAskFields  = askFields{tool: "spec", args: "spec.msg", callID: "call_id"}
)

// HumanLayerHandler returns the HumanLayer-compatible routes, all under
// HumanLayerPrefix. Mount it beside Handler.
func (s *Server) HumanLayerHandler() http.Handler {
	mux := http.NewServeMux()
	handlers := map[string]http.HandlerFunc{
		RouteHumanLayerCreateCall:  s.authed(s.hlCreateCall),
		RouteHumanLayerGetCall:     s.authed(s.hlGetCall),
		RouteHumanLayerCreateAsk:   s.authed(s.hlCreateAsk),
		RouteHumanLayerGetAsk:      s.authed(s.hlGetAsk),
		RouteHumanLayerRespondCall: s.authed(s.hlRespond),
		RouteHumanLayerRespondAsk:  s.authed(s.hlRespond),
		RouteHumanLayerEscalate:    s.authed(s.hlEscalate),
		RouteHumanLayerEscalateAsk: s.authed(s.hlEscalate),
	}
	for _, route := range HumanLayerRoutes() {
		mux.HandleFunc(route, handlers[route])
	}
	mux.HandleFunc(HumanLayerPrefix, func(w http.ResponseWriter, r *http.Request) {
		s.refuse(w, r, call{}, http.StatusNotFound, ErrorDetail{Code: "not_found", Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return mux
}

// hlCreateCall is POST /function_calls: require_approval's request.
func (s *Server) hlCreateCall(w http.ResponseWriter, r *http.Request, c call) {
	var in hlCall
	if !s.decode(w, r, c, &in) {
		return
	}
	sp := in.Spec
	sp.Fn = strings.TrimSpace(sp.Fn)
	if !s.hlCheck(w, r, c, in.RunID, in.CallID, sp.State, in.Status, "approved", "comment", "reject_option_name", "responded_at") {
		return
	}
	if sp.Fn == "" || len(sp.Fn) > 200 {
		s.hlBad(w, r, c, "spec.fn", "spec.fn is required (the function's name, a tool of the policy) and at most 200 bytes")
		return
	}
	if !jsonObjectOrNull(sp.Kwargs) {
		s.hlBad(w, r, c, "spec.kwargs", "spec.kwargs must be a JSON object")
		return
	}
	if !jsonObjectOrNull(sp.Channel) {
		s.hlBad(w, r, c, "spec.channel", "spec.channel must be a JSON object or null")
		return
	}
	choices, ok := s.hlChoices(w, r, c, "spec.reject_options", sp.RejectOptions)
	if !ok {
		return
	}
	args := sp.Kwargs
	if isNull(args) {
		args = json.RawMessage("{}")
	}
	req, _, status, ok := s.ask(w, r, c, ask{kind: approval.KindCall, caller: approval.CallerHumanLayer, tool: sp.Fn, args: args,
		runID: in.RunID, callID: in.CallID, choices: choices, state: stateOf(sp.State), settle: true, fields: hlCallFields})
	if ok {
		if out, ok := s.hlHandOff(w, r, c, req); ok {
			writeJSON(w, status, out)
		}
	}
}

// hlCreateAsk is POST /contact_requests: human_as_tool's question.
func (s *Server) hlCreateAsk(w http.ResponseWriter, r *http.Request, c call) {
	var in hlAsk
	if !s.decode(w, r, c, &in) {
		return
	}
	sp := in.Spec
	if !s.hlCheck(w, r, c, in.RunID, in.CallID, sp.State, in.Status, "response", "response_option_name", "responded_at") {
		return
	}
	q := question{Msg: strings.TrimSpace(sp.Msg)}
	if sp.Subject != nil {
		q.Subject = strings.TrimSpace(*sp.Subject)
	}
	switch {
	case q.Msg == "" || len(q.Msg) > maxQuestionBytes:
		s.hlBad(w, r, c, "spec.msg", fmt.Sprintf("spec.msg is required (the question) and at most %d bytes", maxQuestionBytes))
		return
	case len(q.Subject) > maxSubjectBytes:
		s.hlBad(w, r, c, "spec.subject", fmt.Sprintf("spec.subject is at most %d bytes", maxSubjectBytes))
		return
	case !jsonObjectOrNull(sp.Channel):
		s.hlBad(w, r, c, "spec.channel", "spec.channel must be a JSON object or null")
		return
	}
	choices, ok := s.hlChoices(w, r, c, "spec.response_options", sp.ResponseOptions)
	if !ok {
		return
	}
	args, err := json.Marshal(q)
	if err != nil {
		s.fail(w, r, c, "encode question", err)
		return
	}
	req, _, status, ok := s.ask(w, r, c, ask{kind: approval.KindContact, caller: approval.CallerHumanLayer, tool: approval.ContactTool, args: args,
		runID: in.RunID, callID: in.CallID, choices: choices, state: stateOf(sp.State), settle: true, fields: hlAskFields})
	if ok {
		writeJSON(w, status, hlAskOf(req))
	}
}

// hlGetCall is GET /function_calls/{call_id}, served from the store's
// record (the SDKs poll it every 3 s; nothing is held open).
func (s *Server) hlGetCall(w http.ResponseWriter, r *http.Request, c call) {
	req, ok := s.hlOwn(w, r, c, approval.KindCall)
	if !ok {
		return
	}
	if out, ok := s.hlHandOff(w, r, c, req); ok {
		writeJSON(w, http.StatusOK, out)
	}
}

// hlHandOff is the claim of a HumanLayer call, which the SDKs do not
// make: they run the function as soon as an answer says approved. So the
// first answer that reports a person's approval claims the request on
// the caller's behalf (at most once, across processes) and hands it
// over: it is recorded as run with an outcome Countersign cannot know
// (the SDKs report none). Every later answer for that call — a second
// poller, a retried poll, the same call id asked again — reports
// approved: false with why, so nothing runs twice; an approval nobody
// asked for within the claim window is abandoned and reported so too.
// A call the policy approved without a person (settled) needs no claim:
// the gate would let the same call through again.
func (s *Server) hlHandOff(w http.ResponseWriter, r *http.Request, c call, req *approval.Request) (hlCall, bool) {
	if approved, _, _, _ := callOutcome(req); !approved || req.Status != approval.StatusApproved || req.Mode == approval.ModeSettled || req.Caller.Kind != approval.CallerHumanLayer {
		return hlCallOf(req), true
	}
	ctx := r.Context()
	got, token, err := s.life.ClaimTokenRequest(ctx, req, hlOwner(c.key))
	switch {
	case err == nil:
		answer := hlCallOf(req) // approved: true, as decided
		done, ferr := s.life.FinishClaim(context.WithoutCancel(ctx), req.ID, token, hlOwner(c.key), approval.Outcome{Status: approval.StatusUnknown, Result: hlHandedOver})
		if ferr != nil {
			s.log.Error("humanlayer hand-off not recorded as handed over; it stays executing", "request_id", req.ID, "err", ferr)
			done = got
		}
		answer.Countersign = infoOf(done)
		s.log.Info("humanlayer call handed to its caller", "request_id", req.ID, "http_request_id", c.id, "key", c.key.Name)
		return answer, true
	case got != nil && (errors.Is(err, approval.ErrAlreadyClaimed) || errors.Is(err, approval.ErrAbandoned) || errors.Is(err, approval.ErrNotApproved) ||
		errors.Is(err, approval.ErrRefused) || errors.Is(err, approval.ErrNeedsApprovals)):
		// Judged and refused (approved: false, with why), or pending again
		// for more approvals (not decided: the SDK polls on): the request
		// as it now is says so, and nothing is handed over.
		return hlCallOf(got), true
	case errors.Is(err, approval.ErrClaimNotConfirmed):
		// Withdrawn, nothing handed over: answered as not decided yet, so
		// the SDK polls again and the next answer claims anew.
		s.log.Warn("humanlayer claim not confirmed by a replica, withdrawn", "request_id", req.ID, "http_request_id", c.id, "key", c.key.Name, "err", err)
		undecided := *req
		undecided.Status, undecided.Decision = approval.StatusPending, nil
		return hlCallOf(&undecided), true
	}
	s.fail(w, r, c, "claim", err)
	return hlCall{}, false
}

// hlHandedOver is the outcome of a HumanLayer call handed to its caller.
const hlHandedOver = "handed to the HumanLayer caller, which runs the function itself and reports no outcome"

// hlGetAsk is GET /contact_requests/{call_id}. A question that ended
// without an answer is 410 no_response: the SDKs poll until a response
// comes and have no other way to learn that none will.
func (s *Server) hlGetAsk(w http.ResponseWriter, r *http.Request, c call) {
	req, ok := s.hlOwn(w, r, c, approval.KindContact)
	if !ok {
		return
	}
	if req.Status.Decided() && req.Status != approval.StatusResponded {
		e := ErrorDetail{Code: codeNoResponse, Message: "the question ended without an answer: " + endedWhy(req)}
		s.log.Info("contact request ended without an answer", "http_request_id", c.id, "request_id", req.ID, "key", c.key.Name, "status", req.Status)
		writeJSON(w, http.StatusGone, ErrorBody{Error: e})
		return
	}
	writeJSON(w, http.StatusOK, hlAskOf(req))
}

// hlRespond refuses the SDKs' respond calls: a caller never decides its
// own request.
func (s *Server) hlRespond(w http.ResponseWriter, r *http.Request, c call) {
	s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: codeDecisionNotAllowed, Field: "call_id",
		Message: "decisions come only from Slack: an approver decides on the card in the approvals channel; an API caller cannot approve, reject or answer its own request"})
}

// hlEscalate refuses escalate_email: escalation is the policy's
// (escalate_after, to approvers in Slack), never an email the caller names.
func (s *Server) hlEscalate(w http.ResponseWriter, r *http.Request, c call) {
	s.refuse(w, r, c, http.StatusNotImplemented, ErrorDetail{Code: codeNotSupported,
		Message: "escalation by email is not supported: requests escalate as the policy's escalate_after says, in Slack"})
}

// hlOwn loads the request of the path's call id for c's key.
func (s *Server) hlOwn(w http.ResponseWriter, r *http.Request, c call, kind approval.Kind) (*approval.Request, bool) {
	callID := r.PathValue("call_id")
	what := "function call"
	if kind == approval.KindContact {
		what = "contact request"
	}
	req, err := s.req.Request(r.Context(), s.requestID(approval.CallerHumanLayer, kind, c.key.SHA256, callID))
	switch {
	case err == nil && req.Caller.Kind == approval.CallerHumanLayer && req.Caller.Name == c.key.Name && req.Kind == kind:
		return req, true
	case err == nil || errors.Is(err, approval.ErrNotFound):
		s.refuse(w, r, c, http.StatusNotFound, ErrorDetail{Code: "not_found", Field: "call_id", Message: fmt.Sprintf("no %s %q for key %s", what, callID, c.key.Name)})
	default:
		s.fail(w, r, c, "read request", err)
	}
	return nil, false
}

// hlCheck checks the fields both kinds share: run and call ids, state,
// and a status that decides nothing (the SDKs send null).
func (s *Server) hlCheck(w http.ResponseWriter, r *http.Request, c call, runID, callID string, state, status json.RawMessage, decisive ...string) bool {
	switch {
	case strings.TrimSpace(runID) == "" || len(runID) > 200:
		s.hlBad(w, r, c, "run_id", "run_id is required and at most 200 bytes")
		return false
	case strings.TrimSpace(callID) == "" || len(callID) > 200 || strings.ContainsAny(callID, "/?#"):
		s.hlBad(w, r, c, "call_id", "call_id is required, at most 200 bytes, without / ? or #: the same call id returns the same request")
		return false
	case !jsonObjectOrNull(state):
		s.hlBad(w, r, c, "spec.state", "spec.state must be a JSON object or null")
		return false
	case len(state) > maxStateBytes:
		s.hlBad(w, r, c, "spec.state", fmt.Sprintf("spec.state is larger than %d bytes", maxStateBytes))
		return false
	case !jsonObjectOrNull(status):
		s.hlBad(w, r, c, "status", "status must be null when asking")
		return false
	}
	var st map[string]json.RawMessage
	if !isNull(status) && json.Unmarshal(status, &st) == nil {
		for _, f := range decisive {
			if v, set := st[f]; set && !isNull(v) {
				s.refuse(w, r, c, http.StatusForbidden, ErrorDetail{Code: codeDecisionNotAllowed, Field: "status." + f,
					Message: "decisions come only from Slack: a request cannot be created with status." + f + " set"})
				return false
			}
		}
	}
	return true
}

// hlChoices checks a caller's response options and returns them as the
// request's choices.
func (s *Server) hlChoices(w http.ResponseWriter, r *http.Request, c call, field string, opts []hlOption) ([]approval.Choice, bool) {
	if len(opts) > maxChoices {
		s.hlBad(w, r, c, field, fmt.Sprintf("%s: at most %d options", field, maxChoices))
		return nil, false
	}
	var out []approval.Choice
	for i, o := range opts {
		f := fmt.Sprintf("%s[%d]", field, i)
		ch := approval.Choice{Name: strings.TrimSpace(o.Name), Title: deref(o.Title), Description: deref(o.Description), PromptFill: deref(o.PromptFill)}
		switch {
		case ch.Name == "" || len(ch.Name) > maxChoiceName:
			s.hlBad(w, r, c, f+".name", fmt.Sprintf("an option's name is required and at most %d bytes", maxChoiceName))
			return nil, false
		case slices.ContainsFunc(out, func(p approval.Choice) bool { return p.Name == ch.Name }):
			s.hlBad(w, r, c, f+".name", fmt.Sprintf("option names must be unique; %q is repeated", ch.Name))
			return nil, false
		case len(ch.Title) > maxChoiceTitle:
			s.hlBad(w, r, c, f+".title", fmt.Sprintf("an option's title is at most %d bytes", maxChoiceTitle))
			return nil, false
		case len(ch.Description) > maxChoiceText:
			s.hlBad(w, r, c, f+".description", fmt.Sprintf("an option's description is at most %d bytes", maxChoiceText))
			return nil, false
		case len(ch.PromptFill) > maxChoiceText:
			s.hlBad(w, r, c, f+".prompt_fill", fmt.Sprintf("an option's prompt_fill is at most %d bytes", maxChoiceText))
			return nil, false
		}
		out = append(out, ch)
	}
	return out, true
}

func (s *Server) hlBad(w http.ResponseWriter, r *http.Request, c call, field, msg string) {
	s.refuse(w, r, c, http.StatusBadRequest, ErrorDetail{Code: "invalid_field", Field: field, Message: msg})
}

// hlCallOf shows a tool-call request as HumanLayer's FunctionCall.
func hlCallOf(r *approval.Request) hlCall {
	kwargs := r.Args
	if len(r.OriginalArgs) > 0 {
		kwargs = r.OriginalArgs // what the caller sent
	}
	st := hlCallStatus{RequestedAt: timePtr(r.Created)}
	if r.Card.Bound() {
		st.SlackMessageTS = strPtr(r.Card.TS)
	}
	if approved, comment, at, final := callOutcome(r); final {
		st.Approved, st.RespondedAt = &approved, timePtr(at)
		if comment != "" {
			st.Comment = strPtr(comment)
		}
		if d := r.Decision; !approved && d != nil && d.Choice != "" {
			st.RejectOptionName = strPtr(d.Choice)
		}
	}
	status, _ := json.Marshal(st)
	return hlCall{RunID: r.RunID, CallID: r.CallID, Status: status, Countersign: infoOf(r),
		Spec: hlCallSpec{Fn: r.Tool, Kwargs: kwargs, RejectOptions: hlOptionsOf(r.Choices), State: r.CallerState}}
}

// callOutcome is what HumanLayer's status says of r: approved (the SDK
// then runs the function with the kwargs it sent), the comment, and when
// it was decided; final is false while nobody decided.
func callOutcome(r *approval.Request) (approved bool, comment string, at time.Time, final bool) {
	if r.Mode == approval.ModeSettled {
		return r.Status == approval.StatusApproved, r.Result, r.Created, true
	}
	if !r.Status.Decided() {
		return false, "", time.Time{}, false
	}
	d := r.Decision
	if d == nil {
		d = &approval.Decision{}
	}
	switch r.Status {
	case approval.StatusExecuting, approval.StatusExecuted, approval.StatusFailed, approval.StatusUnknown:
		// Handed over already, to the answer that first reported the
		// approval (hlHandOff): never again, so it never runs twice.
		return false, "approved, and already handed to an earlier answer for this call (the caller that polled it then runs it): not handed again, so it must not run again", d.At, true
	case approval.StatusAbandoned:
		return false, abandonedWhy(r), d.At, true
	case approval.StatusRefused:
		return false, "approved, but refused when it was to run: " + r.Result + "; it must not run", d.At, true
	case approval.StatusApproved:
		if d.Verdict == approval.VerdictEdit {
			// Never offered on these cards; should one happen, approved
			// would run the kwargs the caller sent, which nobody approved.
			return false, "an approver changed the arguments to " + string(r.Args) + "; the arguments you sent were not approved", d.At, true
		}
		return true, d.Text, d.At, true
	case approval.StatusRejected:
		text := d.Text
		switch {
		case text != "":
		case d.Verdict == approval.VerdictCancel:
			text = "cancelled by an approver in its cancel window"
		default:
			text = "rejected by an approver"
		}
		return false, text, d.At, true
	case approval.StatusResponded:
		return false, d.Text, d.At, true
	}
	return false, endedWhy(r), d.At, true
}

// endedWhy says why r ended without a decision or an answer.
func endedWhy(r *approval.Request) string {
	d := r.Decision
	switch {
	case r.Status == approval.StatusExpired:
		return "no decision before the deadline (" + r.Deadline.UTC().Format(time.RFC3339) + ")"
	case r.Status == approval.StatusCancelled && d != nil && d.Text != "":
		return "cancelled: " + d.Text
	case r.Status == approval.StatusRejected && d != nil && d.Text != "":
		return "declined: " + d.Text
	}
	return string(r.Status)
}

// hlAskOf shows a contact request as HumanLayer's HumanContact.
func hlAskOf(r *approval.Request) hlAsk {
	var q question
	_ = json.Unmarshal(r.Args, &q) // written by hlCreateAsk
	spec := hlAskSpec{Msg: q.Msg, ResponseOptions: hlOptionsOf(r.Choices), State: r.CallerState}
	if q.Subject != "" {
		spec.Subject = strPtr(q.Subject)
	}
	st := hlAskStatus{RequestedAt: timePtr(r.Created)}
	if d := r.Decision; r.Status == approval.StatusResponded && d != nil {
		st.RespondedAt, st.Response = timePtr(d.At), strPtr(d.Text)
		if d.Choice != "" {
			st.ResponseOptionName = strPtr(d.Choice)
		}
	}
	status, _ := json.Marshal(st)
	return hlAsk{RunID: r.RunID, CallID: r.CallID, Spec: spec, Status: status, Countersign: infoOf(r)}
}

func infoOf(r *approval.Request) *hlInfo {
	i := &hlInfo{RequestID: r.ID, Status: r.Status}
	if d := r.Decision; d != nil && d.Verdict.Human() {
		i.Approver = d.Approver
	}
	return i
}

func hlOptionsOf(cs []approval.Choice) []hlOption {
	var out []hlOption
	for _, c := range cs {
		o := hlOption{Name: c.Name}
		if c.Title != "" {
			o.Title = strPtr(c.Title)
		}
		if c.Description != "" {
			o.Description = strPtr(c.Description)
		}
		if c.PromptFill != "" {
			o.PromptFill = strPtr(c.PromptFill)
		}
		out = append(out, o)
	}
	return out
}

// stateOf is the caller's state as kept: compact, nil when null.
func stateOf(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	out, err := approval.Compact(raw)
	if err != nil {
		return nil
	}
	return out
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// jsonObjectOrNull reports whether raw is absent, null or an object.
func jsonObjectOrNull(raw json.RawMessage) bool {
	return isNull(raw) || bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{"))
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return strings.TrimSpace(*p)
}

func strPtr(s string) *string { return &s }

func timePtr(t time.Time) *time.Time {
	u := t.UTC()
	return &u
}
