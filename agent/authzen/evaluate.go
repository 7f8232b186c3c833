package authzen

// This file: the evaluation endpoints, one decision per tool call.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/countersign/countersign/agent/api/client"
)

// failure is an evaluation that got no decision: the whole HTTP answer is
// this refusal (a bad key, the rate limit, the system failing).
type failure struct {
	status     int
	code, msg  string
	retryAfter time.Duration
}

func (f *failure) write(w http.ResponseWriter) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(f.retryAfter.Seconds()+0.999)))
	}
	if f.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="countersign", error="invalid_token"`)
	}
	problem(w, f.status, f.code, "", f.msg)
}

// ReasonApprovalRequired is the reason of a requestable denial.
const ReasonApprovalRequired = "approval_required"

// evaluation is POST /access/v1/evaluation.
func (s *Service) evaluation(w http.ResponseWriter, r *http.Request, c caller) {
	var e Evaluation
	if _, ok := s.readBody(w, r, &e); !ok {
		return
	}
	cl, err := readCall(e, "")
	if err != nil {
		var bf *badField
		errors.As(err, &bf)
		problem(w, http.StatusBadRequest, "invalid_request", bf.field, bf.Error())
		return
	}
	d, f := s.decide(r.Context(), r, c, cl)
	if f != nil {
		f.write(w)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// Semantics of a batch (options.evaluations_semantic).
const (
	ExecuteAll          = "execute_all"
	DenyOnFirstDeny     = "deny_on_first_deny"
	PermitOnFirstPermit = "permit_on_first_permit"
)

// batch is the body of POST /access/v1/evaluations: the top-level
// subject, action, resource and context are the defaults of every item.
type batch struct {
	Evaluation
	Evaluations []Evaluation `json:"evaluations"`
	Options     struct {
		Semantic string `json:"evaluations_semantic"`
	} `json:"options"`
}

// evaluations is POST /access/v1/evaluations.
func (s *Service) evaluations(w http.ResponseWriter, r *http.Request, c caller) {
	var b batch
	if _, ok := s.readBody(w, r, &b); !ok {
		return
	}
	switch b.Options.Semantic {
	case "", ExecuteAll, DenyOnFirstDeny, PermitOnFirstPermit:
	default:
		problem(w, http.StatusBadRequest, "invalid_request", "options.evaluations_semantic",
			fmt.Sprintf("options.evaluations_semantic: %q is none of %s, %s, %s", b.Options.Semantic, ExecuteAll, DenyOnFirstDeny, PermitOnFirstPermit))
		return
	}
	items := b.Evaluations
	if len(items) == 0 { // no items: the top level is the one evaluation
		items = []Evaluation{{}}
	}
	if len(items) > 100 {
		problem(w, http.StatusBadRequest, "invalid_request", "evaluations", "evaluations: at most 100 in one request")
		return
	}
	calls := make([]call, len(items))
	for i, it := range items {
		it.Subject = cmp.Or(it.Subject, b.Subject)
		it.Action = cmp.Or(it.Action, b.Action)
		it.Resource = cmp.Or(it.Resource, b.Resource)
		if it.Context == nil {
			it.Context = b.Context
		}
		prefix := fmt.Sprintf("evaluations[%d].", i)
		if len(b.Evaluations) == 0 {
			prefix = ""
		}
		cl, err := readCall(it, prefix)
		if err != nil {
			var bf *badField
			errors.As(err, &bf)
			problem(w, http.StatusBadRequest, "invalid_request", bf.field, bf.Error())
			return
		}
		calls[i] = cl
	}
	out := struct {
		Evaluations []Decision `json:"evaluations"`
	}{Evaluations: []Decision{}}
	for _, cl := range calls {
		d, f := s.decide(r.Context(), r, c, cl)
		if f != nil {
			f.write(w)
			return
		}
		out.Evaluations = append(out.Evaluations, d)
		if b.Options.Semantic == DenyOnFirstDeny && !d.Decision || b.Options.Semantic == PermitOnFirstPermit && d.Decision {
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// denied is a decision false with reason (and the request it is about,
// when there is one).
func denied(reason, requestID string) Decision {
	ctx := map[string]any{"reason": reason}
	if requestID != "" {
		ctx["countersign_request_id"] = requestID
	}
	return Decision{Context: ctx}
}

// decide answers one tool call: what the policy says (judge only), or,
// when the call was asked already, what became of it — an approved call
// is claimed here, so it passes once.
func (s *Service) decide(ctx context.Context, r *http.Request, c caller, cl call) (Decision, *failure) {
	if cl.action.Name != ActionCall && cl.action.Name != ActionMCPCall || cl.resource.Type != ResourceTool {
		return denied(unsupported(cl), ""), nil
	}
	got, err := c.api.Request(ctx, cl.apiCall(true))
	if err != nil {
		return s.refused(ctx, cl, err)
	}
	switch {
	case got.ID == "" && got.Status == client.Approved: // the policy lets it through: audited by the API
		return Decision{Decision: true}, nil
	case got.ID == "" && got.Status == client.Pending: // a person must approve: nothing created
		return s.requestable(r, c, cl, nil), nil
	case got.ID == "":
		return denied(cmp.Or(got.Reason, "refused by policy"), ""), nil
	}
	if cl.approval != "" && cl.approval != got.ID {
		return denied(fmt.Sprintf("the approval %s is not this call's (request %s): the subject, tool or arguments differ from the ones approved", cl.approval, got.ID), got.ID), nil
	}
	// A claim refused with the request as it now is is answered from that
	// state; a few turns at most (needs_approvals, then decided again).
	for range 4 {
		switch got.Status {
		case client.Pending:
			return s.requestable(r, c, cl, got), nil
		case client.Approved:
		case client.Executing, client.Executed, client.Failed, client.Unknown:
			return alreadyRan(cl, got), nil
		default:
			return denied(got.NotRun(cl.tool), got.ID), nil
		}
		if got.Edited {
			return denied(fmt.Sprintf("The call to %s was approved%s with edited arguments %s, which an evaluation cannot apply. It did not run; evaluate the call with those arguments instead (request %s).",
				cl.tool, by(got), string(got.Arguments), got.ID), got.ID), nil
		}
		claimed, err := c.api.Claim(ctx, got.ID)
		var apiErr *client.Error
		switch {
		case err == nil:
			// The PEP's outcome is never seen here: report the call as
			// handed on, so the request does not wait for a result.
			if _, err := c.api.Result(ctx, got.ID, claimed.Token, client.Executed, "let through by an AuthZEN evaluation; its outcome is not seen by Countersign"); err != nil {
				s.opts.Logger.Warn("authzen result not recorded", "request_id", got.ID, "tool", cl.tool, "err", err)
			}
			approval := map[string]any{"id": got.ID}
			if got.DecidedAt != nil {
				approval["approved_at"] = got.DecidedAt.UTC().Format(time.RFC3339)
			}
			return Decision{Decision: true, Context: map[string]any{"approval": approval, "countersign_request_id": got.ID}}, nil
		case errors.As(err, &apiErr) && apiErr.Code == "needs_approvals":
			got.Status = client.Pending // the policy in force asks more approvals
			continue
		case errors.As(err, &apiErr) && apiErr.Request != nil:
			got = apiErr.Request
			if apiErr.Code == "already_claimed" {
				return alreadyRan(cl, got), nil
			}
			continue
		}
		return s.refused(ctx, cl, err)
	}
	return denied(fmt.Sprintf("The call to %s could not be claimed (request %s, %s); it did not run.", cl.tool, got.ID, got.Status), got.ID), nil
}

// alreadyRan is the denial of a call whose approval was used.
func alreadyRan(cl call, r *client.Request) Decision {
	return denied(fmt.Sprintf("The call to %s already ran once (request %s): an approval lets one evaluation pass, never a second. Submit a new access request to run it again.", cl.tool, r.ID), r.ID)
}

func by(r *client.Request) string {
	if name := cmp.Or(r.ApproverName, r.Approver); name != "" {
		return " by " + name
	}
	return ""
}

// requestable is the denial of a call a person must approve, with what the
// access request needs (the profile's context.access_request).
func (s *Service) requestable(r *http.Request, c caller, cl call, pending *client.Request) Decision {
	now := s.opts.Now()
	exp := now.Add(s.opts.DenialTTL).Truncate(time.Second)
	token := s.bindingToken(c, cl.id, exp)
	ar := map[string]any{
		"requestable":     true,
		"endpoint":        base(r) + PathRequests,
		"reason":          "human_approval_required",
		"expires_at":      exp.UTC().Format(time.RFC3339),
		"request_context": token,
		"display": map[string]any{"title": "Approval required",
			"description": fmt.Sprintf("A person must approve this call to %s in Slack before it runs. Submit an access request, then evaluate again once it is approved.", cl.tool)},
	}
	out := denied(ReasonApprovalRequired, "")
	out.Context["evaluation_id"] = token
	out.Context["evaluated_at"] = now.UTC().Format(time.RFC3339)
	out.Context["access_request"] = ar
	if pending != nil {
		out.Context["countersign_request_id"] = pending.ID
	}
	return out
}

// refused answers a call the /v1 API refused or failed: a refusal about
// the call is a denial (the key's scope, an unknown tool, arguments that
// do not match its schema); one about the caller fails the evaluation.
func (s *Service) refused(ctx context.Context, cl call, err error) (Decision, *failure) {
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.HTTPStatus == http.StatusUnauthorized:
		return Decision{}, &failure{status: http.StatusUnauthorized, code: "unauthenticated", msg: apiErr.Message}
	case errors.As(err, &apiErr) && apiErr.HTTPStatus == http.StatusTooManyRequests:
		return Decision{}, &failure{status: http.StatusTooManyRequests, code: "rate_limited", msg: apiErr.Message, retryAfter: apiErr.RetryAfter}
	case errors.As(err, &apiErr) && apiErr.HTTPStatus < 500:
		return denied(fmt.Sprintf("Countersign refused the call to %s: %s", cl.tool, apiErr.Message), ""), nil
	case ctx.Err() != nil:
		return Decision{}, &failure{status: http.StatusServiceUnavailable, code: "unavailable", msg: "the evaluation was cut short"}
	}
	s.opts.Logger.Error("authzen evaluation failed", "tool", cl.tool, "err", err)
	return Decision{}, &failure{status: http.StatusInternalServerError, code: "internal", msg: "Countersign could not evaluate the call; try again later"}
}
