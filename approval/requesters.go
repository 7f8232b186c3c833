package approval

import "slices"

// Askers are everyone who counts as having asked for r, in the order they
// asked: r.Requesters when they name r.Requester (the agent's runs: every
// author in the task thread since the run began), else r.Requester
// followed by r.Requesters. Four-eyes refuses each of them (Authorize).
func (r *Request) Askers() []string {
	switch {
	case len(r.Requesters) == 0 && r.Requester == "":
		return nil
	case len(r.Requesters) == 0:
		return []string{r.Requester}
	case r.Requester == "" || slices.Contains(r.Requesters, r.Requester):
		return slices.Clone(r.Requesters)
	}
	return append([]string{r.Requester}, r.Requesters...)
}

// AskedBy reports whether user counts as having asked for r: r.Requester
// or one of r.Requesters. An empty user asked for nothing.
func (r *Request) AskedBy(user string) bool {
	return user != "" && (user == r.Requester || slices.Contains(r.Requesters, user))
}

// multiple is askers when they are more than one person, else nil (the
// requester alone is said by Requester).
func multiple(askers []string) []string {
	if len(askers) < 2 {
		return nil
	}
	return askers
}
