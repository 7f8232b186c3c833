package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
)

// Pre-authorisations (approval.Grant). The scope key (keys.grant) is what
// the agent looks up; the request the grant was given with keeps a copy
// (field grant) so its card can show it and offer to revoke it. The two
// live in different hash slots, so they are written one after the other:
// the scope key first, since it is what lets calls through.

// errGrantExpired is returned by PutGrant for a grant already over.
var errGrantExpired = errors.New("grant already expired")

// PutGrant saves g for its scope (tool, requester, task thread) until
// g.Expires, replacing an earlier grant of the same scope, and records it
// on the request it was given with (approval.ErrNotFound when that request
// is gone; the grant is then withdrawn).
func (s *Store) PutGrant(ctx context.Context, g *approval.Grant) error {
	ttl := g.Expires.Sub(s.now())
	if ttl <= 0 {
		return fmt.Errorf("put grant %s: %w", g.ID, errGrantExpired)
	}
	b, err := json.Marshal(g)
	if err != nil {
		return fmt.Errorf("put grant %s: %w", g.ID, err)
	}
	scope := s.k.grant(g.Origin, g.Requester, g.Tool)
	if err := s.rdb.Set(ctx, scope, b, ttl).Err(); err != nil {
		return fmt.Errorf("put grant %s: %w", g.ID, err)
	}
	n, err := setFieldScript.Run(ctx, s.rdb, []string{s.k.request(g.RequestID)}, fGrant, b).Int()
	if err == nil && n == 0 {
		err = approval.ErrNotFound
		_ = dropGrantScript.Run(ctx, s.rdb, []string{scope}, g.ID).Err()
	}
	if err != nil {
		return fmt.Errorf("put grant %s on request %s: %w", g.ID, g.RequestID, err)
	}
	// The listing index is a convenience: a failure leaves the grant in
	// force and only missing from ActiveGrants.
	if err := s.rdb.ZAdd(ctx, s.k.grants(), redis.Z{Score: float64(g.Expires.UnixMilli()), Member: g.RequestID}).Err(); err != nil {
		s.log.WarnContext(ctx, "store: index grant", "grant_id", g.ID, "request_id", g.RequestID, "err", err)
	}
	return nil
}

// ActiveGrants lists the grants in force at the store's clock (not
// expired, not revoked, not replaced by a newer grant of their scope),
// soonest to expire first. Expired index entries are dropped.
func (s *Store) ActiveGrants(ctx context.Context) ([]*approval.Grant, error) {
	now := s.now()
	key := s.k.grants()
	if err := s.rdb.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(now.UnixMilli(), 10)).Err(); err != nil {
		return nil, fmt.Errorf("active grants: %w", err)
	}
	ids, err := s.rdb.ZRange(ctx, key, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("active grants: %w", err)
	}
	rs, err := s.load(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("active grants: %w", err)
	}
	var out []*approval.Grant
	for _, r := range rs {
		if r == nil || !r.Grant.Active(now) {
			continue
		}
		cur, err := s.ActiveGrant(ctx, r.Grant.Tool, r.Grant.Requester, r.Grant.Origin)
		if err != nil {
			return nil, fmt.Errorf("active grants: %w", err)
		}
		if cur != nil && cur.ID == r.Grant.ID {
			out = append(out, r.Grant)
		}
	}
	return out, nil
}

// ActiveGrant returns the grant of the scope (tool, requester, task thread
// origin) when one is active at the store's clock, nil otherwise.
func (s *Store) ActiveGrant(ctx context.Context, tool, requester string, origin approval.Origin) (*approval.Grant, error) {
	v, err := s.rdb.Get(ctx, s.k.grant(origin, requester, tool)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("active grant %s %s: %w", requester, tool, err)
	}
	var g approval.Grant
	if err := json.Unmarshal([]byte(v), &g); err != nil {
		return nil, fmt.Errorf("active grant %s %s: %w", requester, tool, err)
	}
	if !g.Active(s.now()) {
		return nil, nil
	}
	return &g, nil
}

// RevokeGrant ends the grant given with request requestID: its scope stops
// letting calls through (unless a newer grant replaced it there) and the
// request's copy records who revoked it and when. It returns the revoked
// grant; approval.ErrNotFound when the request carries no grant grantID.
// Revoking twice keeps the first revocation.
func (s *Store) RevokeGrant(ctx context.Context, requestID, grantID, by string) (*approval.Grant, error) {
	r, err := s.Request(ctx, requestID)
	if err != nil {
		return nil, fmt.Errorf("revoke grant %s: %w", grantID, err)
	}
	g := r.Grant
	if g == nil || g.ID != grantID {
		return nil, fmt.Errorf("revoke grant %s of request %s: %w", grantID, requestID, approval.ErrNotFound)
	}
	if err := dropGrantScript.Run(ctx, s.rdb, []string{s.k.grant(g.Origin, g.Requester, g.Tool)}, g.ID).Err(); err != nil {
		return nil, fmt.Errorf("revoke grant %s: %w", grantID, err)
	}
	if g.RevokedBy != "" {
		return g, nil
	}
	g.RevokedBy, g.RevokedAt = by, s.now()
	b, err := json.Marshal(g)
	if err != nil {
		return nil, fmt.Errorf("revoke grant %s: %w", grantID, err)
	}
	if err := setFieldScript.Run(ctx, s.rdb, []string{s.k.request(requestID)}, fGrant, b).Err(); err != nil {
		return nil, fmt.Errorf("revoke grant %s: record on request: %w", grantID, err)
	}
	return g, nil
}

// dropGrantScript deletes a scope key only while it holds the given grant,
// so revoking an old grant never ends a newer one.
// KEYS[1] scope. ARGV[1] grant id. Reply: 1 deleted, 0 not there.
var dropGrantScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, g = pcall(cjson.decode, v)
if ok and g.id == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)
