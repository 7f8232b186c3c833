// Package hook is `countersign hook claude-code`: a command hook for
// Claude Code's PreToolUse event that asks Countersign, through its HTTP
// API (/v1, the Go client), before each tool call runs, and answers Claude
// Code allow (the call was approved and this run claimed it; with the
// edited input after an edit) or deny (with why: the approver's reason, a
// person's answer, the deadline, or what to fix when Countersign cannot
// be asked). Its PostToolUse mode reports what ran with the claim's token.
//
// It imports only the standard library and agent/api/client, like any
// outside agent would.
package hook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/clip"
)

// API is what the hook needs of Countersign's HTTP API; *client.Client
// has it. Errors are *client.Error for the API's refusals, else transport
// errors or the context's.
type API interface {
	Request(ctx context.Context, c client.Call) (*client.Request, error)
	Wait(ctx context.Context, id string) (*client.Request, error)
	Claim(ctx context.Context, id string) (*client.Claimed, error)
	Result(ctx context.Context, id, token string, status client.Status, output string) (*client.Request, error)
	// GiveUp withdraws a pending request the hook stopped waiting for:
	// its card says the caller gave up and nothing ran.
	GiveUp(ctx context.Context, id string) (*client.Request, error)
}

var _ API = (*client.Client)(nil)

// Input is the JSON Claude Code writes on a command hook's stdin
// (fields it adds that the hook does not use are ignored).
type Input struct {
	SessionID      string          `json:"session_id"`
	TranscriptPath string          `json:"transcript_path"`
	Cwd            string          `json:"cwd"`
	PermissionMode string          `json:"permission_mode"`
	HookEventName  string          `json:"hook_event_name"`
	ToolName       string          `json:"tool_name"`
	ToolInput      json.RawMessage `json:"tool_input"`
	ToolUseID      string          `json:"tool_use_id"`
	// ToolResponse is PostToolUse's: what the tool returned.
	ToolResponse json.RawMessage `json:"tool_response,omitempty"`
	// Error is PostToolUseFailure's: why the tool failed.
	Error string `json:"error,omitempty"`
}

// Output is the JSON the hook writes on stdout.
type Output struct {
	HookSpecificOutput Answer `json:"hookSpecificOutput"`
}

// Answer is the PreToolUse decision Claude Code reads.
type Answer struct {
	HookEventName string `json:"hookEventName"`
	// PermissionDecision is Allow or Deny ("" for PostToolUse).
	PermissionDecision string `json:"permissionDecision,omitempty"`
	// PermissionDecisionReason is shown to the model on a deny.
	PermissionDecisionReason string `json:"permissionDecisionReason,omitempty"`
	// UpdatedInput is the approver's edit of tool_input.
	UpdatedInput json.RawMessage `json:"updatedInput,omitempty"`
}

// PreToolUse decisions. Defer (claude -p only) ends the session with
// the call not run; `claude -p --resume` asks the hook again.
const (
	Allow = "allow"
	Deny  = "deny"
	Defer = "defer"
)

// Options configure the hook.
type Options struct {
	// API is Countersign's HTTP API with the hook's key; nil when it is
	// not configured (Problem says why).
	API API
	// Server names the server in messages (COUNTERSIGN_URL).
	Server string
	// Problem, when set, is a configuration error: every call is denied
	// with it (fail closed), e.g. "COUNTERSIGN_API_KEY is not set".
	Problem string
	// Timeout is the hook's own deadline for a decision; keep it below
	// the hook's timeout in Claude Code's settings, which lets the call
	// through on a kill unless "onFailure" is "block".
	Timeout time.Duration
	// Claims keeps a claim's token from PreToolUse to PostToolUse; nil
	// keeps none (the result is then not reported).
	Claims Claims
	// Warnings receives what went wrong without changing the answer
	// (Run sets it to stderr when nil).
	Warnings io.Writer
	// Defer answers "defer" instead of waiting for a person (claude -p
	// only): the session ends with the call not run, the request stays
	// pending, and `claude -p --resume` asks again, finding the same
	// request. DeferAfter is how long to wait for a decision before
	// deferring (0: defer at once).
	Defer      bool
	DeferAfter time.Duration
}

// giveUpTimeout bounds the withdrawal of a request the hook stopped
// waiting for: Claude Code kills a hook it stopped about a second after
// SIGTERM (2.1.332).
const giveUpTimeout = 900 * time.Millisecond

// Claims keeps the token of a claimed call between the hook's PreToolUse
// run and its PostToolUse run (two processes), keyed by tool_use_id.
type Claims interface {
	// Put keeps request id and token for the tool use.
	Put(toolUseID, requestID, token string) error
	// Take returns and forgets them; ok is false when none is kept.
	Take(toolUseID string) (requestID, token string, ok bool, err error)
}

