package mcp

// PendingCalls is how many calls not yet answered the gateway remembers
// (their call ids): what its memory grows with.
func (g *Gateway) PendingCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending.len()
}
