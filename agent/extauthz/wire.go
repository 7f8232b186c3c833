package extauthz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
)

// This file: the two wire formats of Envoy's ext_authz, each translated
// into one decide and its Verdict back (answer).

// GRPCServer serves Check (envoy.service.auth.v3.Authorization) on one
// listener, in a goroutine of its own that exits when Stop is called.
type GRPCServer struct {
	g    *grpc.Server
	ln   net.Listener
	done chan struct{} // closed once Serve has returned
}

// ServeGRPC serves s's Check over gRPC on ln (opened by the process's
// server package) until Stop, with the other services register adds to
// the same server (agentgateway's ExtMcp, extmcp.Processor.Register); an
// error of serving is logged.
func (s *Service) ServeGRPC(ln net.Listener, register ...func(grpc.ServiceRegistrar)) *GRPCServer {
	// A pool of stream workers, one per CPU, answers the checks decided at
	// once (auto, refused) on goroutines whose stacks have grown already;
	// a check that waits for a person holds its worker, and gRPC answers
	// the next on a goroutine of its own, as without the pool.
	//
	// Fixed flow-control windows (checkWindow, per stream and per
	// connection) turn off gRPC's bandwidth estimation, which pings the
	// gateway as each check's body arrives: a check is small and the
	// gateway near, and each ping and its ack were a write to a socket
	// more per check (BenchmarkExtAuthzSerial: writes/check 6.2 -> 4.8,
	// reads/check 11.7 -> 9.0). A window holds twice MaxBody's default:
	// a check's body arrives in one go.
	g := grpc.NewServer(grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(checkWindow), grpc.InitialConnWindowSize(checkWindow))
	authv3.RegisterAuthorizationServer(g, grpcCheck{s: s})
	for _, r := range register {
		r(g)
	}
	gs := &GRPCServer{g: g, ln: ln, done: make(chan struct{})}
	go func() { // exits when Stop stops g
		defer close(gs.done)
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.opts.Logger.Error("ext_authz gRPC server stopped", "err", err)
		}
	}()
	return gs
}

// checkWindow is the gRPC server's flow-control window (ServeGRPC),
// per stream and per connection: twice DefaultMaxBody.
const checkWindow = 2 * DefaultMaxBody

// Addr is the address the server listens on.
func (gs *GRPCServer) Addr() string { return gs.ln.Addr().String() }

// Stop closes the listener and every connection (held checks end: close
// the Service first to answer them) and waits for Serve to return.
func (gs *GRPCServer) Stop() {
	gs.g.Stop()
	<-gs.done
}

type grpcCheck struct {
	authv3.UnimplementedAuthorizationServer
	s *Service
}

// Check answers one of Envoy's checks. The body is the attributes' body,
// or raw_body when Envoy packs it as bytes; Envoy lower-cases header
// names and marks a cut body with x-envoy-auth-partial-body.
func (g grpcCheck) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	// The check is decided in frames that have returned before a held
	// one is awaited, here: the handler's stack stays as shallow as it
	// is while a person decides.
	v, h, trace := g.s.decideGRPC(ctx, req)
	if h != nil {
		h.await()
	}
	return checkResponse(g.s.answer(ctx, v, h, trace)), nil
}

// decideGRPC begins deciding a gRPC check (Service.decide): its verdict,
// or the held check to await; trace is the gateway's request id.
func (s *Service) decideGRPC(ctx context.Context, req *authv3.CheckRequest) (Verdict, *heldCheck, string) {
	h := req.GetAttributes().GetRequest().GetHttp()
	headers := make(map[string]string, len(h.GetHeaders()))
	for k, v := range h.GetHeaders() {
		headers[strings.ToLower(k)] = v
	}
	for _, hv := range h.GetHeaderMap().GetHeaders() {
		v := hv.GetValue()
		if v == "" {
			v = string(hv.GetRawValue())
		}
		headers[strings.ToLower(hv.GetKey())] = v
	}
	body := h.GetRawBody()
	if len(body) == 0 {
		body = []byte(h.GetBody())
	}
	size := h.GetSize()
	if size <= 0 {
		size = -1
	}
	// The gateway's timeout arrives as the call's deadline: the check
	// is answered before it (Begin).
	ext := req.GetAttributes().GetContextExtensions()
	check := Check{Headers: headers, Body: body, Size: size, Partial: headers["x-envoy-auth-partial-body"] == "true",
		Route: ext["route"], Server: ext["mcp_server"]}
	check.Caller, check.CallerBad = grpcCaller(headers[HeaderCaller], req.GetAttributes().GetMetadataContext().GetFilterMetadata()[JWTFilter])
	v, held := s.decide(ctx, check)
	return v, held, headers["x-request-id"]
}

