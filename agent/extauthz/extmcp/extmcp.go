// Package extmcp is Countersign as agentgateway's MCP processor: the
// ExtMcp protocol (agentgateway.dev.ext_mcp.ExtMcp, its mcpGuardrails
// policy with a remote processor). agentgateway asks CheckRequest with an
// MCP call's method, its JSON-RPC params and the client's headers, before
// the call reaches the upstream server; a tools/call, resources/read or
// prompts/get is gated by the same core as Envoy's ext_authz
// (extauthz.Service.Begin: the /v1 API, a person's decision, the claim),
// and answered pass, mutated (the params with an approver's edit: the
// claim binds those arguments) or error (who decided and why). Everything
// else passes.
//
// CheckResponse sees the upstream's result and records it as the claimed
// request's outcome, as Countersign's own MCP gateway does; the gateway
// carries the claim from one hook to the other in its request metadata
// (docs/gateways.md "agentgateway").
package extmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/agent/extauthz"
	pb "github.com/countersign/countersign/agent/extauthz/extmcp/extmcppb"
	"github.com/countersign/countersign/agent/mcp"
	"github.com/countersign/countersign/approval/clip"
)

// MetadataKey is the key of McpRequest.metadata_context (the gateway's
// processor metadata, a CEL expression) and of McpRequestResult.metadata
// that carries a claimed call from CheckRequest to CheckResponse. The
// gateway is configured with
//
//	countersign: 'default(mcpGuardrails.countersign, "")'
//
// so that CheckRequest sees "" (its presence says CheckResponse will
// come, so the outcome is left for it) and CheckResponse sees the value
// CheckRequest returned: the request id and its claim token.
const MetadataKey = "countersign"

// AuthorizationKey is the metadata_context key CheckResponse reads the
// caller's Authorization header from (the response hook gets no headers):
// authorization: 'request.headers["authorization"]'.
const AuthorizationKey = "authorization"

// Processor answers ExtMcp's CheckRequest and CheckResponse. It is safe
// for concurrent use.
type Processor struct {
	pb.UnimplementedExtMcpServer
	s   *extauthz.Service
	log *slog.Logger
}

// New returns a Processor gating through s (its limits, its /v1 clients;
// s.Close ends held checks). log may be nil.
func New(s *extauthz.Service, log *slog.Logger) *Processor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Processor{s: s, log: log}
}

// Register adds the ExtMcp service to g: pass it to
// extauthz.Service.ServeGRPC, so that both protocols share one listener.
func (p *Processor) Register(g grpc.ServiceRegistrar) { pb.RegisterExtMcpServer(g, p) }

// call is one gated McpRequest: what the API is asked, and how the
// approved arguments go back into the params.
type call struct {
	gate   extauthz.Call
	params map[string]json.RawMessage
	// apply puts approved arguments into params (an edit).
	apply func(params map[string]json.RawMessage, approved json.RawMessage) error
}

// CheckRequest answers one MCP request agentgateway is about to send
// upstream. It returns an error only when the request cannot be read as
// agentgateway sends it; a refusal is an AuthorizationError result.
//
// The call is asked in frames that have returned before it is awaited,
// here (begin, then Gating.Await): while a person decides, the handler's
// stack holds this frame and the wait's, not the reading of the request.
func (p *Processor) CheckRequest(ctx context.Context, req *pb.McpRequest) (*pb.McpRequestResult, error) {
	h, res := p.begin(ctx, req)
	if h == nil {
		return res, nil
	}
	return p.answer(ctx, req, h, h.gating.Await()), nil
}

// heldRequest is a call CheckRequest began (begin) and awaits.
type heldRequest struct {
	gating extauthz.Gating
	c      call
}

// begin reads req and asks for its call; a request that needs no asking
// (not a call, or refused as read) is answered at once (res).
func (p *Processor) begin(ctx context.Context, req *pb.McpRequest) (h *heldRequest, res *pb.McpRequestResult) {
	method := req.GetMethod()
	switch method {
	case "tools/call", "resources/read", "prompts/get":
	default:
		return nil, pass(nil, nil) // lists, initialize, completion…: nothing runs
	}
	raw := req.GetMcpRequest()
	if len(raw) > p.s.MaxBody() {
		return nil, p.refuse(req, extauthz.Gated{Status: http.StatusRequestEntityTooLarge,
			Text: fmt.Sprintf("Countersign refused the %s: its params are over %d bytes, the most it checks. It did not run.", method, p.s.MaxBody())})
	}
	if len(req.GetServiceNames()) != 1 {
		return nil, p.refuse(req, extauthz.Gated{Status: http.StatusBadRequest,
			Text: fmt.Sprintf("Countersign refused the %s: it names %d MCP services, want exactly one. It did not run.", method, len(req.GetServiceNames()))})
	}
	auth, err := header(req.GetHeaders(), "authorization")
	if err != nil {
		return nil, p.refuse(req, extauthz.Gated{Status: http.StatusUnauthorized, Text: "Countersign refused the " + method + ": " + err.Error() + ". It did not run."})
	}
	session, err := header(req.GetHeaders(), "mcp-session-id")
	if err != nil {
		return nil, p.refuse(req, extauthz.Gated{Status: http.StatusBadRequest, Text: "Countersign refused the " + method + ": " + err.Error() + ". It did not run."})
	}
	c, err := readCall(method, req.GetServiceNames()[0], raw)
	if err != nil {
		return nil, p.refuse(req, extauthz.Gated{Status: http.StatusBadRequest, Text: "Countersign refused the " + method + ": " + err.Error() + ". It did not run."})
	}
	c.gate.Key = extauthz.Bearer(auth)
	c.gate.RunID = session
	// The same session, service, method and params are the same call: a
	// gateway's retry or a resent request finds the same request.
	c.gate.CallID = extauthz.CallID("extmcp-", []byte(session), []byte(req.GetServiceNames()[0]), []byte(method), compact(raw))
	return &heldRequest{gating: p.s.Begin(ctx, c.gate), c: c}, nil
}

