package auditweb

// LoginSources is how many sources h's login throttle remembers.
func LoginSources(h *Handler) int { return h.logins.size() }
