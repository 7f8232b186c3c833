package store_test

import (
	"context"
	"crypto/ed25519"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/store"
)

// BenchmarkAuditVerifyCheckpoints measures `audit verify --pubkey
// --checkpoints` over 100,000 entries covered by 100 checkpoints (the
// default 1,000 entries each): every checkpoint's signature and chain,
// then every entry re-hashed and matched. docs/performance.md has the
// figure and its command.
func BenchmarkAuditVerifyCheckpoints(b *testing.B) {
	const n = 100_000
	rdb, stream := auditRedis(b)
	if testing.Short() {
		b.Skip("100,000 appends")
	}
	a := store.NewAudit(rdb, store.AuditOptions{Stream: stream})
	ctx := context.Background()
	for range n {
		if _, err := a.Append(ctx, benchRecord); err != nil {
			b.Fatal(err)
		}
	}
	pub, key, _ := ed25519.GenerateKey(nil)
	w := &memWitness{}
	cpr := store.NewCheckpointer(a, store.CheckpointOptions{Key: key, Witnesses: []store.Witness{w}})
	if _, _, err := cpr.Checkpoint(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rdb.Del(context.Background(), stream+":head:checkpoint").Err() })
	cps := w.all()
	b.ReportAllocs()
	var peak uint64
	for b.Loop() {
		if ok, err := auditreport.VerifyCheckpointed(ctx, a, io.Discard, auditreport.Proof{Stream: stream, PubKey: pub, Checkpoints: cps,
			Bound: approval.CheckpointBound(store.DefaultCheckpointInterval), Now: time.Now()}, false); !ok || err != nil {
			b.Fatalf("VerifyCheckpointed = %v, %v", ok, err)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(len(cps)), "checkpoints")
	b.ReportMetric(float64(peak)/(1<<20), "MB-heap-inuse")
}
