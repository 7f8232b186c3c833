package bot

// This file: what the bot reads of an interactive payload (a click, a
// modal's submission): its fields, the message clicked and who clicked,
// and the callback and block ids of the modals.

import (
	"cmp"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
)

// Modal callback ids and their input blocks.
const (
	callbackReject  = "cs_reject"
	callbackRespond = "cs_respond"
	callbackEdit    = "cs_edit"
	callbackCancel  = "cs_cancel_run"
	callbackWrong   = "cs_mark_wrong"

	blockReason   = "reason"
	blockResponse = "response"
)

// interaction holds the fields of an interactive payload the bot reads
// (block_actions, view_submission, view_closed).
type interaction struct {
	Type        string `json:"type"`
	TriggerID   string `json:"trigger_id"`
	ResponseURL string `json:"response_url"`
	Team        struct {
		ID string `json:"id"`
	} `json:"team"`
	Enterprise *struct {
		ID string `json:"id"`
	} `json:"enterprise"`
	User struct {
		ID     string `json:"id"`
		TeamID string `json:"team_id"`
	} `json:"user"`
	Channel struct {
		ID string `json:"id"`
	} `json:"channel"`
	Container struct {
		ChannelID string `json:"channel_id"`
		MessageTS string `json:"message_ts"`
	} `json:"container"`
	// Message is the clicked message as Slack sends it: its metadata and
	// who posted it (when Slack includes them) tell a card not yet bound
	// (bindClicked).
	Message struct {
		TS       string              `json:"ts"`
		BotID    string              `json:"bot_id"`
		Metadata slack.SlackMetadata `json:"metadata"`
	} `json:"message"`
	Actions []struct {
		ActionID string `json:"action_id"`
		BlockID  string `json:"block_id"`
		Value    string `json:"value"`
	} `json:"actions"`
	View struct {
		ID              string `json:"id"`
		CallbackID      string `json:"callback_id"`
		PrivateMetadata string `json:"private_metadata"`
		State           struct {
			Values map[string]map[string]inputValue `json:"values"`
		} `json:"state"`
	} `json:"view"`
}

// clickedMessage is the message whose button was clicked.
func (ic interaction) clickedMessage() approval.CardRef {
	return approval.CardRef{Channel: cmp.Or(ic.Container.ChannelID, ic.Channel.ID), TS: cmp.Or(ic.Container.MessageTS, ic.Message.TS)}
}

// clicker is who clicked or submitted, and where to answer them.
type clicker struct {
	user string
	// responseURL reaches the clicker whatever channel they are in (or not
	// in); empty when Slack gave none.
	responseURL string
	// channel is where an ephemeral answer goes without a response_url.
	channel string
}

func (ic interaction) clicker() clicker {
	return clicker{user: ic.User.ID, responseURL: ic.ResponseURL, channel: ic.clickedMessage().Channel}
}

// inputValue is one input's state in a view submission.
type inputValue struct {
	Type           string  `json:"type"`
	Value          *string `json:"value"`
	SelectedOption *struct {
		Value string `json:"value"`
	} `json:"selected_option"`
	SelectedOptions []struct {
		Value string `json:"value"`
	} `json:"selected_options"`
}

// formValue returns the input under blockID (any action id).
func formValue(values map[string]map[string]inputValue, blockID string) (inputValue, bool) {
	for _, v := range values[blockID] {
		return v, true
	}
	return inputValue{}, false
}

// ephemeralAnswer is a slash command's answer only its invoker sees.
func ephemeralAnswer(text string, blocks []slack.Block) map[string]any {
	m := map[string]any{"response_type": "ephemeral", "text": text}
	if len(blocks) > 0 {
		m["blocks"] = blocks
	}
	return m
}

// command is a slash command invocation (the fields the bot reads).
type command struct {
	Command   string `json:"command"`
	Text      string `json:"text"`
	UserID    string `json:"user_id"`
	ChannelID string `json:"channel_id"`
	TeamID    string `json:"team_id"`
	TriggerID string `json:"trigger_id"`
	// EnterpriseID is set on Enterprise Grid; UserTeamID is the invoking
	// user's own team (another organisation's in a Slack Connect channel).
	EnterpriseID string `json:"enterprise_id"`
	UserTeamID   string `json:"user_team_id"`
}
