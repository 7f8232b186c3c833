package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Schema is a tool's compiled argument schema: the one home of the JSON
// Schema library. The policy file, the agent (a model's call) and the bot
// (an approver's edit form) validate with it.
type Schema struct {
	sch *jsonschema.Schema
}

// CompileSchema compiles a tool's argument schema (draft 2020-12 unless
// it declares another; formats are asserted, not only labels). The error
// is one line naming the innermost problems.
func CompileSchema(name string, raw json.RawMessage) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	url := "https://countersign.invalid/tools/" + name + ".json"
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Formats (email, date-time, uri, …) are checked, not just labels:
	// an approver's edit or a model's argument with a malformed address is
	// refused, whatever draft the schema declares.
	c.AssertFormat()
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, errors.New(flattenSchemaError(err, url))
	}
	return &Schema{sch: sch}, nil
}

// Validate checks arguments against the schema. It returns an error for
// arguments that are not JSON, and an *ArgsError listing the violations
// for JSON that does not match.
func (s *Schema) Validate(args json.RawMessage) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return err
	}
	err = s.sch.Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](err)
	if !ok {
		return err
	}
	ae := &ArgsError{text: ve.Error(), summary: flattenSchemaError(err, "")}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		for _, c := range e.Causes {
			walk(c)
		}
		if len(e.Causes) > 0 {
			return
		}
		v := Violation{Location: e.InstanceLocation, Message: fieldMessage(e.ErrorKind)}
		if req, ok := e.ErrorKind.(*kind.Required); ok {
			v.Missing = req.Missing
		}
		ae.Violations = append(ae.Violations, v)
	}
	walk(ve)
	return ae
}

// ArgsError is arguments that do not match a tool's schema.
type ArgsError struct {
	// Violations are the innermost problems, in the schema's order.
	Violations []Violation
	text       string // the library's full message
	summary    string // one line, innermost problems only
}

// Error is the full, multi-line account of the mismatch.
func (e *ArgsError) Error() string { return e.text }

// Summary is one line listing the innermost problems, e.g. "at '/amount':
// got string, want number".
func (e *ArgsError) Summary() string { return e.summary }

// Violation is one schema violation, worded for an approver filling in a
// form.
type Violation struct {
	// Location is the path of the offending value (property names and
	// array indexes), empty for the arguments as a whole.
	Location []string
	// Missing are the required properties that are absent (a "required"
	// violation), nil otherwise.
	Missing []string
	// Message is a short sentence, e.g. "Must be at most 100."
	Message string
}

var printer = message.NewPrinter(language.English)

// fieldMessage is the short text an approver sees under a field for one
// schema violation. Kinds without a wording of their own keep the
// library's message.
func fieldMessage(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.MinLength:
		return printer.Sprintf("At least %d %s.", k.Want, plural(k.Want, "character"))
	case *kind.MaxLength:
		return printer.Sprintf("At most %d %s.", k.Want, plural(k.Want, "character"))
	case *kind.Minimum:
		return "Must be at least " + ratText(k.Want) + "."
	case *kind.Maximum:
		return "Must be at most " + ratText(k.Want) + "."
	case *kind.ExclusiveMinimum:
		return "Must be more than " + ratText(k.Want) + "."
	case *kind.ExclusiveMaximum:
		return "Must be less than " + ratText(k.Want) + "."
	case *kind.MultipleOf:
		return "Must be a multiple of " + ratText(k.Want) + "."
	case *kind.Format:
		return formatMessage(k.Want)
	case *kind.Pattern:
		return "Doesn't match the required format (" + k.Want + ")."
	case *kind.Enum:
		return "Choose one of: " + valueList(k.Want, 10) + "."
	case *kind.Const:
		return "Must be " + valueList([]any{k.Want}, 1) + "."
	case *kind.Required:
		if len(k.Missing) == 1 {
			return k.Missing[0] + " is required."
		}
		return "Required: " + strings.Join(k.Missing, ", ") + "."
	case *kind.Type:
		names := make([]string, len(k.Want))
		for i, t := range k.Want {
			names[i] = typeText(t)
		}
		return "Must be " + strings.Join(names, " or ") + "."
	case *kind.MinItems:
		return printer.Sprintf("At least %d %s.", k.Want, plural(k.Want, "item"))
	case *kind.MaxItems:
		return printer.Sprintf("At most %d %s.", k.Want, plural(k.Want, "item"))
	case *kind.UniqueItems:
		return "Items must not repeat."
	case *kind.MinProperties:
		return printer.Sprintf("At least %d %s.", k.Want, plural(k.Want, "entry"))
	case *kind.MaxProperties:
		return printer.Sprintf("At most %d %s.", k.Want, plural(k.Want, "entry"))
	case *kind.AdditionalProperties:
		return "Not allowed: " + strings.Join(k.Properties, ", ") + "."
	case *kind.FalseSchema:
		return "Not allowed."
	}
	return k.LocalizedString(printer)
}

