package bot

// This file: the caller's choices (approval.Choice) of a contact request
// (a question an outside agent asks a person, approval.KindContact) offered
// in the Reject and Respond modals, and the one picked. The contact
// request's card is drawn with the others (card.go: contactBlocks).

import (
	"errors"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
)

// Modal blocks of the caller's choices.
const (
	blockChoice  = "choice"
	actionChoice = "choice"
)

// errUnknownChoice refuses a submission naming an option the request does
// not offer (a forged or stale form).
var errUnknownChoice = errors.New("bot: the option picked is not one of the request's")

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
