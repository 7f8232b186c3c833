package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/clip"
)

// This file: resources/read and prompts/get, gated and audited through the
// API as calls of a pseudo-tool of their upstream.

// The pseudo-tools a resources/read and a prompts/get are asked for as:
// <upstream>__resources_read with arguments {"uri": …} and
// <upstream>__prompts_get with {"name": …, "arguments": {…}} (the
// upstream's own prompt name). The name carries the upstream's prefix
// whether or not the policy prefixes tools. A policy declares them as any
// tool (review: always to hold every read for a person); an API key lists
// them in its tools (or "*") to be allowed them.
const (
	ResourcesRead = "resources_read"
	PromptsGet    = "prompts_get"
)

// readHints are the hints a read is asked with: read-only, not
// destructive. They never loosen the policy (the external rule's review
// still holds); under an external rule that lets read-only tools through,
// reads pass without a person and are audited.
var readHints = func() *client.Annotations {
	yes, no := true, false
	return &client.Annotations{ReadOnly: &yes, Destructive: &no}
}()

var (
	resourceSchema = json.RawMessage(`{"type":"object","properties":{"uri":{"type":"string"}},"required":["uri"]}`)
	promptSchema   = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"arguments":{"type":"object","additionalProperties":{"type":"string"}}},"required":["name"]}`)
)

// readArgs and promptArgs are the pseudo-tools' arguments.
type readArgs struct {
	URI string `json:"uri"`
}

type promptArgs struct {
	Name      string            `json:"name"`
	Arguments map[string]string `json:"arguments,omitempty"`
}

// ReadCall is the call a resources/read of uri from the MCP server
// upstream is asked for as (the pseudo-tool <upstream>__resources_read,
// read-only hints, its schema): the one naming of reads, for the MCP
// gateway and for a gateway that checks MCP requests (agent/extauthz), so
// one policy rule covers a read whichever way it comes.
func ReadCall(upstream, uri string) client.Call {
	args, _ := json.Marshal(readArgs{URI: uri}) // a string field: cannot fail
	return client.Call{Tool: upstream + Separator + ResourcesRead, Arguments: args, Annotations: readHints, InputSchema: resourceSchema, Upstream: upstream}
}

// PromptCall is ReadCall for a prompts/get of the prompt name (the
// upstream's own name) with arguments: the pseudo-tool
// <upstream>__prompts_get.
func PromptCall(upstream, name string, arguments map[string]string) client.Call {
	args, _ := json.Marshal(promptArgs{Name: name, Arguments: arguments}) // strings only: cannot fail
	return client.Call{Tool: upstream + Separator + PromptsGet, Arguments: args, Annotations: readHints, InputSchema: promptSchema, Upstream: upstream}
}

// gatedRead is the handler of up's resources and resource templates.
func (g *Gateway) gatedRead(up *upstream) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		c := ReadCall(up.name, req.Params.URI)
		var res *mcp.ReadResourceResult
		err := g.passage(ctx, req.Session, req.Extra, req.Params.GetProgressToken(), up, ResourcesRead, c.Arguments, c.Annotations, c.InputSchema,
			func(ctx context.Context, cs *mcp.ClientSession, meta mcp.Meta, approved json.RawMessage) (string, error) {
				var a readArgs
				if err := json.Unmarshal(approved, &a); err != nil || a.URI == "" {
					return "", fmt.Errorf("the approved arguments name no uri: %s", approved)
				}
				params := *req.Params
				params.Meta, params.URI = meta, a.URI
				var err error
				res, err = cs.ReadResource(ctx, &params)
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("read %s: %d content item(s)", a.URI, len(res.Contents)), nil
			})
		return res, err
	}
}

// gatedPrompt is the handler of up's prompt name.
func (g *Gateway) gatedPrompt(up *upstream, name string) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		c := PromptCall(up.name, name, req.Params.Arguments)
		var res *mcp.GetPromptResult
		err := g.passage(ctx, req.Session, req.Extra, req.Params.GetProgressToken(), up, PromptsGet, c.Arguments, c.Annotations, c.InputSchema,
			func(ctx context.Context, cs *mcp.ClientSession, meta mcp.Meta, approved json.RawMessage) (string, error) {
				var a promptArgs
				if err := json.Unmarshal(approved, &a); err != nil || a.Name == "" {
					return "", fmt.Errorf("the approved arguments name no prompt: %s", approved)
				}
				params := *req.Params
				params.Meta, params.Name, params.Arguments = meta, a.Name, a.Arguments
				var err error
				res, err = cs.GetPrompt(ctx, &params)
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("prompt %s: %d message(s)", a.Name, len(res.Messages)), nil
			})
		return res, err
	}
}

// ErrRefused is why a resources/read or prompts/get got no content: the
// policy or a person refused it, or it could not be gated (the error says
// which, in words for the model).
var ErrRefused = errors.New("countersign refused")

// passage gates one request to up that is not a tool call (op:
// ResourcesRead, PromptsGet) through the API as a call of the pseudo-tool
// <upstream>__<op> with args, exactly as gated does a tool call: the
// request is judged and audited there, waits (with progress) while a
// person decides, and is claimed before fetch runs it once with the
// arguments as approved (and the _meta to send upstream: see begin);
// fetch's summary is reported as its result. A refusal is an error
// wrapping ErrRefused.
func (g *Gateway) passage(ctx context.Context, session *mcp.ServerSession, extra *mcp.RequestExtra, token any, up *upstream, op string,
	args json.RawMessage, hints *client.Annotations, schema json.RawMessage,
	fetch func(ctx context.Context, cs *mcp.ClientSession, meta mcp.Meta, approved json.RawMessage) (summary string, err error)) error {
	ctx, cancel := g.withPost(ctx, extra)
	defer cancel()
	name := up.name + Separator + op
	refused := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	if _, err := up.current(); err != nil {
		return refused("%s did not run: the MCP upstream %s is unavailable. Try again later.", name, up.name)
	}
	api := g.opts.API(g.key(extra))
	run := g.run(session)
	callKey, callID := g.callID(run, name, args)
	r, err := api.Request(ctx, client.Call{Tool: name, Arguments: args, RunID: run, CallID: callID, Annotations: hints, InputSchema: schema, Upstream: up.name})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		g.opts.Logger.Error("mcp read not gated", "tool", name, "err", err)
		g.done(callKey)
		return refused("Countersign refused %s: %s", name, apiMessage(err))
	}
	if !r.Status.Final() {
		release := g.hold(extra, r.ID, name)
		r, err = g.wait(ctx, session, token, api, r, name)
		release()
		if err != nil {
			return err // the client is gone: nothing is read
		}
	}
	g.done(callKey)
	switch {
	case r.ID != "" && ranElsewhere(r.Status):
		return refused("an identical request ran %s (request %s) and is %s; ask again", name, r.ID, r.Status)
	case r.Status != client.Approved:
		return refused("%s", r.NotRun(name))
	case ctx.Err() != nil:
		return ctx.Err()
	}
	// The session it runs on first: a read that cannot reach the upstream
	// is not claimed (nothing was read).
	l, cs, o, release, err := g.use(ctx, up, session, extra)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		g.opts.Logger.Error("mcp read not run: no upstream session", "request_id", r.ID, "tool", name, "upstream", up.name, "err", err)
		return refused("%s did not run: the MCP upstream %s could not be reached for this session (%v). Try again later.", name, up.name, err)
	}
	defer release()
	run1 := func(approved json.RawMessage) (string, error) {
		meta, end := g.begin(ctx, l, o, session, token)
		defer end()
		return fetch(ctx, cs, meta, approved)
	}
	if r.ID == "" {
		// Let through by the policy (audited there): nothing to claim.
		if _, err := run1(r.Arguments); err != nil {
			return fmt.Errorf("the upstream %s failed: %w", up.name, err)
		}
		return nil
	}
	claim, err := api.Claim(ctx, r.ID)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var apiErr *client.Error
		if errors.As(err, &apiErr) && apiErr.Request != nil {
			return refused("%s", apiErr.Request.NotRun(name))
		}
		return refused("Countersign refused to let %s run: %s. It did not run.", name, apiMessage(err))
	}
	summary, fetchErr := run1(claim.Request.Arguments)
	status := client.Executed
	if fetchErr != nil {
		status, summary = client.Failed, fetchErr.Error()
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), resultTimeout)
	if _, err := api.Result(rctx, r.ID, claim.Token, status, clip.Bytes(summary, 500)); err != nil {
		g.opts.Logger.Error("mcp result not reported", "request_id", r.ID, "tool", name, "err", err)
	}
	rcancel()
	if fetchErr != nil {
		return fmt.Errorf("the upstream %s failed: %w", up.name, fetchErr)
	}
	return nil
}

// resultTimeout bounds reporting an outcome, which happens even when the
// client has gone meanwhile (it ran).
const resultTimeout = 30 * time.Second

// withPost ties ctx to the HTTP request that brought an MCP request (see
// Handler): a client that goes away cancels it.
func (g *Gateway) withPost(ctx context.Context, extra *mcp.RequestExtra) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if extra == nil || extra.Header == nil {
		return ctx, cancel
	}
	post, ok := g.posts.Load(extra.Header.Get(callHeader))
	if !ok {
		return ctx, cancel
	}
	stop := context.AfterFunc(post.(context.Context), cancel)
	return ctx, func() { stop(); cancel() }
}

// run is the run id a session's calls are made with (a stdio session has
// no id: the gateway's own).
func (g *Gateway) run(session *mcp.ServerSession) string {
	if session != nil && session.ID() != "" {
		return "mcp_" + session.ID()
	}
	return g.runID
}