// Run reads one hook input from in, decides, and writes the answer to
// out. It returns the process's exit code: 0 whenever an answer was
// written (a deny is an answer), 2 when none could be (Claude Code then
// blocks the call and shows errOut's text).
func Run(ctx context.Context, in io.Reader, out, errOut io.Writer, o Options) int {
	if o.Warnings == nil {
		o.Warnings = errOut
	}
	var hin Input
	data, err := io.ReadAll(io.LimitReader(in, 64<<20))
	if err == nil {
		err = json.Unmarshal(data, &hin)
	}
	var a Answer
	switch {
	case err != nil:
		a = deny(fmt.Sprintf("Countersign's hook could not read the hook input (%v); the call was not run.", err))
	case hin.HookEventName == "PostToolUse" || hin.HookEventName == "PostToolUseFailure":
		if msg := Report(ctx, hin, o); msg != "" {
			fmt.Fprintln(errOut, "countersign hook:", msg)
		}
		return 0 // nothing to decide: the answer is no output
	default:
		a = Decide(ctx, hin, o)
	}
	b, err := json.Marshal(Output{HookSpecificOutput: a})
	if err == nil {
		_, err = out.Write(append(b, '\n'))
	}
	if err != nil {
		fmt.Fprintf(errOut, "countersign hook: cannot write the answer (%v); blocking the call\n", err)
		return 2
	}
	return 0
}

func deny(reason string) Answer {
	return Answer{HookEventName: "PreToolUse", PermissionDecision: Deny, PermissionDecisionReason: reason}
}

func allow(reason string, updated json.RawMessage) Answer {
	return Answer{HookEventName: "PreToolUse", PermissionDecision: Allow, PermissionDecisionReason: reason, UpdatedInput: updated}
}

// Decide asks Countersign about one PreToolUse call and answers: allow
// only for a call the policy lets through or one approved and claimed by
// this run; deny for everything else, with why.
func Decide(ctx context.Context, in Input, o Options) Answer {
	if in.HookEventName != "" && in.HookEventName != "PreToolUse" {
		return deny(fmt.Sprintf("Countersign's hook answers PreToolUse (and reports PostToolUse), not %q: configure it under hooks.PreToolUse.", in.HookEventName))
	}
	if o.Problem != "" {
		return deny("Countersign is not configured for this hook: " + o.Problem + ". The call was not run.")
	}
	if in.ToolName == "" || in.ToolUseID == "" {
		return deny("Countersign's hook got no tool_name or tool_use_id in its input; the call was not run.")
	}
	args := in.ToolInput
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	r, err := o.API.Request(ctx, client.Call{Tool: in.ToolName, Arguments: args, CallID: in.ToolUseID,
		RunID: in.SessionID, Facts: Facts(in)})
	if err != nil {
		return deny(o.failed("ask", in, err))
	}
	if r.ID == "" { // settled by the policy at once
		if r.Status == client.Approved {
			return allow("Countersign's policy lets this call run without a person.", nil)
		}
		return deny(fmt.Sprintf("Countersign refused the call: %s", r.Reason))
	}
	if r.Status == client.Pending && o.Defer {
		var deferred bool
		if r, deferred, err = o.waitToDefer(ctx, r); err != nil {
			return deny(o.gaveUp(ctx, in, r.ID, err))
		}
		if deferred {
			return Answer{HookEventName: "PreToolUse", PermissionDecision: Defer, PermissionDecisionReason: fmt.Sprintf(
				"Waiting for a person in Countersign (request %s): %s was not run. Resume the session (claude -p --resume %s) to run it once approved.", r.ID, in.ToolName, in.SessionID)}
		}
	}
	for r.Status == client.Pending || r.Status == client.Approved {
		if r.Status == client.Pending {
			id := r.ID
			if r, err = o.API.Wait(ctx, id); err != nil {
				return deny(o.gaveUp(ctx, in, id, err))
			}
			continue
		}
		a, again := o.claim(ctx, in, r)
		if !again {
			return a
		}
		// The claim's judgement found that the policy in force asks more
		// approvals of this call: pending again, its card asking for the
		// rest. Wait for them.
		r.Status = client.Pending
	}
	switch r.Status {
	case client.Refused:
		return deny(fmt.Sprintf("Approved in Countersign, but refused when it was to run: %s; %s was not run (request %s).", r.Reason, in.ToolName, r.ID))
	case client.Rejected:
		return deny(fmt.Sprintf("Rejected by %s in Countersign: %s", who(r), r.Reason))
	case client.Responded:
		return deny(fmt.Sprintf("%s answered in Countersign instead of running %s: %s", who(r), in.ToolName, r.Response))
	case client.Expired:
		return deny(fmt.Sprintf("No decision in Countersign before the request's deadline; %s was not run (request %s).", in.ToolName, r.ID))
	case client.Cancelled:
		return deny(fmt.Sprintf("The request was cancelled in Countersign (%s); %s was not run (request %s).", orNone(r.Reason), in.ToolName, r.ID))
	case client.Abandoned:
		return deny(fmt.Sprintf("The approval came after this call had stopped waiting, so Countersign abandoned it; %s was not run (request %s). Ask again.", in.ToolName, r.ID))
	default: // executing, executed, failed, unknown: claimed before
		return deny(alreadyClaimed(in, r))
	}
}

