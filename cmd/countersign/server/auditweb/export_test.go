package auditweb

import "net/http"

// LoginSources is how many sources h's login throttle remembers.
func LoginSources(h *Handler) int { return h.logins.size() }

// LimitLoginSources makes h's login throttle remember at most n sources
// (instead of 10,000), so a test reaches the bound with a few.
func LimitLoginSources(h *Handler, n int) { h.logins.max = n }

// LoginSource is the source r's failed logins are counted under.
func LoginSource(h *Handler, r *http.Request) string { return loginSource(r, h.opts.TrustedProxies) }
