package bot

// This file: the Respond card of a contact request (a question an outside
// agent asks a person, approval.KindContact) and the caller's choices
// (approval.Choice) offered in the Reject and Respond modals.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Modal blocks of the caller's choices.
const (
	blockChoice  = "choice"
	actionChoice = "choice"
)

// errUnknownChoice refuses a submission naming an option the request does
// not offer (a forged or stale form).
var errUnknownChoice = errors.New("bot: the option picked is not one of the request's")

// contactQuestion is a contact request's question, as its Args hold it.
type contactQuestion struct {
	Msg     string `json:"msg"`
	Subject string `json:"subject"`
}

func questionOf(r *approval.Request) contactQuestion {
	var q contactQuestion
	if json.Unmarshal(r.Args, &q) != nil || strings.TrimSpace(q.Msg) == "" {
		q.Msg = string(r.Args) // never hide what was asked
	}
	return q
}

// contactBlocks renders the Respond card of a contact request: who asks,
// the question, the answers the caller suggests, who may answer, and an
// Answer button while it waits.
func contactBlocks(r *approval.Request) []slack.Block {
	q := questionOf(r)
	head := "💬 Question"
	if q.Subject != "" {
		head += ": " + q.Subject
	}
	blocks := []slack.Block{
		slack.NewHeaderBlock(plain(plainFit(head, maxHeaderText))),
		contextBlock("Asked " + callerText(r)),
		mrkdwnSection(plainFit("*The agent asks:*\n"+quote(litFit(q.Msg, summaryTextLimit)), maxSectionText)),
	}
	if len(r.Choices) > 0 {
		blocks = append(blocks, mrkdwnSection(plainFit("*Answers the agent suggests*\n"+choiceList(r.Choices), maxSectionText)))
	}
	if r.Status == approval.StatusPending {
		if line := approversLine(r); line != "" {
			blocks = append(blocks, contextBlock(strings.Replace(line, "Approvers: ", "Who may answer: ", 1)))
		}
	}
	blocks = append(blocks, contextBlock("Deadline "+slackDate(r.Deadline)))
	if line := statusLine(r); line != "" {
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	if line := feedbackLine(r); line != "" {
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	if r.Status == approval.StatusPending {
		blocks = append(blocks, slack.NewActionBlock(cardActionsBlock,
			slack.NewButtonBlockElement(actionRespond, refValue(r.ID, r.Digest), plain("Answer")).WithStyle(slack.StylePrimary)))
	}
	blocks = append(blocks, feedbackActions(r)...)
	return append(blocks, contextBlock(idsLine(r)))
}

// contactStatusLine says where a contact request is.
func contactStatusLine(r *approval.Request) string {
	d := r.Decision
	switch r.Status {
	case approval.StatusPending:
		return "⏳ *Waiting for an answer*"
	case approval.StatusResponded:
		s := fmt.Sprintf("💬 *Answered* by %s · %s", mention(d.Approver), slackDate(d.At))
		c, picked := choiceNamed(r, d.Choice)
		if picked && strings.TrimSpace(d.Text) != strings.TrimSpace(c.Label()) {
			s += "\n*Picked:* " + lit(clip.Runes(c.Label(), maxOptionText))
		}
		// An option picked without words of one's own is the answer: once.
		return s + "\n*Answer:* " + litFit(d.Text, decisionText)
	case approval.StatusRejected:
		s := fmt.Sprintf("❌ *Declined* by %s · %s", mention(d.Approver), slackDate(d.At))
		if strings.TrimSpace(d.Text) != "" {
			s += "\n*Why:* " + litFit(d.Text, decisionText)
		}
		return s
	case approval.StatusExpired:
		return "⌛ *Expired* with no answer · " + slackDate(r.Deadline) + " · the agent was told none will come"
	}
	return ""
}

// choiceList lists the caller's choices for a card.
func choiceList(cs []approval.Choice) string {
	var sb strings.Builder
	for i, c := range cs {
		if i > 0 {
			sb.WriteString("\n")
		}
		sb.WriteString("• " + lit(clip.Runes(c.Label(), maxOptionText)))
		if c.Description != "" {
			sb.WriteString(" — " + lit(clip.Runes(c.Description, 200)))
		}
	}
	return sb.String()
}

// choiceNamed returns r's choice called name.
func choiceNamed(r *approval.Request, name string) (approval.Choice, bool) {
	for _, c := range r.Choices {
		if name != "" && c.Name == name {
			return c, true
		}
	}
	return approval.Choice{}, false
}

// addChoices puts r's choices in a Reject or Respond modal, as radio
// buttons above its text input, which then becomes optional: a picked
// choice with no text says the choice's own text.
func addChoices(view *slack.ModalViewRequest, r *approval.Request, label string) {
	if len(r.Choices) == 0 {
		return
	}
	opts := make([]*slack.OptionBlockObject, 0, len(r.Choices))
	for _, c := range r.Choices {
		var desc *slack.TextBlockObject
		if c.Description != "" {
			desc = plain(plainFit(c.Description, maxOptionText))
		}
		opts = append(opts, slack.NewOptionBlockObject(c.Name, plain(plainFit(c.Label(), maxOptionText)), desc))
	}
	in := slack.NewInputBlock(blockChoice, plain(label), nil, slack.NewRadioButtonsBlockElement(actionChoice, opts...))
	in.Optional = true
	set := view.Blocks.BlockSet
	if text, ok := set[len(set)-1].(*slack.InputBlock); ok {
		text.Optional = true
		text.Hint = plain("Optional when you pick one above.")
	}
	view.Blocks.BlockSet = append(set[:len(set)-1:len(set)-1], in, set[len(set)-1])
}

// pickedChoice is the choice submitted in a modal, "" when none.
func pickedChoice(values map[string]map[string]inputValue) string {
	v, _ := formValue(values, blockChoice)
	if v.SelectedOption == nil {
		return ""
	}
	return v.SelectedOption.Value
}

// applyChoice completes d with the choice it names: the choice must be
// r's, and a decision with no text says the choice's text.
func applyChoice(r *approval.Request, d *approval.Decision) error {
	if d.Choice == "" {
		return nil
	}
	c, ok := choiceNamed(r, d.Choice)
	if !ok {
		return errUnknownChoice
	}
	if d.Text == "" {
		d.Text = c.Text()
	}
	return nil
}

// feedbackActions are the buttons that judge a final request after the
// fact (Mark as wrong; Looks right / Wrong on a sampled call's card).
func feedbackActions(r *approval.Request) []slack.Block {
	if !r.Markable() {
		return nil
	}
	value := refValue(r.ID, r.Digest)
	if r.Mode == approval.ModeSampled && r.Feedback == nil {
		return []slack.Block{slack.NewActionBlock(feedbackBlock,
			slack.NewButtonBlockElement(actionLooksRight, value, slack.NewTextBlockObject(slack.PlainTextType, "Looks right", false, false)).WithStyle(slack.StylePrimary),
			slack.NewButtonBlockElement(actionMarkWrong, value, slack.NewTextBlockObject(slack.PlainTextType, "Wrong", false, false)).WithStyle(slack.StyleDanger))}
	}
	return []slack.Block{slack.NewActionBlock(feedbackBlock,
		slack.NewButtonBlockElement(actionMarkWrong, value, slack.NewTextBlockObject(slack.PlainTextType, "Mark as wrong", false, false)))}
}
