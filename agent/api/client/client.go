// Package client is a small Go client of Countersign's HTTP API (/v1):
// ask for approval of a tool call (Request), wait for the decision (Wait,
// a long-poll loop), claim an approved call before running it (Claim:
// exactly one claim wins), report what ran with the claim's token
// (Result), list its pending requests (List), withdraw one (Cancel, or
// GiveUp when it stops waiting),
// and check the signature of a webhook delivery
// (VerifyWebhook). It depends on the standard library
// only, so any agent can import it.
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Status is where a request is in its life: the server's status of the
// request (approval.Status), as the API writes it.
type Status string

// Statuses up to the decision. Pending is the only one that is not
// final; Approved lets the caller run the call (with Request.Arguments,
// which an approver may have edited).
const (
	Pending   Status = "pending"
	Approved  Status = "approved"
	Rejected  Status = "rejected"
	Responded Status = "responded"
	Expired   Status = "expired"
	Cancelled Status = "cancelled"
)

// Statuses after an approval: Executing once claimed, then what the caller
// reported with Result (Executed or Failed), or Unknown when the run
// stopped before reporting (it is never run again blindly).
const (
	Executing Status = "executing"
	Executed  Status = "executed"
	Failed    Status = "failed"
	Unknown   Status = "unknown"
	// Abandoned: approved, but nobody claimed it within the claim window
	// (the caller had gone); nothing ran and nothing may.
	Abandoned Status = "abandoned"
	// Refused: approved, but the judgement at its claim refused it under
	// the policy in force (Request.Reason says why); nothing ran and
	// nothing will.
	Refused Status = "refused"
)

// Final reports whether s is past pending.
func (s Status) Final() bool { return s != Pending && s != "" }

// Fact is one labelled value the caller supplies for the approval card;
// the card shows it as supplied by the caller (unverified).
type Fact struct {
	Label string `json:"label"`
	Value string `json:"value"`
}

// Call is what is asked to be approved.
type Call struct {
	// Tool is the tool's name: a tool the policy declares, or one its
	// external rule covers.
	Tool string `json:"tool"`
	// Arguments is the call's JSON object of arguments.
	Arguments json.RawMessage `json:"arguments"`
	// RunID is the caller's own run id (shown in the audit).
	RunID string `json:"run_id,omitempty"`
	// CallID identifies the call: the same call id always returns the
	// same request (retries are safe).
	CallID string `json:"call_id"`
	// Reason is the model's reason, shown labelled as the model's.
	Reason string `json:"reason,omitempty"`
	// Confidence is the model's confidence in [0,1], if it gave one.
	Confidence *float64 `json:"confidence,omitempty"`
	// Facts are shown on the card as supplied by the caller.
	Facts []Fact `json:"facts,omitempty"`
	// Annotations are the tool's own hints (an MCP tool's annotations);
	// for a tool the policy does not declare they make the review
	// stricter, never looser.
	Annotations *Annotations `json:"annotations,omitempty"`
	// InputSchema is the tool's JSON Schema (an MCP tool's inputSchema),
	// for a tool the policy does not declare: the arguments, and an
	// approver's edit of them, are validated against it.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// Upstream names the MCP upstream server the tool belongs to (set by
	// Countersign's MCP gateway); the card shows it as the call's source.
	Upstream string `json:"upstream,omitempty"`
	// JudgeOnly asks what the policy says without asking anyone: a call
	// it lets through or refuses is answered as always, but one that
	// needs a person creates nothing and comes back pending with no ID
	// (an existing request of the same call id is returned as it is).
	JudgeOnly bool `json:"judge_only,omitempty"`
	// Gateway names the gateway that checked the call ("ext_authz": Envoy's
	// external authorization, which cannot apply an approver's edit, so
	// none is offered on the card), "" when none.
	Gateway string `json:"gateway,omitempty"`
	// Route is the gateway's route the call came by, shown on the card.
	Route string `json:"route,omitempty"`
	// OnBehalfOf is the identity of the caller a gateway checked the call
	// for (a JWT's email or sub): the key's policy maps it to the person
	// who asked (api.keys[].callers); a key with callers requires it, one
	// without refuses it.
	OnBehalfOf string `json:"on_behalf_of,omitempty"`
}

