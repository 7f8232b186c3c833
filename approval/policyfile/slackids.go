package policyfile

// This file: the Slack ids a policy file names. Slack takes ids where the
// file names people, groups, channels and workspaces: a name or handle
// (@sre, #ops, alice) never matches anything, so every approver click
// would be refused or no task channel would ever start a run. Each is
// checked for its shape where it is read, the error saying how to find
// the id; SlackRefs lists them all for `countersign check --slack`, which
// looks names up and ids over with the bot token (bot.CheckSlack).

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// SlackKind is what a Slack id in a policy file names.
type SlackKind string

// The kinds of Slack ids a policy file gives.
const (
	// SlackUser is a user id: U…, or W… on Enterprise Grid
	// (approvers.users, escalate_to.users, api.keys[].slack_user).
	SlackUser SlackKind = "user"
	// SlackUsergroup is a user group id: S… (approvers.usergroups,
	// escalate_to.usergroups).
	SlackUsergroup SlackKind = "usergroup"
	// SlackChannel is a conversation id: C… public, G… private, D… a
	// direct message (slack.task_channels).
	SlackChannel SlackKind = "channel"
	// SlackApprovals is the approvals channel's id: C… or G…, where cards
	// are posted (slack.approvals_channel).
	SlackApprovals SlackKind = "approvals channel"
	// SlackTeam is a workspace id: T… (slack.allowed_teams).
	SlackTeam SlackKind = "workspace"
)

// SlackRef is one Slack id a policy file gives, or what was written where
// an id belongs.
type SlackRef struct {
	// Path is the key path (tools[1].approvers.usergroups[0]) and Line its
	// line in the file.
	Path string
	Line int
	Kind SlackKind
	// Value is what the file says, as written.
	Value string
}

// IsID reports whether Value has the shape of an id of its kind.
func (r SlackRef) IsID() bool { return slackIDShape[r.Kind].MatchString(r.Value) }

// Name is Value as a name to look up: without the @ of a handle or the #
// of a channel name, "" when Value is an id.
func (r SlackRef) Name() string {
	if r.IsID() {
		return ""
	}
	return strings.TrimLeft(strings.TrimSpace(r.Value), "@#")
}

// slackIDShape is the shape of each kind's ids: a capital letter saying
// the kind, then capitals and digits. Slack's handles and channel names
// are lower case, so a name never has an id's shape.
var slackIDShape = map[SlackKind]*regexp.Regexp{
	SlackUser:      regexp.MustCompile(`^[UW][A-Z0-9]+$`),
	SlackUsergroup: regexp.MustCompile(`^S[A-Z0-9]+$`),
	SlackChannel:   regexp.MustCompile(`^[CGD][A-Z0-9]+$`),
	SlackApprovals: channelID,
	SlackTeam:      regexp.MustCompile(`^T[A-Z0-9]+$`),
}

// HowToFind says where to find an id of kind k, for a person who wrote a
// name instead.
func (k SlackKind) HowToFind() string {
	const lookUp = "; or run countersign check --slack with SLACK_BOT_TOKEN set: it looks names up and prints their ids"
	switch k {
	case SlackUser:
		return "a user id starts with U (W on Enterprise Grid), e.g. U0123ABCD: in Slack, open the person's profile, then ⋮ (More) → Copy member ID" + lookUp
	case SlackUsergroup:
		return "a usergroup id starts with S, e.g. S0123ABCD, and is not its @handle: Slack's usergroups.list (Web API, usergroups:read) gives each group's id beside its handle" + lookUp
	case SlackChannel, SlackApprovals:
		return "in Slack, click the channel's name: its Channel ID (C… public, G… private) is at the bottom of About" + lookUp
	case SlackTeam:
		return "a workspace id starts with T, e.g. T0123ABCD: in a browser, Slack's address app.slack.com/client/T…/… shows it after /client/"
	}
	return ""
}

// slackID records the Slack id at path and reports one that is not an id
// of its kind.
func (d *decoder) slackID(n *yaml.Node, path string, kind SlackKind, value string) {
	ref := SlackRef{Path: path, Line: n.Line, Kind: kind, Value: value}
	d.refs = append(d.refs, ref)
	switch {
	case ref.IsID():
	case kind == SlackApprovals:
		d.errorf(n, path, "%q is not a channel id: Slack posts only to an id like C0123456789 (public) or G0123456789 (private), not a name; %s", value, kind.HowToFind())
	case kind == SlackChannel:
		d.errorf(n, path, "%q is not a channel id (C…, G… or D…): Slack names a channel by its id, never by its name; %s", value, kind.HowToFind())
	default:
		d.errorf(n, path, "must be a Slack %s id, got %q: Slack matches ids, never names or handles; %s", kind, value, kind.HowToFind())
	}
	if !ref.IsID() {
		d.badIDs++
	}
}

// slackIDs decodes a list of Slack ids of one kind.
func (d *decoder) slackIDs(n *yaml.Node, path string, kind SlackKind) []string {
	out := d.strings(n, path)
	if n.Kind != yaml.SequenceNode {
		return out
	}
	for i, item := range n.Content {
		if item = resolve(item); item.Kind == yaml.ScalarNode && strings.TrimSpace(item.Value) != "" {
			d.slackID(item, index(path, i), kind, item.Value)
		}
	}
	return out
}

// SlackRefs reads the Slack ids a policy file gives (and the names
// written where ids belong), in file order, whether or not the file is
// otherwise valid: `countersign check --slack` looks them up. It fails
// only when the file is not YAML.
func SlackRefs(data []byte) ([]SlackRef, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, ErrorList{syntaxError(data, err)}
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, nil
	}
	d := &decoder{}
	d.file(root.Content[0])
	refs := slices.Clone(d.refs)
	slices.SortStableFunc(refs, func(a, b SlackRef) int { return a.Line - b.Line })
	return refs, nil
}

// String is "path: value" for messages.
func (r SlackRef) String() string { return fmt.Sprintf("%s: %q", r.Path, r.Value) }