// waitToDefer waits DeferAfter for a decision on r, pending; deferred is
// true when none came.
func (o Options) waitToDefer(ctx context.Context, r *client.Request) (_ *client.Request, deferred bool, err error) {
	if o.DeferAfter <= 0 {
		return r, true, nil
	}
	dctx, cancel := context.WithTimeout(ctx, o.DeferAfter)
	defer cancel()
	got, err := o.API.Wait(dctx, r.ID)
	switch {
	case err == nil:
		return got, false, nil
	case ctx.Err() == nil && dctx.Err() != nil:
		return r, true, nil
	}
	return r, false, err
}

// gaveUp says why the hook stopped waiting for a decision on request id
// (err) and, when it stopped because of its --timeout or because it was
// stopped (SIGTERM), withdraws the request, so the card says the caller
// gave up instead of waiting for hours for a click that runs nothing.
func (o Options) gaveUp(ctx context.Context, in Input, id string, err error) string {
	why := o.failed("wait for a decision on", in, err)
	if ctx.Err() == nil {
		return why // a refusal or a failure of the API: nothing to withdraw from here
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveUpTimeout)
	defer cancel()
	got, gerr := o.API.GiveUp(gctx, id)
	var apiErr *client.Error
	switch {
	case gerr == nil:
		return why + fmt.Sprintf(" The request was withdrawn (request %s): its card says the caller gave up.", got.ID)
	case errors.As(gerr, &apiErr) && apiErr.Code == "not_pending" && apiErr.Request != nil:
		return why + fmt.Sprintf(" The request was %s meanwhile (request %s); this run had stopped waiting, so it does not run it.", apiErr.Request.Status, id)
	}
	return why + fmt.Sprintf(" Withdrawing the request failed (%v): its card stays open until its deadline (request %s).", gerr, id)
}

// claim claims an approved request: only the claim that wins allows. again
// says the claim found the request pending again (needs_approvals): the
// caller waits for it and claims anew.
func (o Options) claim(ctx context.Context, in Input, r *client.Request) (a Answer, again bool) {
	c, err := o.API.Claim(ctx, r.ID)
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.Code == "needs_approvals":
		return Answer{}, true
	case errors.As(err, &apiErr) && apiErr.Code == "refused":
		return deny(fmt.Sprintf("Approved by %s in Countersign, but refused when it was to run: %s; %s was not run (request %s).", who(r), apiErr.Message, in.ToolName, r.ID)), false
	case errors.As(err, &apiErr) && apiErr.Code == "already_claimed" && apiErr.Request != nil:
		return deny(alreadyClaimed(in, apiErr.Request)), false
	case errors.As(err, &apiErr) && apiErr.Code == "abandoned":
		return deny(fmt.Sprintf("Approved by %s, but Countersign abandoned it (not claimed within the claim window); %s was not run (request %s). Ask again.", who(r), in.ToolName, r.ID)), false
	case err != nil:
		return deny(o.failed("claim", in, err)), false
	}
	if o.Claims != nil {
		// Without the token the result cannot be reported (the card stays
		// "executing"); the call still runs once, as approved.
		if err := o.Claims.Put(in.ToolUseID, r.ID, c.Token); err != nil && o.Warnings != nil {
			fmt.Fprintf(o.Warnings, "countersign hook: keep the claim of %s for PostToolUse: %v\n", r.ID, err)
		}
	}
	var updated json.RawMessage
	if c.Request.Edited {
		updated = c.Request.Arguments
	}
	reason := fmt.Sprintf("Approved by %s in Countersign (request %s).", who(&c.Request), r.ID)
	if updated != nil {
		reason = fmt.Sprintf("Approved by %s in Countersign with edited input (request %s).", who(&c.Request), r.ID)
	}
	return allow(reason, updated), false
}