// Annotations are a tool's hints about itself, as MCP defines them; nil
// is unknown (MCP's defaults: not read-only, destructive, open-world).
type Annotations struct {
	ReadOnly    *bool `json:"read_only,omitempty"`
	Destructive *bool `json:"destructive,omitempty"`
	OpenWorld   *bool `json:"open_world,omitempty"`
}

// Signal is one policy signal that made a human look.
type Signal struct {
	Code string `json:"code"`
	Text string `json:"text"`
}

// Outcome is what the caller reported of its execution.
type Outcome struct {
	Status Status `json:"status"`
	Output string `json:"output"`
}

// Report is the body of a result: the claim token the winning Claim
// returned, and the outcome.
type Report struct {
	ClaimToken string `json:"claim_token"`
	Status     Status `json:"status"`
	Output     string `json:"output"`
}

// Claimed is the answer of the one claim that won: the token Result must
// carry, and the request, now executing.
type Claimed struct {
	Token   string  `json:"claim_token"`
	Request Request `json:"request"`
}

// Request is a request as the API shows it.
type Request struct {
	// ID is empty when the call needed no request: AutoApproved, or
	// refused by policy (Rejected with Reason).
	ID           string `json:"id"`
	Tool         string `json:"tool"`
	RunID        string `json:"run_id,omitempty"`
	CallID       string `json:"call_id"`
	Status       Status `json:"status"`
	Verdict      string `json:"verdict,omitempty"`
	AutoApproved bool   `json:"auto_approved,omitempty"`
	// Approver is the Slack user id whose decision made it final, and
	// ApproverName what people call them (the id when no name can be
	// had): show the name to people and models, keep the id for scripts.
	Approver     string `json:"approver,omitempty"`
	ApproverName string `json:"approver_name,omitempty"`
	// Approvers are the ids of the approvals counted, ApproverNames their
	// names in the same order.
	Approvers     []string `json:"approvers,omitempty"`
	ApproverNames []string `json:"approver_names,omitempty"`
	// Reason is why it was rejected (or expired, cancelled).
	Reason string `json:"reason,omitempty"`
	// Response is a person's answer given in place of the tool.
	Response string `json:"response,omitempty"`
	// Arguments are the ones to run with (an approver's edit included)
	// and Digest their digest.
	Arguments         json.RawMessage `json:"arguments"`
	Digest            string          `json:"digest"`
	Edited            bool            `json:"edited,omitempty"`
	OriginalArguments json.RawMessage `json:"original_arguments,omitempty"`
	Signals           []Signal        `json:"signals,omitempty"`
	CreatedAt         *time.Time      `json:"created_at,omitempty"`
	Deadline          *time.Time      `json:"deadline,omitempty"`
	DecidedAt         *time.Time      `json:"decided_at,omitempty"`
	Result            *Outcome        `json:"result,omitempty"`
}

// Error is a refusal from the API.
type Error struct {
	// HTTPStatus is the HTTP status (401, 403, 400, 404, 409, 413, 429…),
	// from the response, not its body.
	HTTPStatus int `json:"-"`
	// Code is the API's stable code (unauthenticated, forbidden_tool,
	// invalid_field, unknown_field, rate_limited…).
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the offending field, when one is.
	Field string `json:"field,omitempty"`
	// RetryAfter is set on rate_limited, from the Retry-After header.
	RetryAfter time.Duration `json:"-"`
	// Request is the request as it now is, on a refusal that depends on
	// its state: a Claim that lost (already_claimed) finds the first
	// claim's state here (executing, or its Result).
	Request *Request `json:"-"`
}

// ErrorBody is the body of every refusal, as the server writes it.
type ErrorBody struct {
	Error Error `json:"error"`
	// Request is the request as it now is, on a refusal that depends on
	// its state (a claim after the first: already_claimed, abandoned,
	// not_approved): a caller that lost the claim reads the first one's
	// state (executing, or its result) here.
	Request *Request `json:"request,omitempty"`
}

func (e *Error) Error() string {
	s := fmt.Sprintf("countersign: %d %s: %s", e.HTTPStatus, e.Code, e.Message)
	if e.Field != "" {
		s += " (field " + e.Field + ")"
	}
	return s
}