func plural(n int, noun string) string {
	switch {
	case n == 1:
		return noun
	case strings.HasSuffix(noun, "y"):
		return strings.TrimSuffix(noun, "y") + "ies"
	}
	return noun + "s"
}

// ratText writes a schema bound as written: 3, 0.5, 1,000.
func ratText(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() && r.Num().IsInt64() {
		return printer.Sprintf("%d", r.Num().Int64())
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// formatMessage names what a "format" keyword wants.
func formatMessage(format string) string {
	switch format {
	case "email", "idn-email":
		return "Enter a valid email address."
	case "uri", "iri", "uri-reference", "iri-reference", "url":
		return "Enter a valid URL."
	case "date":
		return "Enter a valid date (YYYY-MM-DD)."
	case "date-time":
		return "Enter a valid date and time (like 2026-03-02T09:00:00Z)."
	case "time":
		return "Enter a valid time (like 09:00:00Z)."
	case "duration":
		return "Enter a valid duration (like P3D or PT2H)."
	case "uuid":
		return "Enter a valid UUID."
	case "ipv4", "ipv6":
		return "Enter a valid " + strings.ToUpper(format[:2]) + format[2:] + " address."
	case "hostname", "idn-hostname":
		return "Enter a valid host name."
	}
	return "Not a valid " + format + "."
}

// typeText names a JSON Schema type for a person filling in a form.
func typeText(t string) string {
	switch t {
	case "string":
		return "text"
	case "integer":
		return "a whole number"
	case "number":
		return "a number"
	case "boolean":
		return "yes or no"
	case "object":
		return "a JSON object"
	case "array":
		return "a list"
	case "null":
		return "empty"
	}
	return t
}

// valueList lists allowed values, strings unquoted, at most limit of them.
func valueList(vals []any, limit int) string {
	parts := make([]string, 0, min(len(vals), limit)+1)
	for i, v := range vals {
		if i == limit {
			parts = append(parts, printer.Sprintf("… (%d more)", len(vals)-limit))
			break
		}
		s, ok := v.(string)
		if !ok {
			b, err := json.Marshal(v)
			if err != nil {
				b = []byte(fmt.Sprint(v))
			}
			s = string(b)
		}
		if s == "" {
			s = `""`
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// flattenSchemaError turns the library's multi-line error into one line
// listing only the innermost problems, e.g. "at '/amount': got string,
// want number".
func flattenSchemaError(err error, url string) string {
	prefix := ""
	if sve, ok := errors.AsType[*jsonschema.SchemaValidationError](err); ok {
		prefix, err = "not a valid JSON Schema: ", sve.Err
	}
	var msgs []string
	if ve, ok := errors.AsType[*jsonschema.ValidationError](err); ok {
		var walk func(e *jsonschema.ValidationError)
		walk = func(e *jsonschema.ValidationError) {
			if len(e.Causes) == 0 {
				lines := strings.Split(strings.TrimSpace(e.Error()), "\n")
				if msg := strings.TrimPrefix(strings.TrimSpace(lines[len(lines)-1]), "- "); !slices.Contains(msgs, msg) {
					msgs = append(msgs, msg)
				}
			}
			for _, c := range e.Causes {
				walk(c)
			}
		}
		walk(ve)
	} else {
		for _, l := range strings.Split(err.Error(), "\n") {
			msgs = append(msgs, strings.TrimPrefix(strings.TrimSpace(l), "- "))
		}
	}
	msg := prefix + strings.Join(msgs, "; ")
	if url != "" {
		msg = strings.ReplaceAll(msg, url, "schema")
	}
	return msg
}
