package store

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Embedded is an in-process Redis (miniredis): the demo's Redis when no
// REDIS_URL is given, and the tests'. It is the one place miniredis is
// started.
type Embedded struct {
	mr *miniredis.Miniredis
}

// StartEmbedded starts an in-process Redis on a free local port.
func StartEmbedded() (*Embedded, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	return &Embedded{mr: mr}, nil
}

// Addr is the host:port it listens on.
func (e *Embedded) Addr() string { return e.mr.Addr() }

// URL is its redis:// URL, as REDIS_URL would give it.
func (e *Embedded) URL() string { return "redis://" + e.mr.Addr() }

// Client is a new client of it; the caller closes it.
func (e *Embedded) Client() Client { return redis.NewClient(&redis.Options{Addr: e.mr.Addr()}) }

// Close stops it; its data is gone.
func (e *Embedded) Close() error {
	e.mr.Close()
	return nil
}