// answer is the result of h, whose call was awaited (g).
func (p *Processor) answer(ctx context.Context, req *pb.McpRequest, h *heldRequest, g extauthz.Gated) *pb.McpRequestResult {
	c := h.c
	if !g.Pass {
		return p.refuse(req, g)
	}
	var mutated []byte
	if g.Edited {
		err := c.apply(c.params, g.Arguments)
		if err == nil {
			mutated, err = json.Marshal(c.params)
		}
		if err != nil || mutated == nil {
			// Claimed, and cannot be sent as approved: it does not run.
			p.s.Report(ctx, c.gate.Key, g, client.Failed, "not run: the approved arguments could not be applied to the MCP params")
			return p.refuse(req, extauthz.Gated{Status: http.StatusInternalServerError, RequestID: g.RequestID,
				Text: fmt.Sprintf("Countersign could not apply the approved arguments of %s (request %s). It did not run.", c.gate.Tool, g.RequestID)})
		}
	}
	var meta *structpb.Struct
	if g.RequestID != "" {
		if _, later := req.GetMetadataContext().GetFields()[MetadataKey]; later {
			// CheckResponse records the outcome: carry the claim there.
			meta = &structpb.Struct{Fields: map[string]*structpb.Value{MetadataKey: structpb.NewStringValue(g.RequestID + " " + g.Token)}}
		} else {
			p.s.Report(ctx, c.gate.Key, g, client.Executed, "let through by the gateway (agentgateway ExtMcp); its answer is not seen by Countersign (no response hook)")
		}
	}
	res := pass(headerMutation(g.RequestID), meta)
	if mutated != nil {
		res.Result = &pb.McpRequestResult_Mutated{Mutated: mutated}
	}
	return res
}

// CheckResponse records the upstream's answer to a call CheckRequest
// claimed (carried in metadata_context, see MetadataKey) as its outcome:
// a tool's result with isError is failed, any other executed. The answer
// always passes unchanged. agentgateway does not call it for a JSON-RPC
// error answer: that request stays executing (docs/gateways.md).
func (p *Processor) CheckResponse(ctx context.Context, resp *pb.McpResponse) (*pb.McpResponseResult, error) {
	ok := &pb.McpResponseResult{Result: &pb.McpResponseResult_Pass{Pass: &pb.Pass{}}}
	fields := resp.GetMetadataContext().GetFields()
	id, token, found := strings.Cut(fields[MetadataKey].GetStringValue(), " ")
	if !found {
		return ok, nil // nothing claimed: passed by the policy, or not gated
	}
	key := extauthz.Bearer(fields[AuthorizationKey].GetStringValue())
	if key == "" {
		p.log.Warn("ExtMcp response not recorded: no authorization in metadata_context", "request_id", id, "method", resp.GetMethod())
		return ok, nil
	}
	status, summary := outcome(resp.GetMethod(), resp.GetMcpResponse())
	p.s.Report(ctx, key, extauthz.Gated{RequestID: id, Token: token}, status, clip.Bytes(summary, 500))
	return ok, nil
}

