package bot

// This file: `countersign check --slack`, the policy file's Slack ids and
// names looked up in the workspace with the bot token: a name gets the id
// to write in its place, an id is checked to name someone (or a channel
// the bot is in).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/policyfile"
)

// Lookups is what CheckSlack asks of Slack: the workspace's members,
// conversations and user groups, and single users and conversations.
// *slack.Client provides it. Errors are Slack's (slack.SlackErrorResponse
// for an "ok": false answer).
type Lookups interface {
	GetUsersContext(ctx context.Context, options ...slack.GetUsersOption) ([]slack.User, error)
	GetConversationsContext(ctx context.Context, params *slack.GetConversationsParameters) ([]slack.Channel, string, error)
	GetUserGroupsContext(ctx context.Context, options ...slack.GetUserGroupsOption) ([]slack.UserGroup, error)
	GetUserInfoContext(ctx context.Context, user string, options ...slack.GetUserInfoOption) (*slack.User, error)
	GetConversationInfoContext(ctx context.Context, input *slack.GetConversationInfoInput) (*slack.Channel, error)
}

var _ Lookups = (*slack.Client)(nil)

// SlackFinding is what the workspace says of one Slack id or name a
// policy file gives.
type SlackFinding struct {
	Ref policyfile.SlackRef
	// ID is the id: the one written when Slack knows it, or the one a
	// name was found to have; "" when Slack has none.
	ID string
	// Name is what Slack calls it: "Alice Archer", "#ops", "@sre".
	Name string
	// Problem says why the file does not work as written ("" when it
	// does): a name where the id belongs, an id Slack does not know, a
	// channel the bot is not in.
	Problem string
}

// OK reports whether the file works as written at this key.
func (f SlackFinding) OK() bool { return f.Problem == "" }

// String is the finding as one line: "path: what Slack says". Names
// come from Slack, where anyone may set their own: control characters
// are shown escaped (auditreport.Clean), never sent to the terminal.
func (f SlackFinding) String() string {
	name := auditreport.Clean(f.Name, 80)
	what := fmt.Sprintf("%s is %s", f.Ref.Value, name)
	switch {
	case f.ID == "":
		what = fmt.Sprintf("%q", f.Ref.Value)
	case !f.Ref.IsID():
		what = fmt.Sprintf("%q is %s (%s)", f.Ref.Value, f.ID, name)
	}
	if f.OK() {
		return fmt.Sprintf("%s: %s: ok", f.Ref.Path, what)
	}
	return fmt.Sprintf("%s: %s: %s", f.Ref.Path, what, f.Problem)
}

