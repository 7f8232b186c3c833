package server

import "net/http"

// The paths the process serves on its one port (docs/deploy.md). The
// handlers mounted there route below their path themselves.
const (
	PathLive       = "/healthz"        // liveness: the process serves HTTP
	PathReady      = "/readyz"         // readiness: Redis and Slack answer
	PathMetrics    = "/metrics"        // Prometheus, unless on its own port
	PathSlack      = "/slack/"         // Slack's events and interactivity (HTTP mode)
	PathAPI        = "/v1/"            // the HTTP API for other agents
	PathHumanLayer = "/humanlayer/v1/" // the HumanLayer SDKs' shapes of the API (api.HumanLayerPrefix)
	PathMCP        = "/mcp"            // the MCP gateway over streamable HTTP
	PathAudit      = "/audit/"         // the read-only audit view (auditweb)
	PathHooks      = "/hooks/"         // agents' http hooks: Claude Code's (hook.PathHTTP)
	PathExtAuthz   = "/ext_authz/"     // Envoy's HTTP ext_authz (http_service, path_prefix /ext_authz)
	// OpenID AuthZEN: the evaluation and access request endpoints, and
	// their discovery document (authzen.PathAccess, PathDiscovery).
	PathAuthZEN          = "/access/v1/"
	PathAuthZENDiscovery = "/.well-known/authzen-configuration"
	PathStepUp           = "/stepup/" // the step-up page: passkey confirmations of votes and enrollments (stepup)
)

// Routes are the handlers of one process, built by cmd/countersign; a nil
// handler is not mounted (Slack in Socket Mode, MCP without upstreams, the
// audit view unless COUNTERSIGN_AUDIT_VIEW, /metrics on a port of its own).
type Routes struct {
	Live, Ready http.Handler
	Metrics     http.Handler
	Slack       http.Handler
	API         http.Handler
	HumanLayer  http.Handler
	MCP         http.Handler
	Audit       http.Handler
	Hooks       http.Handler
	ExtAuthz    http.Handler
	AuthZEN     http.Handler // PathAuthZEN and PathAuthZENDiscovery
	StepUp      http.Handler
}

// Mux is the one place where the process's paths are mounted: what
// Server.Ready serves once the process is ready.
func Mux(r Routes) *http.ServeMux {
	mux := http.NewServeMux()
	for _, m := range []struct {
		pattern string
		h       http.Handler
	}{
		{"GET " + PathLive, r.Live},
		{"GET " + PathReady, r.Ready},
		{"GET " + PathMetrics, r.Metrics},
		{PathSlack, r.Slack},
		{PathAPI, r.API},
		{PathHumanLayer, r.HumanLayer},
		{PathMCP, r.MCP},
		{PathAudit, r.Audit},
		{PathHooks, r.Hooks},
		{PathExtAuthz, r.ExtAuthz},
		{PathAuthZEN, r.AuthZEN},
		{"GET " + PathAuthZENDiscovery, r.AuthZEN},
		{PathStepUp, r.StepUp},
	} {
		if m.h != nil {
			mux.Handle(m.pattern, m.h)
		}
	}
	return mux
}

// MetricsOnly is the handler of the metrics port (COUNTERSIGN_METRICS_ADDR):
// /metrics and nothing else; the probes stay on the main port, which they
// must show answers.
func MetricsOnly(metrics http.Handler) *http.ServeMux {
	return Mux(Routes{Metrics: metrics})
}