// Client calls one Countersign server with one API key.
type Client struct {
	// BaseURL is the server, e.g. http://countersign:8080 (no /v1).
	BaseURL string
	// Key is the API key.
	Key string
	// HTTP sends the calls, default http.DefaultClient. A long poll lasts
	// up to PollWait: a client timeout must be longer.
	HTTP *http.Client
	// PollWait is how long one long poll of Wait lasts, default 30 s.
	PollWait time.Duration
	// WithdrawIfGone makes Request and every long poll ask the server to
	// withdraw the request when this client goes away while waiting: when
	// the request's answer or a poll ends (dropped, or answered
	// "pending") and no poll of the request follows within the server's
	// grace period (a few seconds), the request is cancelled and its card
	// says the caller gave up. For a caller that waits without pause
	// until it gets its answer (a hook), never for one that polls now and
	// then.
	WithdrawIfGone bool
}

// New returns a client of the server at baseURL with key.
func New(baseURL, key string) *Client { return &Client{BaseURL: baseURL, Key: key} }

// Request asks for approval of c. A call the policy lets through comes
// back approved at once (AutoApproved, no ID); one a deny rule refuses
// comes back rejected with the policy's reason; otherwise the request is
// pending and its card is up.
func (cl *Client) Request(ctx context.Context, c Call) (*Request, error) {
	var r Request
	p := "/v1/requests"
	if cl.WithdrawIfGone {
		p += "?withdraw_if_gone=true"
	}
	if err := cl.do(ctx, http.MethodPost, p, c, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Get returns the request now (wait 0) or once it is final or wait passed
// (a long poll the server bounds; with WithdrawIfGone, one whose end
// without an answer the server watches).
func (cl *Client) Get(ctx context.Context, id string, wait time.Duration) (*Request, error) {
	p := "/v1/requests/" + url.PathEscape(id)
	if wait > 0 {
		p += "?wait=" + url.QueryEscape(wait.String())
		if cl.WithdrawIfGone {
			p += "&withdraw_if_gone=true"
		}
	}
	var r Request
	if err := cl.do(ctx, http.MethodGet, p, nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Wait long-polls the request until it is final or ctx ends. A failed
// poll (network, 5xx) is retried after a short pause; a refusal (4xx) is
// returned.
func (cl *Client) Wait(ctx context.Context, id string) (*Request, error) {
	if id == "" {
		return nil, errors.New("countersign: Wait: empty request id (an auto-approved or refused call has no request)")
	}
	wait := cl.PollWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	pause := 500 * time.Millisecond
	for {
		start := time.Now()
		r, err := cl.Get(ctx, id, wait)
		if err == nil && r.Status.Final() {
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.HTTPStatus < 500 && apiErr.Code != "rate_limited" {
			return nil, err
		}
		// A failed poll, or one answered "pending" at once (something on
		// the way does not hold long polls), is retried after a growing
		// pause, never in a hot loop.
		if err == nil && time.Since(start) >= 100*time.Millisecond {
			pause = 500 * time.Millisecond
			continue
		}
		d := pause
		if apiErr != nil && apiErr.RetryAfter > 0 {
			d = apiErr.RetryAfter
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		pause = min(pause*2, 10*time.Second)
	}
}

// Claim claims an approved request before running it. Every claim is
// judged by the server against the policy in force (the arguments are the
// ones approved, the key may still ask for the tool, the schema, deny
// rules and the quorum as the policy says now). Exactly one claim of a
// request wins, whoever makes it: it gets the claim token Result needs.
// Every other claim is refused with an *Error (HTTP 409) whose Code says
// why, and nothing may run: refused (the judgement refused it: it ended
// refused, Message and Error.Request.Reason say why, never run it),
// needs_approvals (the policy in force asks more approvals of these
// arguments: the request is pending again — wait for it with Get and claim
// again), already_claimed (another executor runs it — its state, and
// once known its outcome, is in Error.Request), abandoned (the claim
// window ended), not_approved — never a second go.
//
// A claim Redis's replicas could not confirm (HTTP 503 not_confirmed,
// while Redis fails over) was withdrawn on the server, and nothing may
// run on it: Claim tries again after the answer's Retry-After (at most
// claimRetryMax; at once without one), up to claimRetries times, then
// returns that *Error.
func (cl *Client) Claim(ctx context.Context, id string) (*Claimed, error) {
	for try := 0; ; try++ {
		var c Claimed
		err := cl.do(ctx, http.MethodPost, "/v1/requests/"+url.PathEscape(id)+"/claim", struct{}{}, &c)
		if err == nil {
			return &c, nil
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != "not_confirmed" || try == claimRetries {
			return nil, err
		}
		t := time.NewTimer(min(e.RetryAfter, claimRetryMax))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// claimRetries and claimRetryMax bound Claim's tries again after a claim
// the server withdrew (not_confirmed).
const (
	claimRetries  = 3
	claimRetryMax = time.Second
)

// Result reports what came of the request claimed with token: status
// Executed or Failed and a short output. It is accepted once, from the
// holder of the token.
func (cl *Client) Result(ctx context.Context, id, token string, status Status, output string) (*Request, error) {
	var r Request
	if err := cl.do(ctx, http.MethodPost, "/v1/requests/"+url.PathEscape(id)+"/result", Report{ClaimToken: token, Status: status, Output: output}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func (cl *Client) do(ctx context.Context, method, path string, in, out any) error {
	hc := cl.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	t, typed := hc.Transport.(inProcess)
	if typed {
		// No JSON either way, and no copy of the request: it is ours.
		req, err := http.NewRequestWithContext(context.WithValue(ctx, bodyKey{}, handed{in}), method, strings.TrimSuffix(cl.BaseURL, "/")+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+cl.Key)
		return t.exchange(req, out)
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(cl.BaseURL, "/")+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cl.Key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var eb ErrorBody
		_ = json.Unmarshal(data, &eb)
		return refusal(resp.StatusCode, resp.Header, eb, string(data))
	}
	return json.Unmarshal(data, out)
}

// refusal is the *Error of an answer with status (>= 300), its headers
// and body eb (raw: the body's text, for an answer that is no ErrorBody).
func refusal(status int, h http.Header, eb ErrorBody, raw string) *Error {
	e := eb.Error
	e.HTTPStatus, e.Request = status, eb.Request
	if e.Code == "" {
		e.Code, e.Message = "http_error", strings.TrimSpace(raw)
	}
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return &e
}

// Key is the calling API key as the policy file lists it: its name and
// the tools it may ask for ("*": any tool the policy admits). Never the
// key or its hash.
type Key struct {
	Name  string   `json:"name"`
	Tools []string `json:"tools"`
}

// Allows reports whether the key may ask for tool.
func (k *Key) Allows(tool string) bool {
	for _, t := range k.Tools {
		if t == "*" || t == tool {
			return true
		}
	}
	return false
}

// Self returns the calling key: its name and the tools it may ask for
// (GET /v1/keys/self).
func (cl *Client) Self(ctx context.Context) (*Key, error) {
	var k Key
	if err := cl.do(ctx, http.MethodGet, "/v1/keys/self", nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// NotRun says in words, for a model and its user, why the call of r to
// tool did not run: who decided, why, and the request (the MCP gateway's
// and the ext_authz server's answer; one text for both).
func (r *Request) NotRun(tool string) string {
	who := ""
	if name := cmp.Or(r.ApproverName, r.Approver); name != "" {
		who = " by " + name // a name: the model and its user read it
	}
	reason := ""
	if r.Reason != "" {
		reason = ": " + r.Reason
	}
	id := ""
	if r.ID != "" {
		id = " (request " + r.ID + ")"
	}
	switch r.Status {
	case Rejected:
		if r.ID == "" {
			return fmt.Sprintf("The call to %s was refused by policy%s. It did not run.", tool, reason)
		}
		return fmt.Sprintf("The call to %s was rejected%s%s%s. It did not run.", tool, who, reason, id)
	case Responded:
		return fmt.Sprintf("The call to %s did not run; a person answered instead%s%s: %s", tool, who, id, r.Response)
	case Expired:
		return fmt.Sprintf("The call to %s was not decided before its deadline%s%s. It did not run.", tool, id, reason)
	case Cancelled:
		return fmt.Sprintf("The call to %s was cancelled%s%s%s. It did not run.", tool, who, reason, id)
	case Refused:
		return fmt.Sprintf("The call to %s was approved%s, but Countersign refused it when it was to run%s%s. It did not run.", tool, who, reason, id)
	default:
		return fmt.Sprintf("The call to %s is %s%s%s. It did not run.", tool, r.Status, id, reason)
	}
}
