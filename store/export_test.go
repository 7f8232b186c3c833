package store

// HubHooks lets tests watch the wake hub instead of sleeping. Set them with
// SetHubHooks right after New, before the first Wait.
type HubHooks struct {
	// Registered is called after a waiter for id is registered.
	Registered func(id string)
	// Round is called by hub goroutine shard before each BLPOP with the
	// number of keys it blocks on.
	Round func(shard, keys int)
	// RecheckRounds overrides how many rounds pass between full re-reads.
	RecheckRounds int
	// Poll makes the hub poll records as it does for a Cluster client.
	Poll bool
}

// SetHubHooks installs test hooks on s's wake hub.
func SetHubHooks(s *Store, h HubHooks) {
	s.hub.hooks.registered = h.Registered
	s.hub.hooks.recheck = h.RecheckRounds
	if h.Poll {
		s.hub.poll = true
	}
	if h.Round != nil {
		idx := map[*shard]int{}
		for i, sh := range s.hub.shards {
			idx[sh] = i
		}
		s.hub.hooks.round = func(sh *shard, keys int) { h.Round(idx[sh], keys) }
	}
}
