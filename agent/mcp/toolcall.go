package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/clip"
)

// This file: one tools/call, from the gate to its answer: asked through
// the API, held while a person decides, claimed and run at most once, or
// answered with the reason it did not run.

// gated is the handler of one upstream tool: every call goes through the
// API first.
func (g *Gateway) gated(up *upstream, t *mcp.Tool) mcp.ToolHandler {
	hints := annotations(t)
	// The upstream's schema, so an approver's edit of an undeclared tool's
	// arguments is validated as the upstream would.
	var schema json.RawMessage
	if t.InputSchema != nil {
		if b, err := json.Marshal(t.InputSchema); err == nil {
			schema = b
		}
	}
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancel := g.withPost(ctx, req.Extra)
		defer cancel()
		if _, err := up.current(); err != nil {
			// Fail closed: no request is made for a call that cannot run.
			g.opts.Logger.Warn("mcp call refused: upstream unavailable", "tool", g.exposedName(up, t.Name), "err", err)
			return unavailable(g.exposedName(up, t.Name), up.name), nil
		}
		api := g.opts.API(g.key(req.Extra))
		args := json.RawMessage(req.Params.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage("{}")
		}
		name := g.exposedName(up, t.Name)
		run := g.run(req.Session)
		callKey, callID := g.callID(run, name, args)
		reason, _ := req.Params.Meta["reason"].(string)
		r, err := api.Request(ctx, client.Call{Tool: name, Arguments: args, RunID: run, CallID: callID, Reason: reason, Annotations: hints, InputSchema: schema, Upstream: up.name})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			g.opts.Logger.Error("mcp call not gated", "tool", name, "err", err)
			g.done(callKey)
			return refusal("Countersign refused the call to %s: %s", name, apiMessage(err)), nil
		}
		for {
			res, err := g.decided(ctx, req, api, up, t, r, name, callKey)
			if !errors.Is(err, errWaitAgain) {
				return res, err
			}
			// The claim's judgement found that the policy in force asks
			// more approvals: the request is pending again, its card
			// asking for the rest. Wait for them, as for the first.
			r.Status = client.Pending
		}
	}
}

// errWaitAgain is a claim's answer that the request needs more approvals
// under the policy in force (needs_approvals): it is pending again, and
// the call waits for it once more.
var errWaitAgain = errors.New("mcp: the request needs more approvals; waiting again")

// decided waits for request r of the call to be decided and answers the
// call: run once (claimed), or the reason it did not run. errWaitAgain:
// the claim found it pending again.
func (g *Gateway) decided(ctx context.Context, req *mcp.CallToolRequest, api API, up *upstream, t *mcp.Tool, r *client.Request, name, callKey string) (*mcp.CallToolResult, error) {
	var err error
	if !r.Status.Final() {
		release := g.hold(req.Extra, r.ID, name)
		r, err = g.wait(ctx, req.Session, req.Params.GetProgressToken(), api, r, name)
		release()
		if err != nil {
			// The client is gone (or cancelled the call): stop waiting
			// and never run the tool. The request stays in Countersign,
			// is still decided there and audited.
			return nil, err
		}
	}
	g.done(callKey)
	switch {
	case r.ID != "" && ranElsewhere(r.Status):
		// An identical call of this session claimed it first.
		return g.follow(ctx, req, api, r, name)
	case r.Status != client.Approved:
		return refusal("%s", r.NotRun(name)), nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case r.ID == "":
		// Let through by the policy: no request, nothing to claim.
		l, cs, o, release, err := g.use(ctx, up, req.Session, req.Extra)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			g.opts.Logger.Error("mcp call not run: no upstream session", "tool", name, "upstream", up.name, "err", err)
			return notRun(name, up.name, err), nil
		}
		defer release()
		res, callErr := g.callTool(ctx, req, l, cs, o, &mcp.CallToolParams{Name: t.Name, Arguments: r.Arguments})
		if callErr != nil {
			return refusal("the upstream %s failed: %v", up.name, callErr), nil
		}
		return res, nil
	}
	return g.execute(ctx, req, api, up, t.Name, r, name)
}

// flight is the one execution of an approved request in this process:
// identical calls waiting on the same request share its answer.
type flight struct {
	done chan struct{} // closed once res or err is set
	res  *mcp.CallToolResult
	err  error
}

