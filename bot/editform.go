package bot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/policyfile"
)

// Edit modal block ids. Field blocks are "f<index>" in schema order, so any
// property name (of any length) maps to a short, valid block_id.
const (
	blockArgsJSON   = "args_json"
	actionFieldEdit = "v"
	maxEditFields   = maxViewBlocks - 4
	maxErrorText    = 300
)

// fieldKind is the input used for one schema property.
type fieldKind int

const (
	fieldText fieldKind = iota
	fieldMultiline
	fieldEmail
	fieldInteger
	fieldNumber
	fieldSelect
	fieldBool
	fieldJSON
)

// field is one editable argument.
type field struct {
	name     string
	blockID  string
	kind     fieldKind
	required bool
	nullable bool // the schema type allows null
	title    string
	hint     string
	enum     []json.RawMessage
	maxLen   int
}

// editFields reads the tool's schema into form fields, in the schema's
// property order. A tool without declared properties gets none (the modal
// then offers the whole arguments object as JSON).
func editFields(schema json.RawMessage) []field {
	if len(schema) == 0 {
		return nil
	}
	props, err := policyfile.ReadProps(schema)
	if err != nil || len(props.List) == 0 {
		return nil
	}
	fields := make([]field, 0, len(props.List))
	for i, p := range props.List {
		f := field{name: p.Name, blockID: "f" + strconv.Itoa(i), required: props.IsRequired(p.Name),
			nullable: p.AllowsNull(), title: p.Title, hint: p.Description, maxLen: maxInitialValue}
		if p.MaxLength != nil && *p.MaxLength > 0 {
			f.maxLen = min(*p.MaxLength, maxInitialValue)
		}
		switch t := p.TypeName(); {
		case len(p.Enum) > 0 && len(p.Enum) <= maxSelectOptions:
			f.kind, f.enum = fieldSelect, p.Enum
		case t == "boolean":
			f.kind = fieldBool
		case t == "integer":
			f.kind = fieldInteger
		case t == "number":
			f.kind = fieldNumber
		case t == "string" && p.Format == "email":
			f.kind = fieldEmail
		case t == "string" && (p.Format == "textarea" || (p.MaxLength != nil && *p.MaxLength > 200)):
			f.kind = fieldMultiline
		case t == "string":
			f.kind = fieldText // becomes multiline when the current value is long
		default:
			f.kind = fieldJSON
		}
		fields = append(fields, f)
	}
	return fields
}

// decodeArgs returns args as a map of raw values (numbers kept as written).
func decodeArgs(args json.RawMessage) (map[string]json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(args)) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(args, &m); err != nil {
		return nil, fmt.Errorf("arguments are not a JSON object: %w", err)
	}
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	return m, nil
}

// initialText is the text a field starts with, and whether it fits an
// input at all (Slack caps initial values at 3,000 characters).
func initialText(f field, raw json.RawMessage) (string, bool) {
	if raw == nil {
		return "", true
	}
	var s string
	switch f.kind {
	case fieldText, fieldMultiline, fieldEmail:
		if json.Unmarshal(raw, &s) != nil {
			s = string(raw)
		}
	case fieldJSON:
		s = indentJSON(raw)
	default:
		s = string(raw)
	}
	return s, runes(s) <= maxInitialValue
}

