package slacksim

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"
)

// ErrManifest is wrapped by ParseManifest and ReadManifest for a manifest
// that cannot be read or does not say what the workspace needs.
var ErrManifest = errors.New("slacksim: bad app manifest")

// Manifest is what the workspace reads of a Slack app manifest (the YAML
// of manifest.yml): the bot token scopes the installed app is granted and
// the bot events it subscribes to.
type Manifest struct {
	// Scopes are oauth_config.scopes.bot.
	Scopes []string
	// Events are settings.event_subscriptions.bot_events.
	Events []string
}

// manifestYAML is the part of Slack's manifest schema the workspace reads.
type manifestYAML struct {
	OAuthConfig struct {
		Scopes struct {
			Bot []string `yaml:"bot"`
		} `yaml:"scopes"`
	} `yaml:"oauth_config"`
	Settings struct {
		EventSubscriptions struct {
			BotEvents []string `yaml:"bot_events"`
		} `yaml:"event_subscriptions"`
	} `yaml:"settings"`
}

// ParseManifest reads an app manifest in YAML. As Slack does when an app
// is created from a manifest, it refuses a bot event whose scope the
// manifest does not grant (member_left_channel without channels:read or
// groups:read, subteam_members_changed without usergroups:read…). Errors
// wrap ErrManifest.
func ParseManifest(data []byte) (*Manifest, error) {
	var y manifestYAML
	if err := yaml.Unmarshal(data, &y); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	m := &Manifest{Scopes: slices.Clone(y.OAuthConfig.Scopes.Bot), Events: slices.Clone(y.Settings.EventSubscriptions.BotEvents)}
	for _, ev := range m.Events {
		need, known := eventScopes[ev]
		if !known {
			continue
		}
		if !slices.ContainsFunc(need, m.grants) {
			return nil, fmt.Errorf("%w: bot event %s needs one of the scopes %v, which oauth_config.scopes.bot does not grant", ErrManifest, ev, need)
		}
	}
	return m, nil
}

// ReadManifest reads the manifest file at path (ParseManifest).
func ReadManifest(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err) // os.ErrNotExist stays visible
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// grants reports whether the manifest grants scope; no manifest grants
// every scope.
func (m *Manifest) grants(scope string) bool { return m == nil || slices.Contains(m.Scopes, scope) }

// eventScopes are the scopes a bot event needs (any one of them), as
// Slack's event reference pages list them. A conversation event reaches the
// app only for the kinds of conversation it holds the scope of.
var eventScopes = map[string][]string{
	"app_mention":             {"app_mentions:read"},
	"message.im":              {"im:history"},
	"message.channels":        {"channels:history"},
	"message.groups":          {"groups:history"},
	"message.mpim":            {"mpim:history"},
	"member_joined_channel":   {"channels:read", "groups:read"},
	"member_left_channel":     {"channels:read", "groups:read"},
	"subteam_members_changed": {"usergroups:read"},
}