// outcome reads an upstream's result: a tool's isError is failed; the
// summary is its text content, or what came back.
func outcome(method string, raw []byte) (client.Status, string) {
	var r struct {
		IsError bool `json:"isError"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Contents []json.RawMessage `json:"contents"` // resources/read
		Messages []json.RawMessage `json:"messages"` // prompts/get
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return client.Executed, "the upstream's result is not JSON: " + err.Error()
	}
	status := client.Executed
	if r.IsError {
		status = client.Failed
	}
	switch method {
	case "resources/read":
		return status, fmt.Sprintf("read: %d content item(s)", len(r.Contents))
	case "prompts/get":
		return status, fmt.Sprintf("prompt: %d message(s)", len(r.Messages))
	}
	var texts []string
	for _, c := range r.Content {
		if c.Type == "text" {
			texts = append(texts, c.Text)
		}
	}
	if len(texts) == 0 {
		return status, fmt.Sprintf("%d content item(s)", len(r.Content))
	}
	return status, strings.Join(texts, "\n")
}

// readCall reads the params of a gated method of service.
func readCall(method, service string, raw []byte) (call, error) {
	if len(raw) == 0 {
		return call{}, errors.New("it has no params")
	}
	cp, err := extauthz.ReadCall(raw) // exact keys, none twice
	if err != nil {
		return call{}, fmt.Errorf("its params are not valid (%v)", err)
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(raw, &params); err != nil {
		return call{}, fmt.Errorf("its params are not valid (%v)", err)
	}
	c := call{params: params, gate: extauthz.Call{Edits: true}}
	c.gate.Upstream = service
	switch method {
	case "tools/call":
		if cp.Name == "" {
			return c, errors.New("tools/call needs params.name")
		}
		args, err := extauthz.Arguments(cp.Arguments)
		if err != nil {
			return c, err
		}
		c.gate.Tool, c.gate.Arguments, c.gate.Reason = cp.Name, args, cp.Reason
		c.apply = func(p map[string]json.RawMessage, approved json.RawMessage) error {
			p["arguments"] = approved
			return nil
		}
	case "resources/read":
		// By exact key, as the upstream reads it ("URI" is another key).
		uri, err := extauthz.ReadResource(raw)
		if err != nil || uri == "" {
			return c, errors.New("resources/read needs params.uri")
		}
		// Named as Countersign's MCP gateway names a read, so one policy
		// rule covers it whichever way it comes.
		c.gate.Call = mcp.ReadCall(service, uri)
		c.apply = func(p map[string]json.RawMessage, approved json.RawMessage) error {
			uri, err := extauthz.ReadResource(approved)
			if err != nil || uri == "" {
				return errors.New("no uri")
			}
			p["uri"], _ = json.Marshal(uri)
			return nil
		}
	case "prompts/get":
		name, args, err := extauthz.ReadPrompt(raw) // by exact key, as the upstream reads it
		if err != nil || name == "" {
			return c, errors.New("prompts/get needs params.name, and its arguments as strings")
		}
		c.gate.Call = mcp.PromptCall(service, name, args)
		c.apply = func(p map[string]json.RawMessage, approved json.RawMessage) error {
			var b map[string]json.RawMessage
			if err := json.Unmarshal(approved, &b); err != nil || len(b["name"]) == 0 {
				return errors.New("no name")
			}
			p["name"] = b["name"]
			delete(p, "arguments")
			if a, ok := b["arguments"]; ok {
				p["arguments"] = a
			}
			return nil
		}
	}
	return c, nil
}

// header is the one value of the request header name (agentgateway sends
// names lower-cased, one entry per value): "" when absent; two values are
// refused (which one the upstream reads is not ours to guess).
func header(hs []*pb.McpHeader, name string) (string, error) {
	var v []byte
	n := 0
	for _, h := range hs {
		if strings.EqualFold(h.GetKey(), name) {
			v, n = h.GetValue(), n+1
		}
	}
	if n > 1 {
		return "", fmt.Errorf("the %s header is sent %d times", name, n)
	}
	return string(v), nil
}

// compact is raw without insignificant space and with its keys sorted
// (the same params however spaced are the same call); numbers keep their
// digits (two amounts that differ past float64's precision stay two
// calls).
func compact(raw []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return raw
	}
	out, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return out
}

func pass(hm *pb.HeaderMutation, meta *structpb.Struct) *pb.McpRequestResult {
	return &pb.McpRequestResult{Result: &pb.McpRequestResult_Pass{Pass: &pb.Pass{}}, HeaderMutation: hm, Metadata: meta}
}

// headerMutation adds the request id to the upstream's request, as the
// ext_authz answer does.
func headerMutation(id string) *pb.HeaderMutation {
	if id == "" {
		return nil
	}
	return &pb.HeaderMutation{Set: []*pb.McpHeader{{Key: extauthz.HeaderRequestID, Value: []byte(id)}}}
}

// refuse is the error result of a call that does not pass: agentgateway
// answers the client with a JSON-RPC error whose message is the reason
// and whose data is mcp_error.
func (p *Processor) refuse(req *pb.McpRequest, g extauthz.Gated) *pb.McpRequestResult {
	code := pb.AuthorizationError_PERMISSION_DENIED // -32001
	switch g.Status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		code = pb.AuthorizationError_INVALID // -32600
	case http.StatusTooManyRequests:
		code = pb.AuthorizationError_RESOURCE_EXHAUSTED // -32003
	}
	data, _ := json.Marshal(struct {
		RequestID  string `json:"countersign_request_id,omitempty"`
		Status     int    `json:"http_status"`
		RetryAfter int    `json:"retry_after_seconds,omitempty"`
	}{g.RequestID, g.Status, int(g.RetryAfter.Seconds())})
	p.log.Info("ExtMcp check denied", "method", req.GetMethod(), "service", strings.Join(req.GetServiceNames(), ","), "request_id", g.RequestID, "status", g.Status)
	return &pb.McpRequestResult{Result: &pb.McpRequestResult_Error{Error: &pb.AuthorizationError{Code: code, Reason: g.Text, McpError: data}}}
}
