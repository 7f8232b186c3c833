package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Size reports the audit stream's length (XLEN) and the memory Redis uses
// for it (MEMORY USAGE, which estimates a large stream from a sample of
// its nodes), in one round trip: what the metrics export
// (metrics.RegisterAuditStream). A stream not created yet is 0 and 0.
func (a *Audit) Size(ctx context.Context) (entries, bytes int64, err error) {
	var n, mem *redis.IntCmd
	_, err = a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		n = p.XLen(ctx, a.stream)
		mem = p.MemoryUsage(ctx, a.stream)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("audit stream size: %w", err)
	}
	return n.Val(), mem.Val(), nil
}
