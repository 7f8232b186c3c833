package authzen

// This file: the Access Request and Approval Profile (draft): an access
// request proposes the denied call (its card), and its task reports the
// request's state until the caller evaluates again.

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
)

// Submission is the body of POST /access/v1/requests: the denied
// evaluation's subject, action, resource and context, and the denial
// (its evaluation_id, or its access_request.request_context: the binding
// token).
type Submission struct {
	Evaluation
	Denial *struct {
		EvaluationID  string `json:"evaluation_id"`
		AccessRequest *struct {
			RequestContext string `json:"request_context"`
		} `json:"access_request"`
	} `json:"denial"`
}

// Task is the profile's task handle.
type Task struct {
	ID             string         `json:"id"`
	Status         string         `json:"status"`
	StatusEndpoint string         `json:"status_endpoint"`
	ExpiresAt      string         `json:"expires_at,omitempty"`
	Display        map[string]any `json:"display,omitempty"`
}

// TaskAnswer is the body of a submission's and a status endpoint's answer.
type TaskAnswer struct {
	Task   Task    `json:"task"`
	Result *Result `json:"result,omitempty"`
}

// Result is an approved task's completion: evaluate again (the one mode
// the profile defines), with ApprovalContext in the evaluation's context
// as authzen_access_request_approval.
type Result struct {
	Mode            string         `json:"mode"`
	Approval        map[string]any `json:"approval"`
	ApprovalContext map[string]any `json:"approval_context"`
}

// Task statuses of the profile.
const (
	TaskPending   = "pending"
	TaskApproved  = "approved"
	TaskDenied    = "denied"
	TaskExpired   = "expired"
	TaskCancelled = "cancelled"
	TaskFailed    = "failed"
)

// submit is POST /access/v1/requests.
func (s *Service) submit(w http.ResponseWriter, r *http.Request, c caller) {
	var in Submission
	if _, ok := s.readBody(w, r, &in); !ok {
		return
	}
	cl, err := readCall(in.Evaluation, "")
	if err != nil {
		var bf *badField
		errors.As(err, &bf)
		problem(w, http.StatusBadRequest, "invalid_request", bf.field, bf.Error())
		return
	}
	token := ""
	if in.Denial != nil {
		token = in.Denial.EvaluationID
		if in.Denial.AccessRequest != nil && in.Denial.AccessRequest.RequestContext != "" {
			token = in.Denial.AccessRequest.RequestContext
		}
	}
	if token == "" {
		problem(w, http.StatusBadRequest, "invalid_denial_binding", "denial", "denial: the denied evaluation's evaluation_id (or access_request.request_context) is required")
		return
	}
	if err := s.checkBinding(c, cl.id, token); errors.Is(err, errExpiredDenial) {
		problem(w, http.StatusGone, "expired_denial", "denial", "denial: "+err.Error())
		return
	} else if err != nil {
		problem(w, http.StatusBadRequest, "invalid_denial_binding", "denial", "denial: "+err.Error())
		return
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" && !s.idem.check(fmt.Sprintf("%x:%s", c.keySum, key), cl.id) {
		problem(w, http.StatusConflict, "duplicate_request", "", "Idempotency-Key "+key+" was used for another access request (another subject, tool or arguments)")
		return
	}
	if in.Action.Name != ActionCall && in.Action.Name != ActionMCPCall || in.Resource.Type != ResourceTool {
		problem(w, http.StatusBadRequest, "not_requestable", "", unsupported(cl))
		return
	}
	got, err := c.api.Request(r.Context(), cl.apiCall(false))
	if err != nil {
		if _, f := s.refused(r.Context(), cl, err); f != nil {
			f.write(w)
			return
		}
		var apiErr *client.Error
		errors.As(err, &apiErr)
		problem(w, http.StatusBadRequest, "not_requestable", apiErr.Field, fmt.Sprintf("Countersign refused the call to %s: %s", cl.tool, apiErr.Message))
		return
	}
	base := base(r)
	switch {
	case got.ID == "" && got.Status == client.Approved:
		// The policy lets it through now (it changed, or the call was
		// approved recently): complete at once, nothing to approve.
		writeJSON(w, http.StatusCreated, TaskAnswer{Task: Task{ID: cl.id, Status: TaskApproved, StatusEndpoint: base + PathRequests + "/" + cl.id},
			Result: &Result{Mode: "reevaluate", Approval: map[string]any{"id": cl.id}, ApprovalContext: map[string]any{}}})
		return
	case got.ID == "":
		problem(w, http.StatusBadRequest, "not_requestable", "", fmt.Sprintf("the call to %s is %s: %s", cl.tool, got.Status, cmp.Or(got.Reason, "refused by policy")))
		return
	}
	answer := taskAnswer(base, got)
	w.Header().Set("Location", answer.Task.StatusEndpoint)
	status := http.StatusAccepted
	if answer.Task.Status != TaskPending {
		status = http.StatusCreated
	}
	writeJSON(w, status, answer)
}