// checkResponse is the gRPC answer of verdict v.
func checkResponse(v Verdict) *authv3.CheckResponse {
	if v.Allow {
		return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{Headers: headerOptions(v.Headers)}}}
	}
	code := codes.PermissionDenied
	if v.Status == http.StatusUnauthorized {
		code = codes.Unauthenticated
	}
	return &authv3.CheckResponse{Status: &rpcstatus.Status{Code: int32(code), Message: http.StatusText(v.Status)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(v.Status)}, Headers: headerOptions(v.Headers), Body: string(v.Body)}}}
}

// JWTFilter is the filter metadata namespace of Envoy's JWT filter: with
// payload_in_metadata set, a verified token's payload is there under that
// name (one entry per provider that verified one).
const JWTFilter = "envoy.filters.http.jwt_authn"

// CallerClaims are the claims of a verified JWT's payload that name its
// caller, in order: the first present is the identity.
var CallerClaims = []string{"email", "sub"}

// grpcCaller is the caller's identity of a gRPC check: the claim of the
// payloads the JWT filter verified (CallerClaims) and the caller header
// the gateway set, which must agree when both are there. why says what
// makes them unusable: a payload whose claim is not a string, two that
// disagree, a header that disagrees with the token.
func grpcCaller(header string, jwt *structpb.Struct) (id, why string) {
	for _, name := range slices.Sorted(maps.Keys(jwt.GetFields())) {
		payload := jwt.GetFields()[name].GetStructValue()
		if payload == nil {
			return "", fmt.Sprintf("the JWT filter's metadata %s is not a token's payload", name)
		}
		var claim string
		for _, c := range CallerClaims {
			v, ok := payload.GetFields()[c]
			if !ok {
				continue
			}
			s, isString := v.GetKind().(*structpb.Value_StringValue)
			if !isString || s.StringValue == "" {
				return "", fmt.Sprintf("the token's %s claim (%s) is not a name", c, name)
			}
			claim = s.StringValue
			break
		}
		switch {
		case claim == "":
			return "", fmt.Sprintf("the token (%s) has no %s claim", name, strings.Join(CallerClaims, " or "))
		case id != "" && id != claim:
			return "", fmt.Sprintf("two tokens name two callers, %q and %q", id, claim)
		}
		id = claim
	}
	switch {
	case id == "":
		return header, ""
	case header != "" && header != id:
		return "", fmt.Sprintf("the caller header %s says %q, the token %q", HeaderCaller, header, id)
	}
	return id, ""
}

func headerOptions(h map[string]string) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for _, k := range slices.Sorted(maps.Keys(h)) {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: h[k]},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	return out
}

// HTTP is the handler of Envoy's HTTP ext_authz (http_service): the check
// request carries the client's headers and body (with_request_body); a
// 200 allows, anything else is the denial the gateway returns to the
// client as it is.
func (s *Service) HTTP() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// As Check: the check is decided in frames that have returned
		// before a held one is awaited, here, so that the connection's
		// goroutine keeps the stack it had before (BenchmarkExtAuthzHTTPHeld).
		ctx, cancel, v, h := s.decideHTTP(w, r)
		defer cancel()
		if ctx == nil {
			return // answered: the body could not be read
		}
		if h != nil {
			h.await()
		}
		writeVerdict(w, s.answer(ctx, v, h, r.Header.Get("X-Request-Id")))
	})
}

// decideHTTP begins deciding an HTTP check (Service.decide): its verdict,
// or the held check to await, in ctx, which ends when the check may be
// held no longer (cancel releases it). A nil ctx: w was answered, the
// body could not be read.
func (s *Service) decideHTTP(w http.ResponseWriter, r *http.Request) (context.Context, context.CancelFunc, Verdict, *heldCheck) {
	headers := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		headers[strings.ToLower(k)] = strings.Join(v, ",")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.opts.MaxBody)+1))
	if err != nil {
		http.Error(w, "reading the checked body: "+err.Error(), http.StatusBadRequest)
		return nil, func() {}, Verdict{}, nil
	}
	// A held check outlives the server's write timeout: the gateway's
	// timeout, or MaxHold, ends it.
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.MaxHold)
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.opts.MaxHold + 10*time.Second)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.opts.Logger.Warn("ext_authz: held check keeps the server's write timeout", "err", err)
	}
	v, h := s.decide(ctx, Check{Headers: headers, Body: body, Size: r.ContentLength, Partial: headers["x-envoy-auth-partial-body"] == "true",
		Caller: headers[HeaderCaller], Route: headers[HeaderRoute], Server: headers[HeaderServer]})
	return ctx, cancel, v, h
}

// writeVerdict writes the HTTP answer of verdict v.
func writeVerdict(w http.ResponseWriter, v Verdict) {
	for k, val := range v.Headers {
		w.Header().Set(k, val)
	}
	if v.Allow {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(v.Status)
	_, _ = w.Write(v.Body)
}
