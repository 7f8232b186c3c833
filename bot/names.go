package bot

// This file: the names people read for Slack ids (users, channels, user
// groups), for pages outside Slack such as the audit view.

import (
	"cmp"
	"context"
	"regexp"
	"sync"
	"time"

	"github.com/slack-go/slack"
)

const (
	// nameTTL is how long a name found is trusted.
	nameTTL = time.Hour
	// nameMissTTL is how long an id Slack does not name (or a failed
	// lookup) is shown as the id before Slack is asked again.
	nameMissTTL = time.Minute
	// nameTimeout bounds one lookup: a page waits at most this per id it
	// has not seen.
	nameTimeout = 2 * time.Second
)

// Slack id shapes: users (U…, W… on Enterprise Grid), channels (C…, G…
// private, D… direct), user groups (S…). Anything else ("system", a
// process name) is never looked up.
var (
	userIDShape    = regexp.MustCompile(`^[UW][A-Z0-9]{2,}$`)
	channelIDShape = regexp.MustCompile(`^[CGD][A-Z0-9]{2,}$`)
	groupIDShape   = regexp.MustCompile(`^S[A-Z0-9]{2,}$`)
)

// names caches what Slack calls ids.
type names struct {
	mu      sync.Mutex // guards entries
	entries map[string]nameEntry
}

type nameEntry struct {
	name string // "" when Slack did not name it
	at   time.Time
}

// Name returns what people call a Slack id: a user's real name (else
// display name, else handle), "#channel", or "@handle" of a user group.
// It returns "" for an id Slack does not know, one that is not a Slack id,
// or when Slack cannot be asked now; callers then show the id. Answers
// are cached (an hour; a miss for a minute), and one lookup takes at most
// two seconds, so a page costs at most one call per id it has not shown
// recently. It needs the users:read, channels:read, groups:read and
// usergroups:read scopes.
func (b *Bot) Name(ctx context.Context, id string) string {
	var load func(context.Context) (string, error)
	switch {
	case userIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			u, err := b.directory.GetUserInfoContext(ctx, id)
			if err != nil {
				return "", err
			}
			return cmp.Or(u.RealName, cmp.Or(u.Profile.DisplayName, u.Name)), nil
		}
	case channelIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			c, err := b.directory.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: id})
			if err != nil || c.Name == "" {
				return "", err
			}
			return "#" + c.Name, nil
		}
	case groupIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			gs, err := b.directory.GetUserGroupsContext(ctx)
			if err != nil {
				return "", err
			}
			for _, g := range gs {
				if g.ID == id {
					return "@" + cmp.Or(g.Handle, g.Name), nil
				}
			}
			return "", nil
		}
	default:
		return ""
	}
	now := b.now()
	b.names.mu.Lock()
	e, ok := b.names.entries[id]
	b.names.mu.Unlock()
	if ok && !now.Before(e.at) && (e.name != "" && now.Sub(e.at) < nameTTL || e.name == "" && now.Sub(e.at) < nameMissTTL) {
		return e.name
	}
	lctx, cancel := context.WithTimeout(ctx, nameTimeout)
	defer cancel()
	name, err := load(lctx)
	if err != nil {
		b.log.DebugContext(ctx, "name lookup failed; showing the id", "id", id, "err", err)
		name = ""
	}
	b.names.mu.Lock()
	b.names.entries[id] = nameEntry{name: name, at: now}
	b.names.mu.Unlock()
	return name
}
