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

// setFieldScript sets one field of an existing record.
//
//	KEYS[1]   record
//	ARGV[1]   field
//	ARGV[2]   value
//
// Reply: 1 set, 0 no record.
var setFieldScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'rev', 1)
return 1
`)

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
//
//	KEYS[1]   scope
//	ARGV[1]   grant id
//
// Reply: 1 deleted, 0 not there.
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

// UseGrant counts one use of grant g by the call of request requestID,
// adding amount to the grant's total, in one script on the scope key, so
// that concurrent calls on any number of processes can never pass a limit
// (two calls never both take the last of a budget). It returns the grant as
// now used and true; false, with nothing counted, when the scope no longer
// holds g (expired, revoked, replaced) or a limit would be passed. A
// request already counted is answered as counted again without counting
// (a retried command, a resumed run). The granting request's copy is
// updated afterwards for its card (best effort: the scope key is the
// truth).
func (s *Store) UseGrant(ctx context.Context, g *approval.Grant, requestID string, amount float64) (*approval.Grant, bool, error) {
	scope := s.k.grant(g.Origin, g.Requester, g.Tool)
	res, err := useGrantScript.Run(ctx, s.rdb, []string{scope}, g.ID, requestID, strconv.FormatFloat(amount, 'f', -1, 64)).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("use grant %s: %w", g.ID, err)
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("use grant %s: unexpected reply %v", g.ID, res)
	}
	if ok, _ := res[0].(int64); ok != 1 {
		return nil, false, nil
	}
	raw, _ := res[1].(string)
	var used approval.Grant
	if err := json.Unmarshal([]byte(raw), &used); err != nil {
		return nil, false, fmt.Errorf("use grant %s: %w", g.ID, err)
	}
	if err := setFieldScript.Run(ctx, s.rdb, []string{s.k.request(g.RequestID)}, fGrant, raw).Err(); err != nil {
		s.log.WarnContext(ctx, "store: record grant use on its request", "grant_id", g.ID, "request_id", g.RequestID, "err", err)
	}
	return &used, true, nil
}

// useGrantScript counts a use of the grant a scope key holds.
//
//	KEYS[1]   scope
//	ARGV[1]   grant id
//	ARGV[2]   the using request's id
//	ARGV[3]   amount
//
// Reply: {1, grant JSON} counted (or already counted), {0, why} refused
// with nothing changed.
var useGrantScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return {0, 'gone'} end
local ok, g = pcall(cjson.decode, v)
if not ok or g.id ~= ARGV[1] then return {0, 'replaced'} end
if g.revoked_by and g.revoked_by ~= '' then return {0, 'revoked'} end
local uses = g.uses
if type(uses) ~= 'table' then uses = {} end
for _, id in ipairs(uses) do
  if id == ARGV[2] then return {1, v} end
end
local limits = g.limits
if type(limits) ~= 'table' then limits = {} end
local maxUses = tonumber(limits.max_uses) or 0
if maxUses > 0 and #uses + 1 > maxUses then return {0, 'uses'} end
local amount = tonumber(ARGV[3]) or 0
local spent = tonumber(g.spent) or 0
local maxTotal = tonumber(limits.max_total) or 0
if maxTotal > 0 and spent + amount > maxTotal + 1e-9 then return {0, 'total'} end
table.insert(uses, ARGV[2])
g.uses = uses
g.spent = spent + amount
local out = cjson.encode(g)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return {1, out}
`)
