package store

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// deploymentSecretSize is the length of a deployment's secret in bytes.
const deploymentSecretSize = 32

// database is the database number rdb works in: the one channel names are
// scoped to (keys.channel). A Cluster has only database 0.
func database(rdb redis.UniversalClient) int {
	if c, ok := rdb.(*redis.Client); ok { // a single node or Sentinel
		return c.Options().DB
	}
	return 0
}

// secretScript returns the deployment's secret, setting it first when
// there is none: the first process of a deployment creates it, every
// later one (and every replica racing it) reads the same bytes.
//
//	KEYS[1]   the secret's key
//	ARGV[1]   fresh random bytes, used only when the key is absent
//
// Reply: the secret.
var secretScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
`)

// Secret returns the deployment's secret: 32 random bytes kept in Redis
// under the deployment's prefix (in its database), created once,
// atomically, by whichever process asks first, and never expiring. Every
// process of the deployment gets the same bytes; another deployment on
// the same server (another database or prefix) has its own. The HTTP API
// keys request ids with it (api.Options.IDSecret), so a caller's call id
// names a request no other deployment can compute.
//
// Losing it (Redis lost its data, or an eviction policy other than the
// documented noeviction dropped it) gives the deployment a new one: call
// ids sent before map to other request ids, as the requests themselves
// were lost with the data.
func (s *Store) Secret(ctx context.Context) ([]byte, error) {
	fresh := make([]byte, deploymentSecretSize)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("deployment secret: %w", err)
	}
	v, err := secretScript.Run(ctx, s.rdb, []string{s.k.deployment()}, fresh).Text()
	if err != nil {
		return nil, fmt.Errorf("deployment secret: %w", err)
	}
	if len(v) < deploymentSecretSize/2 {
		return nil, fmt.Errorf("deployment secret: %s holds %d bytes, want %d", s.k.deployment(), len(v), deploymentSecretSize)
	}
	return []byte(v), nil
}
