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