// execute runs approved request r at most once: one call per request in
// this process leads (the others share its answer), and the leader claims
// the request through the API before calling the upstream; a claim that
// loses (another gateway process, or any other executor, claimed it
// first) never runs the tool and answers with the winner's stored result.
func (g *Gateway) execute(ctx context.Context, req *mcp.CallToolRequest, api API, up *upstream, tool string, r *client.Request, name string) (*mcp.CallToolResult, error) {
	g.mu.Lock()
	f, running := g.flights[r.ID]
	if !running {
		f = &flight{done: make(chan struct{})}
		g.flights[r.ID] = f
	}
	g.mu.Unlock()
	if running {
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.res != nil {
			return ownCopy(f.res), nil
		}
		if errors.Is(f.err, errWaitAgain) {
			return nil, f.err // pending again: every call on it waits again
		}
		return g.follow(ctx, req, api, r, name) // the leader's client left before its answer: read the record
	}
	f.res, f.err = g.lead(ctx, req, api, up, tool, r, name)
	g.mu.Lock()
	delete(g.flights, r.ID)
	g.mu.Unlock()
	close(f.done)
	return ownCopy(f.res), f.err
}

// lead claims r and, when the claim wins, runs the upstream tool with the
// approved arguments and reports its outcome with the claim's token.
func (g *Gateway) lead(ctx context.Context, req *mcp.CallToolRequest, api API, up *upstream, tool string, r *client.Request, name string) (*mcp.CallToolResult, error) {
	// The session it runs on first: a call that cannot reach the upstream
	// is not claimed (nothing ran; the approval ends abandoned).
	l, cs, o, release, err := g.use(ctx, up, req.Session, req.Extra)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		g.opts.Logger.Error("mcp call not run: no upstream session", "request_id", r.ID, "tool", name, "upstream", up.name, "err", err)
		return notRun(name, up.name, err), nil
	}
	defer release()
	claim, err := api.Claim(ctx, r.ID)
	if err != nil {
		var apiErr *client.Error
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.As(err, &apiErr) && apiErr.Code == "needs_approvals":
			return nil, errWaitAgain
		case errors.As(err, &apiErr) && apiErr.Code == "already_claimed":
			cur := r
			if apiErr.Request != nil {
				cur = apiErr.Request
			}
			return g.follow(ctx, req, api, cur, name)
		case errors.As(err, &apiErr) && apiErr.Request != nil:
			return refusal("%s", apiErr.Request.NotRun(name)), nil
		}
		g.opts.Logger.Error("mcp call not claimed", "request_id", r.ID, "tool", name, "err", err)
		return refusal("Countersign refused to let %s run: %s. It did not run.", name, apiMessage(err)), nil
	}
	res, callErr := g.callTool(ctx, req, l, cs, o, &mcp.CallToolParams{Name: tool, Arguments: claim.Request.Arguments})
	status, summary := client.Executed, ""
	switch {
	case callErr != nil:
		status, summary = client.Failed, callErr.Error()
	case res.IsError:
		status, summary = client.Failed, resultText(res)
	default:
		summary = resultText(res)
	}
	// Reported even when the client has gone meanwhile: it ran.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resultTimeout)
	if _, err := api.Result(rctx, r.ID, claim.Token, status, clip.Bytes(summary, 500)); err != nil {
		g.opts.Logger.Error("mcp result not reported", "request_id", r.ID, "tool", name, "err", err)
	}
	cancel()
	if callErr != nil {
		return refusal("the upstream %s failed: %v", up.name, callErr), nil
	}
	return res, nil
}

// ranElsewhere reports whether s says another executor claimed the
// request (it runs, or ran, there).
func ranElsewhere(s client.Status) bool {
	return s == client.Executing || s == client.Executed || s == client.Failed || s == client.Unknown
}