// CheckSlack looks every ref up in the workspace s reaches and says, in
// refs' order, what Slack calls it and what is wrong: a name (@sre,
// #ops, alice) gets the id to write in its place, or the people or
// channels it could be; an id Slack does not know, a deactivated user, a
// channel the bot is not in (it would never see a mention there, nor post
// a card) are problems. Workspace ids (allowed_teams) are not looked up:
// the bot token sees only its own workspace.
//
// It needs the scopes manifest.yml grants: users:read (users.info,
// users.list), channels:read and groups:read (conversations.info,
// conversations.list), usergroups:read (usergroups.list). It returns an
// error when Slack cannot be asked: a bad token, a scope the app lacks
// (missing_scope, naming it), a rate limit.
func CheckSlack(ctx context.Context, s Lookups, refs []policyfile.SlackRef) ([]SlackFinding, error) {
	c := &slackChecker{s: s}
	out := make([]SlackFinding, 0, len(refs))
	for _, r := range refs {
		f := SlackFinding{Ref: r}
		var err error
		switch r.Kind {
		case policyfile.SlackUser:
			err = c.user(ctx, &f)
		case policyfile.SlackUsergroup:
			err = c.usergroup(ctx, &f)
		case policyfile.SlackChannel, policyfile.SlackApprovals:
			err = c.channel(ctx, &f)
		default:
			f.Problem = "not looked up (a workspace id: Slack's address app.slack.com/client/T…/ shows yours)"
			if r.IsID() {
				f.ID, f.Name, f.Problem = r.Value, "a workspace id", ""
			}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// WriteSlackFindings writes one line per finding and reports whether the
// file works as written at every one.
func WriteSlackFindings(w io.Writer, fs []SlackFinding) (ok bool, err error) {
	ok = true
	for _, f := range fs {
		ok = ok && f.OK()
		if _, err := fmt.Fprintln(w, f); err != nil {
			return false, err
		}
	}
	return ok, nil
}

// slackChecker is one CheckSlack: the workspace's listings, each read once.
type slackChecker struct {
	s        Lookups
	users    []slack.User
	groups   []slack.UserGroup
	channels []slack.Channel
	listed   map[string]bool // listings read
}

// slackRefused is err as a reason the check could not be made: the
// method, Slack's error and, for a missing scope, the scope.
func slackRefused(method string, err error) error {
	if se, ok := errors.AsType[slack.SlackErrorResponse](err); ok && se.Err == "missing_scope" {
		return fmt.Errorf("%s: Slack answered missing_scope: the app lacks the %s scope (manifest.yml grants it: add it in the app's OAuth & Permissions, then reinstall the app)", method, se.Needed)
	}
	if rl, ok := errors.AsType[*slack.RateLimitedError](err); ok {
		return fmt.Errorf("%s: rate limited by Slack: try again in %s", method, rl.RetryAfter)
	}
	return fmt.Errorf("%s: %w", method, err)
}

// slackError is Slack's error code in err ("user_not_found"), "" for any
// other failure.
func slackError(err error) string {
	se, _ := errors.AsType[slack.SlackErrorResponse](err)
	return se.Err
}

func (c *slackChecker) once(name string, load func() error) error {
	if c.listed[name] {
		return nil
	}
	if err := load(); err != nil {
		return slackRefused(name, err)
	}
	if c.listed == nil {
		c.listed = map[string]bool{}
	}
	c.listed[name] = true
	return nil
}

// userName is what people call u.
func userName(u slack.User) string {
	for _, n := range []string{u.RealName, u.Profile.RealName, u.Profile.DisplayName, u.Name} {
		if n != "" {
			return n
		}
	}
	return u.ID
}

func (c *slackChecker) user(ctx context.Context, f *SlackFinding) error {
	if f.Ref.IsID() {
		u, err := c.s.GetUserInfoContext(ctx, f.Ref.Value)
		switch code := slackError(err); {
		case code == "user_not_found":
			f.Problem = "Slack knows no such user in this workspace"
			return nil
		case err != nil:
			return slackRefused("users.info", err)
		}
		f.ID, f.Name = u.ID, userName(*u)
		switch {
		case u.Deleted:
			f.Problem = "deactivated in Slack: they can no longer decide"
		case u.IsBot:
			f.Problem = "a bot, not a person: a bot never clicks a card"
		}
		return nil
	}
	if err := c.once("users.list", func() (err error) { c.users, err = c.s.GetUsersContext(ctx); return err }); err != nil {
		return err
	}
	want := strings.ToLower(f.Ref.Name())
	var found []slack.User
	for _, u := range c.users {
		if u.Deleted || u.IsBot {
			continue
		}
		for _, n := range []string{u.Name, u.RealName, u.Profile.DisplayName, u.Profile.RealName} {
			if n != "" && strings.ToLower(n) == want {
				found = append(found, u)
				break
			}
		}
	}
	switch len(found) {
	case 0:
		f.Problem = "no member of the workspace has this name: write their user id (profile → ⋮ More → Copy member ID)"
	case 1:
		f.ID, f.Name = found[0].ID, userName(found[0])
		f.Problem = "write " + f.ID
	default:
		var who []string
		for _, u := range found {
			who = append(who, fmt.Sprintf("%s (%s)", u.ID, userName(u)))
		}
		f.Problem = fmt.Sprintf("%d people have this name: %s; write the id of the one you mean", len(found), strings.Join(who, ", "))
	}
	return nil
}

func (c *slackChecker) usergroup(ctx context.Context, f *SlackFinding) error {
	if err := c.once("usergroups.list", func() (err error) {
		c.groups, err = c.s.GetUserGroupsContext(ctx, slack.GetUserGroupsOptionIncludeDisabled(true))
		return err
	}); err != nil {
		return err
	}
	want := strings.ToLower(f.Ref.Name())
	for _, g := range c.groups {
		match := g.ID == f.Ref.Value
		if !f.Ref.IsID() {
			match = strings.ToLower(g.Handle) == want || strings.ToLower(g.Name) == want
		}
		if !match {
			continue
		}
		f.ID, f.Name = g.ID, "@"+g.Handle
		if g.Name != "" && g.Name != g.Handle {
			f.Name += " (" + g.Name + ")"
		}
		switch {
		case g.DateDelete != 0:
			f.Problem = "disabled in Slack: it has no members to decide"
		case !f.Ref.IsID():
			f.Problem = "write " + f.ID
		}
		return nil
	}
	f.Problem = "Slack knows no such user group in this workspace"
	if !f.Ref.IsID() {
		f.Problem = "no user group has this handle or name (usergroups.list)"
	}
	return nil
}

func (c *slackChecker) channel(ctx context.Context, f *SlackFinding) error {
	var ch *slack.Channel
	if f.Ref.IsID() {
		info, err := c.s.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: f.Ref.Value})
		switch code := slackError(err); {
		case code == "channel_not_found":
			f.Problem = "Slack shows the bot no such channel: a private channel is shown only once the bot is in it (/invite @countersign there), else the id is wrong"
			return nil
		case err != nil:
			return slackRefused("conversations.info", err)
		}
		ch = info
	} else {
		if err := c.once("conversations.list", func() error { return c.listChannels(ctx) }); err != nil {
			return err
		}
		want := strings.ToLower(f.Ref.Name())
		for i := range c.channels {
			if strings.ToLower(c.channels[i].Name) == want {
				ch = &c.channels[i]
				break
			}
		}
		if ch == nil {
			f.Problem = "no channel of this name that the bot can see: a private channel is listed only once the bot is in it (/invite @countersign there)"
			return nil
		}
	}
	f.ID, f.Name = ch.ID, "#"+ch.Name
	if ch.IsIM {
		f.Name = "a direct message"
	}
	var problems []string
	if !f.Ref.IsID() {
		problems = append(problems, "write "+f.ID)
	}
	switch {
	case ch.IsIM && f.Ref.Kind == policyfile.SlackApprovals:
		problems = append(problems, "a direct message cannot be the approvals channel")
	case ch.IsArchived:
		problems = append(problems, "archived: nothing can be posted there")
	case !ch.IsMember && !ch.IsIM:
		problems = append(problems, "the bot is not in it: /invite @countersign there")
	}
	f.Problem = strings.Join(problems, "; ")
	return nil
}

// listChannels reads every public channel and every private channel the
// bot is in, page by page.
func (c *slackChecker) listChannels(ctx context.Context) error {
	p := &slack.GetConversationsParameters{Types: []string{"public_channel", "private_channel"}, Limit: 200, ExcludeArchived: true}
	for {
		chs, next, err := c.s.GetConversationsContext(ctx, p)
		if err != nil {
			return err
		}
		c.channels = append(c.channels, chs...)
		if next == "" {
			return nil
		}
		p.Cursor = next
	}
}