// editModal builds the Edit modal: one typed input per schema property,
// pre-filled with the current arguments. Values too long for a Slack input
// are shown as read-only notes and kept unchanged. Without fields (a tool
// the policy does not declare, declared false, or a schema without
// properties) the whole arguments object is edited as JSON in one input.
func editModal(r *approval.Request, fields []field, declared bool, meta string) slack.ModalViewRequest {
	blocks := []slack.Block{contextBlock(fmt.Sprintf("Editing the arguments of %s. Your edit counts as your approval of the new values; "+
		"if they need more approvals than the request does, the card asks for the rest.", code(clip.Runes(r.Tool, 100))))}
	args, _ := decodeArgs(r.Args)
	if len(fields) == 0 {
		text, _ := initialText(field{kind: fieldJSON}, r.Args)
		el := slack.NewPlainTextInputBlockElement(nil, actionFieldEdit)
		el.Multiline = true
		if runes(text) <= maxInitialValue {
			el.InitialValue = text
		} else {
			blocks = append(blocks, contextBlock(fmt.Sprintf("The arguments are %d characters, too long to show here: enter the whole object to replace them.", runes(text))))
		}
		label, hint := jsonFieldText(r, declared)
		blocks = append(blocks, slack.NewInputBlock(blockArgsJSON, plain(plainFit(label, maxInputLabel)), plain(plainFit(hint, maxInputHint)), el))
	}
	for i, f := range fields {
		if i == maxEditFields {
			blocks = append(blocks, contextBlock(fmt.Sprintf("%d more arguments cannot be edited here and are kept unchanged.", len(fields)-i)))
			break
		}
		raw := args[f.name]
		text, fits := initialText(f, raw)
		if !fits {
			blocks = append(blocks, contextBlock(fmt.Sprintf("%s: %d characters, too long to edit here; kept unchanged.", code(clip.Runes(f.name, 200)), runes(text))))
			continue
		}
		label := f.name
		if f.title != "" {
			label = f.title + " (" + f.name + ")"
		}
		in := slack.NewInputBlock(f.blockID, plain(clip.Runes(label, maxInputLabel-1)), nil, fieldElement(f, raw, text))
		hint := f.hint
		if unit := unitHint(r.Formats[f.name]); unit != "" {
			hint = strings.TrimSpace(hint + " " + unit)
		}
		if hint != "" {
			in.Hint = plain(plainFit(hint, maxInputHint))
		}
		in.Optional = !f.required || f.kind == fieldBool || (f.nullable && (f.kind == fieldInteger || f.kind == fieldNumber))
		blocks = append(blocks, in)
	}
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		CallbackID:      callbackEdit,
		Title:           plain("Edit arguments"),
		Submit:          plain("Approve edits"),
		Close:           plain("Cancel"),
		PrivateMetadata: meta,
		Blocks:          slack.Blocks{BlockSet: blocks},
	}
}

// indentJSON is raw as a person edits it: indented, and with every
// character as itself ("&&", not "\u0026\u0026", whatever escapes the
// caller's encoder wrote), through approval.Canonical, the one encoder of
// arguments. Text that is not JSON comes back as it is.
func indentJSON(raw json.RawMessage) string {
	canon, err := approval.Canonical(raw)
	if err != nil {
		return string(raw)
	}
	var buf bytes.Buffer
	if json.Indent(&buf, canon, "", "  ") != nil {
		return string(raw)
	}
	return buf.String()
}

func fieldElement(f field, raw json.RawMessage, text string) slack.BlockElement {
	switch f.kind {
	case fieldSelect:
		opts := make([]*slack.OptionBlockObject, 0, len(f.enum))
		var initial *slack.OptionBlockObject
		for i, e := range f.enum {
			label := string(e)
			var s string
			if json.Unmarshal(e, &s) == nil {
				label = s
			}
			if label == "" {
				label = `""`
			}
			o := slack.NewOptionBlockObject(strconv.Itoa(i), plain(clip.Runes(label, maxOptionText)), nil)
			opts = append(opts, o)
			if raw != nil && jsonEqual(raw, e) {
				initial = o
			}
		}
		el := slack.NewOptionsSelectBlockElement(slack.OptTypeStatic, plain("Choose"), actionFieldEdit, opts...)
		el.InitialOption = initial
		return el
	case fieldBool:
		o := slack.NewOptionBlockObject("true", plain("Yes"), nil)
		el := slack.NewCheckboxGroupsBlockElement(actionFieldEdit, o)
		if string(raw) == "true" {
			el.InitialOptions = []*slack.OptionBlockObject{o}
		}
		return el
	case fieldInteger, fieldNumber:
		el := slack.NewNumberInputBlockElement(nil, actionFieldEdit, f.kind == fieldNumber)
		// Slack refuses a number input whose initial value is not a number
		// (a nullable property holding null): it starts empty instead.
		if _, err := strconv.ParseFloat(text, 64); err == nil {
			el.InitialValue = text
		}
		return el
	case fieldEmail:
		el := slack.NewEmailTextInputBlockElement(nil, actionFieldEdit)
		el.InitialValue = text
		return el
	}
	el := slack.NewPlainTextInputBlockElement(nil, actionFieldEdit)
	el.InitialValue = text
	el.Multiline = f.kind == fieldMultiline || f.kind == fieldJSON || runes(text) > 150 || strings.Contains(text, "\n")
	if f.kind != fieldJSON && f.maxLen > 0 {
		el.MaxLength = f.maxLen
	}
	return el
}