func alreadyClaimed(in Input, r *client.Request) string {
	s := fmt.Sprintf("This call was already claimed in Countersign by an earlier run (request %s, now %s)", r.ID, r.Status)
	if r.Result != nil {
		s += fmt.Sprintf(", result: %s", clip.Bytes(r.Result.Output, 500))
	}
	return s + fmt.Sprintf("; %s is not run a second time.", in.ToolName)
}

// failed says why Countersign could not be asked, and what to fix.
func (o Options) failed(what string, in Input, err error) string {
	var apiErr *client.Error
	fix := ""
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fix = fmt.Sprintf("no decision within the hook's --timeout (%s), so it gave up. Raise --timeout (and the hook's timeout in settings.json above it) to wait longer", o.Timeout)
	case errors.Is(err, context.Canceled):
		fix = "the hook was stopped before a decision came (Claude Code's hook timeout in settings.json ran out, or it was interrupted), so it gave up. Keep the hook's timeout in settings.json above its --timeout"
	case errors.As(err, &apiErr) && apiErr.HTTPStatus == 401:
		fix = "Countersign refused the API key: set COUNTERSIGN_API_KEY to a key whose SHA-256 is under api.keys in the policy"
	case errors.As(err, &apiErr) && apiErr.Code == "forbidden_tool":
		fix = fmt.Sprintf("the API key may not ask for %s: add it (or \"*\") to the key's tools in the policy", in.ToolName)
	case errors.As(err, &apiErr) && apiErr.Code == "unknown_tool":
		fix = fmt.Sprintf("the policy neither declares %s nor has an external rule: %s", in.ToolName, apiErr.Message)
	case errors.As(err, &apiErr):
		fix = fmt.Sprintf("Countersign answered %d %s: %s", apiErr.HTTPStatus, apiErr.Code, apiErr.Message)
	default:
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		fix = fmt.Sprintf("Countersign at %s cannot be reached (%v): start it, or set COUNTERSIGN_URL to its address", o.Server, err)
	}
	return fmt.Sprintf("Countersign's hook could not %s %s: %s. The call was not run.", what, in.ToolName, fix)
}

func who(r *client.Request) string {
	if r.ApproverName != "" {
		return r.ApproverName
	}
	if r.Approver != "" {
		return r.Approver
	}
	return "a person"
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// maxFact is the API's limit on a fact's value (bytes).
const maxFact = 2000

// Facts are what the card shows of the call beside its arguments: the
// working directory, the session and the permission mode; for Bash the
// command, for Write the file and its content, for Edit the file and a
// diff of the change.
func Facts(in Input) []client.Fact {
	var out []client.Fact
	add := func(label, value string) {
		if value != "" {
			out = append(out, client.Fact{Label: label, Value: clip.Bytes(value, maxFact)})
		}
	}
	var args struct {
		Command    string `json:"command"`
		FilePath   string `json:"file_path"`
		Content    string `json:"content"`
		OldString  string `json:"old_string"`
		NewString  string `json:"new_string"`
		ReplaceAll bool   `json:"replace_all"`
		URL        string `json:"url"`
	}
	_ = json.Unmarshal(in.ToolInput, &args) // an input of another shape adds no facts
	switch in.ToolName {
	case "Bash":
		add("Command", args.Command)
	case "Write":
		add("File", args.FilePath)
		add("Content", args.Content)
	case "Edit":
		add("File", args.FilePath)
		d := Diff(args.OldString, args.NewString)
		if args.ReplaceAll {
			d += "\n(every occurrence)"
		}
		add("Change", d)
	case "WebFetch":
		add("URL", args.URL)
	}
	add("Working directory", in.Cwd)
	add("Claude Code session", in.SessionID)
	add("Permission mode", in.PermissionMode)
	return out
}

// Diff shows an Edit's change: the lines the old text and the new one
// do not share, "-" before the old and "+" before the new, with the
// lines both start and end with kept as context once.
func Diff(old, new string) string {
	a, b := strings.Split(old, "\n"), strings.Split(new, "\n")
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var s strings.Builder
	for _, l := range a[:pre] {
		s.WriteString("  " + l + "\n")
	}
	for _, l := range a[pre : len(a)-suf] {
		s.WriteString("- " + l + "\n")
	}
	for _, l := range b[pre : len(b)-suf] {
		s.WriteString("+ " + l + "\n")
	}
	for _, l := range a[len(a)-suf:] {
		s.WriteString("  " + l + "\n")
	}
	return strings.TrimSuffix(s.String(), "\n")
}
