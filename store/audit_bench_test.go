package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// benchRecord is a typical "decided" entry: ids, an actor and a few
// hundred bytes of data with one secret argument to redact.
var benchRecord = approval.Record{
	Event:     approval.EventDecided,
	RequestID: "req_4nq2w7c5ajxk3p0r6s8t1v9yzm",
	RunID:     "run_b8d1f0h3j5k7m9n2p4q6r8s0tu",
	Actor:     "U024BE7LH",
	Tool:      "refund",
	Secret:    []string{"api_key"},
	Data: map[string]any{
		"verdict": "approve",
		"digest":  "9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c0b2d4f6e8a0c2e4f6a8b0d2f4e6a8c0b",
		"args":    json.RawMessage(`{"order_id":"1234","amount":"64.00","currency":"EUR","api_key":"live-5f2a"}`),
		"note":    "approved after checking the order in the shop",
	},
}

// BenchmarkAuditAppend measures appends per second: one writer; eight
// goroutines sharing one Audit (one process); eight Audit values (as if
// eight processes, contending through the Lua compare-and-set). Set
// REDIS_URL to measure real Redis; otherwise it measures miniredis.
func BenchmarkAuditAppend(b *testing.B) {
	b.Run("writers=1", func(b *testing.B) {
		rdb, stream := auditRedis(b)
		a := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := a.Append(ctx, benchRecord); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
	})
	for _, shared := range []bool{true, false} {
		name := "writers=8/one-audit"
		if !shared {
			name = "writers=8/eight-audits"
		}
		b.Run(name, func(b *testing.B) {
			rdb, stream := auditRedis(b)
			one := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
			ctx := context.Background()
			// RunParallel starts parallelism × GOMAXPROCS goroutines.
			b.SetParallelism((8 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				a := one
				if !shared {
					a = store.NewAudit(rdb, store.AuditOptions{Stream: stream})
				}
				for pb.Next() {
					if _, err := a.Append(ctx, benchRecord); err != nil {
						panic(fmt.Sprintf("Append: %v", err)) // b.Fatal must not be called from RunParallel goroutines
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
		})
	}
}

// BenchmarkAuditVerify measures verifying a 10,000-entry chain.
func BenchmarkAuditVerify(b *testing.B) {
	const n = 10000
	rdb, stream := auditRedis(b)
	a := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
	ctx := context.Background()
	for range n {
		if _, err := a.Append(ctx, benchRecord); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if got, err := a.Verify(ctx); err != nil || got != n {
			b.Fatalf("Verify = %d, %v", got, err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
}
