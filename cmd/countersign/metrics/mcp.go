package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterMCPUpstreams registers countersign_mcp_upstreams_unavailable on
// reg: how many of the MCP gateway's upstreams are down now (they failed
// to start or stopped, and are being tried again), read from unavailable
// at each scrape. 0 when the process runs no gateway.
func RegisterMCPUpstreams(reg prometheus.Registerer, unavailable func() int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "countersign_mcp_upstreams_unavailable",
		Help: "MCP upstreams of the gateway that are down (failed to start or stopped; retried with backoff); their tools answer unavailable."},
		func() float64 { return float64(unavailable()) }))
}
