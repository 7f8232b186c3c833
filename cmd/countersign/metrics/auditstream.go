package metrics

import (
	"context"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// auditStream exports, from one read of the audit stream's size per
// scrape, countersign_audit_stream_entries and
// countersign_audit_stream_bytes: the stream is kept for ever unless an
// operator trims it, and with the documented noeviction a full Redis
// refuses every write, approvals included. Both read NaN when the store
// cannot be read.
type auditStream struct {
	size    func(ctx context.Context) (entries, bytes int64, err error)
	timeout time.Duration
	entries *prometheus.Desc
	bytes   *prometheus.Desc
}

// RegisterAuditStream registers the audit stream's size gauges on reg;
// size reports the stream's entries and the bytes Redis uses for it
// (store.Audit.Size). A scrape waits at most timeout for it.
func RegisterAuditStream(reg prometheus.Registerer, size func(ctx context.Context) (entries, bytes int64, err error), timeout time.Duration) {
	reg.MustRegister(&auditStream{size: size, timeout: timeout,
		entries: prometheus.NewDesc("countersign_audit_stream_entries",
			"Entries in the audit stream (NaN when the store could not be read).", nil, nil),
		bytes: prometheus.NewDesc("countersign_audit_stream_bytes",
			"Memory Redis uses for the audit stream, in bytes (MEMORY USAGE: an estimate on a large stream; NaN when the store could not be read).", nil, nil),
	})
}

// Describe sends the two descriptors.
func (a *auditStream) Describe(ch chan<- *prometheus.Desc) {
	ch <- a.entries
	ch <- a.bytes
}

// Collect reads the stream's size once.
func (a *auditStream) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	entries, bytes, err := a.size(ctx)
	e, b := float64(entries), float64(bytes)
	if err != nil {
		e, b = math.NaN(), math.NaN()
	}
	ch <- prometheus.MustNewConstMetric(a.entries, prometheus.GaugeValue, e)
	ch <- prometheus.MustNewConstMetric(a.bytes, prometheus.GaugeValue, b)
}
