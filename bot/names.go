package bot

// This file: the names people read for Slack ids (users, channels, user
// groups), for pages outside Slack such as the audit view.

import (
	"cmp"
	"context"
	"log/slog"
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

// Names looks up what people call Slack ids, cached. A Bot has one
// (Bot.Name); `countersign audit` makes its own over a client with the bot
// token (NewNames), so the CLI prints the names the audit view shows.
type Names struct {
	directory Directory
	now       func() time.Time
	log       *slog.Logger

	mu      sync.Mutex // guards entries
	entries map[string]nameEntry
}

type nameEntry struct {
	name string // "" when Slack did not name it
	at   time.Time
}

// NewNames looks names up in d (users.info, conversations.info,
// usergroups.list); now and log may be nil (time.Now, discard).
func NewNames(d Directory, now func() time.Time, log *slog.Logger) *Names {
	if now == nil {
		now = time.Now
	}
	return &Names{directory: d, now: now, log: cmp.Or(log, slog.New(slog.DiscardHandler)), entries: map[string]nameEntry{}}
}

// Email returns a Slack user's profile email, asked of Slack each time
// (never cached: it decides whose login at the identity provider counts,
// so a changed email counts at once); "" when the profile shows none. It
// needs the users:read.email scope.
func (n *Names) Email(ctx context.Context, id string) (string, error) {
	if !userIDShape.MatchString(id) {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, nameTimeout)
	defer cancel()
	u, err := n.directory.GetUserInfoContext(ctx, id)
	if err != nil {
		return "", err
	}
	return u.Profile.Email, nil
}

// Name returns what people call a Slack id: a user's real name (else
// display name, else handle), "#channel", or "@handle" of a user group.
// It returns "" for an id Slack does not know, one that is not a Slack id,
// or when Slack cannot be asked now; callers then show the id. Answers
// are cached (an hour; a miss for a minute), and one lookup takes at most
// two seconds, so a page costs at most one call per id it has not shown
// recently. It needs the users:read, channels:read, groups:read and
// usergroups:read scopes.
func (n *Names) Name(ctx context.Context, id string) string {
	var load func(context.Context) (string, error)
	switch {
	case userIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			u, err := n.directory.GetUserInfoContext(ctx, id)
			if err != nil {
				return "", err
			}
			return cmp.Or(u.RealName, cmp.Or(u.Profile.DisplayName, u.Name)), nil
		}
	case channelIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			c, err := n.directory.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: id})
			if err != nil || c.Name == "" {
				return "", err
			}
			return "#" + c.Name, nil
		}
	case groupIDShape.MatchString(id):
		load = func(ctx context.Context) (string, error) {
			gs, err := n.directory.GetUserGroupsContext(ctx)
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
	now := n.now()
	n.mu.Lock()
	e, ok := n.entries[id]
	n.mu.Unlock()
	if ok && !now.Before(e.at) && (e.name != "" && now.Sub(e.at) < nameTTL || e.name == "" && now.Sub(e.at) < nameMissTTL) {
		return e.name
	}
	lctx, cancel := context.WithTimeout(ctx, nameTimeout)
	defer cancel()
	name, err := load(lctx)
	if err != nil {
		n.log.DebugContext(ctx, "name lookup failed; showing the id", "id", id, "err", err)
		name = ""
	}
	n.mu.Lock()
	n.entries[id] = nameEntry{name: name, at: now}
	n.mu.Unlock()
	return name
}

// Directory is what access checks (channel members, usergroups) and names
// (Bot.Name, for pages outside Slack) read.
type Directory interface {
	GetUsersInConversationContext(ctx context.Context, params *slack.GetUsersInConversationParameters) ([]string, string, error)
	GetUserGroupMembersContext(ctx context.Context, userGroup string, options ...slack.GetUserGroupMembersOption) ([]string, error)
	GetUserInfoContext(ctx context.Context, user string, options ...slack.GetUserInfoOption) (*slack.User, error)
	GetConversationInfoContext(ctx context.Context, input *slack.GetConversationInfoInput) (*slack.Channel, error)
	GetUserGroupsContext(ctx context.Context, options ...slack.GetUserGroupsOption) ([]slack.UserGroup, error)
}
