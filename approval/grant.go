package approval

import "time"

// MaxPreauthorize is the longest pre-authorisation a policy may offer.
const MaxPreauthorize = 7 * 24 * time.Hour

// Grant is a scoped pre-authorisation: an approver, while approving one
// request, lets further calls of the same tool asked for by the same
// requester in the same task thread run without a card until Expires. It
// never covers a call whose effective quorum is above one, a call denied
// by policy, or a call its own grantor asked for (four-eyes).
type Grant struct {
	ID        string    `json:"id"`
	Tool      string    `json:"tool"`
	Requester string    `json:"requester"`
	Origin    Origin    `json:"origin"` // the task thread it covers
	GrantedBy string    `json:"granted_by"`
	RequestID string    `json:"request_id"` // the request approved with it
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	// RevokedBy and RevokedAt are set once someone revoked it.
	RevokedBy string    `json:"revoked_by,omitempty"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	// Limits bound what it lets through; Uses (the request ids of the
	// calls it let through) and Spent (their total of Limits.Argument)
	// are what it used, counted atomically by the store.
	Limits GrantLimits `json:"limits,omitzero"`
	Uses   []string    `json:"uses,omitempty"`
	Spent  float64     `json:"spent,omitempty"`
}

// GrantLimits bound a pre-authorisation beyond its duration: at most
// MaxUses calls, and at most MaxTotal in all of the numeric argument
// Argument (US$40 to the school, monthly). Zero values mean no limit.
type GrantLimits struct {
	MaxUses  int     `json:"max_uses,omitempty"`
	Argument string  `json:"argument,omitempty"`
	MaxTotal float64 `json:"max_total,omitempty"`
}

// Budgeted reports whether the limits bound a total.
func (l GrantLimits) Budgeted() bool { return l.Argument != "" && l.MaxTotal > 0 }

// UsesLeft is how many more calls g lets through, -1 for no limit.
func (g *Grant) UsesLeft() int {
	if g.Limits.MaxUses <= 0 {
		return -1
	}
	return max(g.Limits.MaxUses-len(g.Uses), 0)
}

// Active reports whether g covers calls at now.
func (g *Grant) Active(now time.Time) bool {
	return g != nil && g.RevokedBy == "" && now.Before(g.Expires)
}

// Covers reports whether g lets a call of tool, asked for by requester in
// the thread origin, with the given effective quorum, run without a card
// at now.
func (g *Grant) Covers(tool, requester string, origin Origin, quorum int, now time.Time) bool {
	return g.Active(now) && g.Tool == tool && g.Requester == requester &&
		g.Origin.Channel == origin.Channel && g.Origin.ThreadTS == origin.ThreadTS &&
		g.GrantedBy != requester && quorum <= 1
}
