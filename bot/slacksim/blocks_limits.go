package slacksim

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// Block Kit limits enforced by the workspace (Slack's documented values).
const (
	maxMessageBlocks    = 50
	maxViewBlocks       = 100
	maxMessageText      = 40000
	maxSectionText      = 3000
	maxSectionFields    = 10
	maxFieldText        = 2000
	maxHeaderText       = 150
	maxContextElements  = 10
	maxActionsElements  = 25
	maxButtonText       = 75
	maxButtonValue      = 2000
	maxButtonURL        = 3000
	maxID               = 255
	maxModalTitle       = 24
	maxModalButton      = 24
	maxPrivateMetadata  = 3000
	maxInputLabel       = 2000
	maxInputHint        = 2000
	maxInitialValue     = 3000
	maxPlaceholder      = 150
	maxSelectOptions    = 100
	maxOptionText       = 75
	maxOptionValue      = 150
	maxCheckboxOptions  = 10
	maxImageAltText     = 2000
	maxConfirmTitle     = 100
	maxConfirmText      = 300
	maxConfirmButton    = 30
	maxContextTextChars = 3000
)

// limitError is one Block Kit violation, rendered as Slack renders it in
// response_metadata.messages.
type limitError struct {
	pointer string
	msg     string
}

func (e limitError) String() string {
	return fmt.Sprintf("[ERROR] %s [json-pointer:%s]", e.msg, e.pointer)
}

// validator collects violations while walking a block tree.
type validator struct {
	errs []limitError
}

func (v *validator) fail(ptr, format string, args ...any) {
	v.errs = append(v.errs, limitError{pointer: ptr, msg: fmt.Sprintf(format, args...)})
}

func (v *validator) messages() []string {
	out := make([]string, len(v.errs))
	for i, e := range v.errs {
		out[i] = e.String()
	}
	return out
}

func (v *validator) maxLen(ptr, s string, n int) {
	if utf8.RuneCountInString(s) > n {
		v.fail(ptr, "must be less than %d characters", n+1)
	}
}

func (v *validator) maxItems(ptr string, items []any, n int) {
	if len(items) > n {
		v.fail(ptr, "must be less than %d items", n+1)
	}
}

// textObject checks a text object; kinds lists the allowed types.
func (v *validator) textObject(ptr string, raw any, maxChars int, required bool, kinds ...string) {
	if raw == nil {
		if required {
			v.fail(ptr, "missing required field: text")
		}
		return
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		v.fail(ptr, "must be an object")
		return
	}
	typ, _ := obj["type"].(string)
	if len(kinds) == 0 {
		kinds = []string{"plain_text", "mrkdwn"}
	}
	if !slices.Contains(kinds, typ) {
		v.fail(ptr+"/type", "must be one of %v", kinds)
	}
	s, _ := obj["text"].(string)
	if s == "" {
		v.fail(ptr+"/text", "must be more than 0 characters")
		return
	}
	v.maxLen(ptr+"/text", s, maxChars)
}

func (v *validator) id(ptr string, obj map[string]any, key string) {
	if s, ok := obj[key].(string); ok {
		v.maxLen(ptr+"/"+key, s, maxID)
	}
}

// blocks checks a blocks array; limit is 50 for messages, 100 for views.
func (v *validator) blocks(ptr string, blocks []any, limit int) {
	v.maxItems(ptr, blocks, limit)
	seen := map[string]bool{}
	for i, b := range blocks {
		p := fmt.Sprintf("%s/%d", ptr, i)
		block, ok := b.(map[string]any)
		if !ok {
			v.fail(p, "must be an object")
			continue
		}
		v.id(p, block, "block_id")
		if id, _ := block["block_id"].(string); id != "" {
			if seen[id] {
				v.fail(p+"/block_id", "duplicate block_id %q", id)
			}
			seen[id] = true
		}
		v.block(p, block)
	}
}

func (v *validator) block(p string, block map[string]any) {
	typ, _ := block["type"].(string)
	switch typ {
	case "section":
		if block["text"] == nil && block["fields"] == nil {
			v.fail(p, "must provide either text or fields")
		}
		v.textObject(p+"/text", block["text"], maxSectionText, false)
		if fields, ok := block["fields"].([]any); ok {
			v.maxItems(p+"/fields", fields, maxSectionFields)
			for j, f := range fields {
				v.textObject(fmt.Sprintf("%s/fields/%d", p, j), f, maxFieldText, true)
			}
		}
		if acc, ok := block["accessory"].(map[string]any); ok {
			v.element(p+"/accessory", acc)
		}
	case "header":
		v.textObject(p+"/text", block["text"], maxHeaderText, true, "plain_text")
	case "context":
		els, _ := block["elements"].([]any)
		if len(els) == 0 {
			v.fail(p+"/elements", "must provide at least 1 item")
		}
		v.maxItems(p+"/elements", els, maxContextElements)
		for j, e := range els {
			ep := fmt.Sprintf("%s/elements/%d", p, j)
			em, _ := e.(map[string]any)
			if t, _ := em["type"].(string); t == "plain_text" || t == "mrkdwn" {
				v.textObject(ep, em, maxContextTextChars, true)
			}
		}
	case "actions":
		els, _ := block["elements"].([]any)
		if len(els) == 0 {
			v.fail(p+"/elements", "must provide at least 1 item")
		}
		v.maxItems(p+"/elements", els, maxActionsElements)
		for j, e := range els {
			em, _ := e.(map[string]any)
			v.element(fmt.Sprintf("%s/elements/%d", p, j), em)
		}
	case "input":
		v.textObject(p+"/label", block["label"], maxInputLabel, true, "plain_text")
		v.textObject(p+"/hint", block["hint"], maxInputHint, false, "plain_text")
		el, ok := block["element"].(map[string]any)
		if !ok {
			v.fail(p+"/element", "missing required field: element")
			return
		}
		v.element(p+"/element", el)
	case "image":
		if s, _ := block["alt_text"].(string); s == "" {
			v.fail(p+"/alt_text", "missing required field: alt_text")
		} else {
			v.maxLen(p+"/alt_text", s, maxImageAltText)
		}
	case "divider", "rich_text", "file", "video", "markdown", "table", "context_actions":
	case "":
		v.fail(p+"/type", "missing required field: type")
	default:
		v.fail(p+"/type", "unsupported block type %q", typ)
	}
}