// unsupported says which evaluations Countersign decides.
func unsupported(cl call) string {
	return fmt.Sprintf("Countersign decides tool calls: resource.type %q with resource.id the tool's name and action.name %q (or %q); got resource.type %q, action.name %q",
		ResourceTool, ActionCall, ActionMCPCall, cl.resource.Type, cl.action.Name)
}

// task is GET /access/v1/requests/{id}, the task's status endpoint.
func (s *Service) task(w http.ResponseWriter, r *http.Request, c caller) {
	id := r.PathValue("id")
	got, err := c.api.Get(r.Context(), id, 0)
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.HTTPStatus == http.StatusNotFound,
		err == nil && !strings.HasPrefix(got.CallID, callIDPrefix):
		problem(w, http.StatusNotFound, "unknown_task", "", "no access request "+id+" for this key")
		return
	case err != nil:
		if _, f := s.refused(r.Context(), call{tool: "the task"}, err); f != nil {
			f.write(w)
			return
		}
		problem(w, apiErr.HTTPStatus, "invalid_request", apiErr.Field, apiErr.Message)
		return
	}
	writeJSON(w, http.StatusOK, taskAnswer(base(r), got))
}

// taskAnswer is request got as the profile's task: its status mapped
// (approved for every state after an approval: the evaluation that
// follows says whether it may still pass), its deadline while pending,
// and who decided and why.
func taskAnswer(base string, got *client.Request) TaskAnswer {
	t := Task{ID: got.ID, StatusEndpoint: base + PathRequests + "/" + url.PathEscape(got.ID)}
	var res *Result
	switch got.Status {
	case client.Pending:
		t.Status = TaskPending
		if got.Deadline != nil {
			t.ExpiresAt = got.Deadline.UTC().Format(time.RFC3339)
		}
		t.Display = map[string]any{"title": "Waiting for approval", "description": fmt.Sprintf("A person is asked in Slack to approve the call to %s.", got.Tool)}
	case client.Approved, client.Executing, client.Executed, client.Failed, client.Unknown:
		t.Status = TaskApproved
		approval := map[string]any{"id": got.ID}
		if got.DecidedAt != nil {
			approval["approved_at"] = got.DecidedAt.UTC().Format(time.RFC3339)
		}
		res = &Result{Mode: "reevaluate", Approval: approval, ApprovalContext: map[string]any{"approval_id": got.ID}}
		desc := fmt.Sprintf("Approved%s: evaluate the call again; that evaluation passes once.", by(got))
		if got.Status != client.Approved {
			desc = fmt.Sprintf("Approved%s, and the approval was used: the call passed an evaluation once already.", by(got))
		}
		t.Display = map[string]any{"title": "Approved", "description": desc}
	case client.Rejected, client.Refused, client.Responded:
		t.Status = TaskDenied
		t.Display = map[string]any{"title": "Denied", "description": got.NotRun(got.Tool)}
	case client.Expired:
		t.Status = TaskExpired
		t.Display = map[string]any{"title": "Expired", "description": got.NotRun(got.Tool)}
	case client.Cancelled, client.Abandoned:
		t.Status = TaskCancelled
		t.Display = map[string]any{"title": "Cancelled", "description": got.NotRun(got.Tool)}
	default:
		t.Status = TaskFailed
	}
	return TaskAnswer{Task: t, Result: res}
}