// follow answers a call whose request another executor claimed: it waits
// (reading the request every FollowEvery, with progress notifications on
// the progress ticks) until that execution's outcome is recorded, and
// answers with it. The tool never runs here.
func (g *Gateway) follow(ctx context.Context, req *mcp.CallToolRequest, api API, r *client.Request, name string) (*mcp.CallToolResult, error) {
	ticks, stop := g.opts.Ticker(g.opts.ProgressEvery)
	defer stop()
	token := req.Params.GetProgressToken()
	n := 0
	for r.Status == client.Executing {
		t := time.NewTimer(g.opts.FollowEvery)
	pause:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
				break pause
			case <-ticks:
				if token == nil || req.Session == nil {
					continue
				}
				n++
				msg := fmt.Sprintf("an identical call is running the approved request %s (%s); waiting for its result", r.ID, name)
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}); err != nil {
					g.opts.Logger.Warn("mcp progress not sent", "request_id", r.ID, "err", err)
				}
			}
		}
		got, err := api.Get(ctx, r.ID, 0)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			g.opts.Logger.Warn("mcp read of a claimed request failed; retrying", "request_id", r.ID, "err", err)
		default:
			r = got
		}
	}
	return storedAnswer(name, r), nil
}

// storedAnswer is the answer of a call whose request another executor
// ran: the outcome it reported.
func storedAnswer(tool string, r *client.Request) *mcp.CallToolResult {
	out := ""
	if r.Result != nil {
		out = r.Result.Output
	}
	switch r.Status {
	case client.Executed:
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}
	case client.Failed:
		return refusal("%s", out)
	case client.Unknown:
		return refusal("The call to %s (request %s) was run by another executor whose outcome is unknown. It did not run again here.", tool, r.ID)
	}
	return refusal("%s", r.NotRun(tool))
}

// wait long-polls the request until it is final or ctx ends, sending a
// progress notification on every tick when the client asked for them.
func (g *Gateway) wait(ctx context.Context, session *mcp.ServerSession, token any, api API, r *client.Request, tool string) (*client.Request, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	final := make(chan *client.Request, 1)
	failed := make(chan error, 1)
	go func() { // exits when the request is final or ctx ends
		pause := 500 * time.Millisecond
		for {
			got, err := api.Get(ctx, r.ID, g.opts.PollWait)
			switch {
			case ctx.Err() != nil:
				failed <- ctx.Err()
				return
			case err == nil && got.Status.Final():
				final <- got
				return
			case err != nil:
				var apiErr *client.Error
				if errors.As(err, &apiErr) && apiErr.HTTPStatus < 500 && apiErr.Code != "rate_limited" {
					failed <- err
					return
				}
				g.opts.Logger.Warn("mcp long poll failed; retrying", "request_id", r.ID, "err", err)
				t := time.NewTimer(pause)
				select {
				case <-ctx.Done():
					t.Stop()
					failed <- ctx.Err()
					return
				case <-t.C:
				}
				pause = min(pause*2, 10*time.Second)
			default:
				pause = 500 * time.Millisecond
			}
		}
	}()
	ticks, stop := g.opts.Ticker(g.opts.ProgressEvery)
	defer stop()
	start := g.opts.Now()
	n := 0
	for {
		select {
		case got := <-final:
			return got, nil
		case err := <-failed:
			if ctx.Err() != nil {
				return nil, err
			}
			// The API refused the poll (key revoked…): answer the model.
			return &client.Request{ID: r.ID, Status: client.Unknown, Reason: apiMessage(err)}, nil
		case <-ticks:
			if token == nil || session == nil {
				continue
			}
			n++
			msg := fmt.Sprintf("waiting for a human approval in Slack: request %s (%s), %s so far", r.ID, tool, g.opts.Now().Sub(start).Round(time.Second))
			if err := session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}); err != nil {
				g.opts.Logger.Warn("mcp progress not sent", "request_id", r.ID, "err", err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// notRun is the answer of a call the gateway could not start upstream.
func notRun(tool, upstream string, err error) *mcp.CallToolResult {
	return refusal("%s did not run: the MCP upstream %s could not be reached for this session (%v). Try again later.", tool, upstream, err)
}

func refusal(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// apiMessage is an API error as a person reads it.
func apiMessage(err error) string {
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		s := apiErr.Message
		if apiErr.Field != "" {
			s += " (field " + apiErr.Field + ")"
		}
		return s
	}
	return err.Error()
}

// resultText is the text of a tool result, for the card's short summary.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d content item(s)", len(res.Content))
	}
	return strings.Join(parts, "\n")
}