func (v *validator) element(p string, el map[string]any) {
	if el == nil {
		v.fail(p, "must be an object")
		return
	}
	v.id(p, el, "action_id")
	typ, _ := el["type"].(string)
	v.textObject(p+"/placeholder", el["placeholder"], maxPlaceholder, false, "plain_text")
	switch typ {
	case "button":
		v.textObject(p+"/text", el["text"], maxButtonText, true, "plain_text")
		if s, ok := el["value"].(string); ok {
			v.maxLen(p+"/value", s, maxButtonValue)
		}
		if s, ok := el["url"].(string); ok {
			v.maxLen(p+"/url", s, maxButtonURL)
		}
		if s, ok := el["style"].(string); ok && s != "primary" && s != "danger" {
			v.fail(p+"/style", "must be one of [primary danger]")
		}
	case "plain_text_input":
		if s, ok := el["initial_value"].(string); ok {
			v.maxLen(p+"/initial_value", s, maxInitialValue)
		}
		if n, ok := el["max_length"].(float64); ok && n > maxInitialValue {
			v.fail(p+"/max_length", "must be less than %d", maxInitialValue+1)
		}
	case "static_select", "multi_static_select", "radio_buttons", "overflow":
		opts, _ := el["options"].([]any)
		limit := maxSelectOptions
		if typ == "radio_buttons" {
			limit = maxCheckboxOptions
		}
		if typ == "overflow" {
			limit = 5
		}
		if opts == nil && el["option_groups"] == nil {
			v.fail(p+"/options", "must provide options or option_groups")
		}
		v.maxItems(p+"/options", opts, limit)
		v.options(p+"/options", opts)
	case "checkboxes":
		opts, _ := el["options"].([]any)
		if len(opts) == 0 {
			v.fail(p+"/options", "must provide at least 1 item")
		}
		v.maxItems(p+"/options", opts, maxCheckboxOptions)
		v.options(p+"/options", opts)
	}
	if c, ok := el["confirm"].(map[string]any); ok {
		v.textObject(p+"/confirm/title", c["title"], maxConfirmTitle, true, "plain_text")
		v.textObject(p+"/confirm/text", c["text"], maxConfirmText, true)
		v.textObject(p+"/confirm/confirm", c["confirm"], maxConfirmButton, true, "plain_text")
		v.textObject(p+"/confirm/deny", c["deny"], maxConfirmButton, true, "plain_text")
	}
}

func (v *validator) options(p string, opts []any) {
	for j, o := range opts {
		op := fmt.Sprintf("%s/%d", p, j)
		om, _ := o.(map[string]any)
		v.textObject(op+"/text", om["text"], maxOptionText, true)
		s, _ := om["value"].(string)
		v.maxLen(op+"/value", s, maxOptionValue)
	}
}

// validateMessageBlocks checks a message's blocks. It returns Slack's
// response_metadata messages, empty when valid.
func validateMessageBlocks(blocks []any) []string {
	var v validator
	v.blocks("/blocks", blocks, maxMessageBlocks)
	return v.messages()
}

// validateView checks a modal or home view definition.
func validateView(def map[string]any) []string {
	var v validator
	typ, _ := def["type"].(string)
	switch typ {
	case "modal":
		v.textObject("/view/title", def["title"], maxModalTitle, true, "plain_text")
		v.textObject("/view/submit", def["submit"], maxModalButton, false, "plain_text")
		v.textObject("/view/close", def["close"], maxModalButton, false, "plain_text")
	case "home":
	default:
		v.fail("/view/type", "must be one of [modal home]")
	}
	if s, ok := def["private_metadata"].(string); ok {
		v.maxLen("/view/private_metadata", s, maxPrivateMetadata)
	}
	if s, ok := def["callback_id"].(string); ok {
		v.maxLen("/view/callback_id", s, maxID)
	}
	if s, ok := def["external_id"].(string); ok {
		v.maxLen("/view/external_id", s, maxID)
	}
	blocks, _ := def["blocks"].([]any)
	if _, ok := def["blocks"]; !ok {
		v.fail("/view/blocks", "missing required field: blocks")
	}
	v.blocks("/view/blocks", blocks, maxViewBlocks)
	if typ == "modal" && def["submit"] == nil {
		for i, b := range blocks {
			if bm, _ := b.(map[string]any); bm["type"] == "input" {
				v.fail(fmt.Sprintf("/view/blocks/%d", i), "submit is required when an input block is within blocks")
				break
			}
		}
	}
	return v.messages()
}