func jsonEqual(a, b json.RawMessage) bool {
	ca, err1 := approval.Canonical(a)
	cb, err2 := approval.Canonical(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

// applyEdit merges the submitted values into the current arguments, each
// read as its input's type says (a whole number, one of the options, a
// JSON object...). Problems come back keyed by block_id, ready for
// response_action "errors". The schema and the policy judge the result
// afterwards (Bot.judgeEdit).
func applyEdit(cur json.RawMessage, fields []field, values map[string]map[string]inputValue) (json.RawMessage, map[string]string) {
	errs := map[string]string{}
	args, err := decodeArgs(cur)
	if err != nil {
		args = map[string]json.RawMessage{}
	}
	if len(fields) == 0 {
		v, _ := formValue(values, blockArgsJSON)
		text := ""
		if v.Value != nil {
			text = *v.Value
		}
		args, err = decodeArgs(json.RawMessage(text))
		if err != nil || !json.Valid([]byte(text)) {
			return nil, map[string]string{blockArgsJSON: "Not a valid JSON object."}
		}
	}
	for i, f := range fields {
		if i == maxEditFields {
			break
		}
		v, ok := formValue(values, f.blockID)
		if !ok {
			continue // not in the form (too long to edit): kept unchanged
		}
		_, had := args[f.name]
		text := ""
		if v.Value != nil {
			text = *v.Value
		}
		switch f.kind {
		case fieldSelect:
			if v.SelectedOption == nil || v.SelectedOption.Value == "" {
				delete(args, f.name)
				continue
			}
			idx, err := strconv.Atoi(v.SelectedOption.Value)
			if err != nil || idx < 0 || idx >= len(f.enum) {
				errs[f.blockID] = "Choose one of the options."
				continue
			}
			args[f.name] = f.enum[idx]
		case fieldBool:
			checked := slices.ContainsFunc(v.SelectedOptions, func(o struct {
				Value string `json:"value"`
			}) bool {
				return o.Value == "true"
			})
			if checked || had {
				args[f.name] = json.RawMessage(strconv.FormatBool(checked))
			}
		case fieldInteger, fieldNumber:
			text = strings.TrimSpace(text)
			if text == "" {
				if had && f.nullable { // an emptied nullable number is null
					args[f.name] = json.RawMessage("null")
				} else {
					delete(args, f.name)
				}
				continue
			}
			if f.kind == fieldInteger {
				if _, ok := new(big.Int).SetString(text, 10); !ok {
					errs[f.blockID] = "Enter a whole number."
					continue
				}
			} else if _, err := strconv.ParseFloat(text, 64); err != nil {
				errs[f.blockID] = "Enter a number."
				continue
			}
			args[f.name] = json.RawMessage(text)
		case fieldJSON:
			if strings.TrimSpace(text) == "" {
				delete(args, f.name)
				continue
			}
			if !json.Valid([]byte(text)) {
				errs[f.blockID] = "Not valid JSON."
				continue
			}
			args[f.name] = json.RawMessage(text)
		default:
			if text == "" && !had {
				continue
			}
			if text == "" && !f.required {
				delete(args, f.name)
				continue
			}
			b, _ := json.Marshal(text)
			args[f.name] = b
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, map[string]string{firstBlock(fields, values): "Internal error."}
	}
	out, err := approval.Canonical(raw)
	if err != nil {
		return nil, map[string]string{firstBlock(fields, values): "Those arguments are not valid."}
	}
	return out, nil
}

// firstBlock is the block an error that concerns no shown field goes on:
// the first field that is an input in the submitted form. Slack refuses
// (and shows the approver a generic failure) an "errors" answer naming a
// block that is not an input, such as the read-only note for a value too
// long to edit.
func firstBlock(fields []field, values map[string]map[string]inputValue) string {
	if len(fields) == 0 {
		return blockArgsJSON
	}
	for i, f := range fields {
		if i == maxEditFields {
			break
		}
		if _, ok := values[f.blockID]; ok {
			return f.blockID
		}
	}
	return fields[0].blockID
}

// schemaErrors puts each schema violation on the field it concerns, or,
// when that field is not an input in the form (values), on the first one
// that is, naming the property.
func schemaErrors(err error, fields []field, values map[string]map[string]inputValue) map[string]string {
	byName := map[string]string{}
	for _, f := range fields {
		if _, ok := values[f.blockID]; ok {
			byName[f.name] = f.blockID
		}
	}
	errs := map[string]string{}
	put := func(block, msg string) {
		if block == "" {
			block = firstBlock(fields, values)
		}
		if prev, ok := errs[block]; ok {
			sep := "; "
			if strings.HasSuffix(prev, ".") {
				sep = " "
			}
			msg = prev + sep + msg
		}
		errs[block] = plainFit(msg, maxErrorText)
	}
	ae, ok := errors.AsType[*policyfile.ArgsError](err)
	if !ok {
		put("", "Does not match the tool's schema.")
		return errs
	}
	for _, v := range ae.Violations {
		if v.Missing != nil && len(v.Location) == 0 {
			for _, m := range v.Missing {
				if b, ok := byName[m]; ok {
					put(b, "Required.")
				} else {
					put("", m+" is required.")
				}
			}
			continue
		}
		msg := v.Message
		if len(v.Location) == 0 {
			put("", msg)
			continue
		}
		if len(v.Location) > 1 {
			msg = "At /" + strings.Join(v.Location[1:], "/") + ": " + msg
		}
		block, shown := byName[v.Location[0]]
		if !shown {
			msg = v.Location[0] + ": " + msg
		}
		put(block, msg)
	}
	return errs
}

// toolSchema returns the raw schema declared for tool, or nil.
func toolSchema(p *policyfile.File, tool string) json.RawMessage {
	if t, ok := p.Tool(tool); ok {
		return t.Schema
	}
	return nil
}

// unitHint says in what unit an edit field's value is written, from the
// policy's format for it: "In USD cents: 6400 is $64.00."
func unitHint(f approval.ValueFormat) string {
	switch f.Kind {
	case approval.FormatCurrency:
		if f.MinorUnits {
			return fmt.Sprintf("In %s minor units (cents): 6400 is %s.", f.Currency, f.Apply(6400))
		}
		return fmt.Sprintf("In %s: 64 is %s.", f.Currency, f.Apply(64))
	case approval.FormatPercent:
		return "A fraction: 0.15 is 15%."
	case approval.FormatBytes:
		return "In bytes: 1536 is 1.5 KiB."
	case approval.FormatDate:
		return "A date and time in RFC 3339, e.g. 2026-12-02T14:05:00Z."
	}
	return ""
}

// jsonFieldText is the label and hint of the one JSON input that edits
// the arguments of a tool with no typed fields: a tool the policy does not
// declare (its schema, if any, came from its caller), or one whose schema
// names no properties.
func jsonFieldText(r *approval.Request, declared bool) (label, hint string) {
	label = "Arguments of " + clip.Runes(r.Tool, 100) + " (a JSON object)"
	switch {
	case declared:
		hint = "The whole arguments object, as JSON."
	case len(r.InputSchema) > 0:
		hint = "This tool is not declared in the policy: edit its arguments as one JSON object. " +
			"They are checked against the input schema its caller sent, then judged by the policy like a new request."
	default:
		hint = "This tool is not declared in the policy and its caller sent no schema: any JSON object is accepted, " +
			"then judged by the policy like a new request."
	}
	if s := schemaFieldsText(r.InputSchema); s != "" && !declared {
		hint += " " + s
	}
	return label, hint
}

// schemaFieldsText names the properties a JSON Schema declares, required
// ones first: "Required: order_id, amount. Optional: note." Empty when it
// names none.
func schemaFieldsText(schema json.RawMessage) string {
	if len(schema) == 0 {
		return ""
	}
	// A property whose keywords do not read still has its name listed.
	props, _ := policyfile.ReadProps(schema)
	var required, optional []string
	for _, name := range props.Names() {
		if props.IsRequired(name) {
			required = append(required, name)
		} else {
			optional = append(optional, name)
		}
	}
	for _, name := range props.Required { // required but not among the properties
		if !slices.Contains(required, name) {
			required = append(required, name)
		}
	}
	var parts []string
	if len(required) > 0 {
		parts = append(parts, fmt.Sprintf("Required: %s.", strings.Join(required, ", ")))
	}
	if len(optional) > 0 {
		parts = append(parts, fmt.Sprintf("Optional: %s.", strings.Join(optional, ", ")))
	}
	return strings.Join(parts, " ")
}
