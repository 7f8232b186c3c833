package storetest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// TripCounter is a go-redis hook that counts the round trips a client
// makes: one per command sent alone, one per pipeline. Add it with
// AddHook; N is the count so far.
type TripCounter struct{ N atomic.Int64 }

// DialHook is part of redis.Hook.
func (c *TripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook is part of redis.Hook.
func (c *TripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.N.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook is part of redis.Hook.
func (c *TripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.N.Add(1)
		return next(ctx, cmds)
	}
}
