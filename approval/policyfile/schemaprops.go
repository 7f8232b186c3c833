package policyfile

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/countersign/countersign/approval"
)

// Props is what is read of a tool's argument schema beyond validating
// with it: the properties it declares, in document order, and which are
// required. The edit form, the card's hint for undeclared tools, the
// agent's extra properties and the policy file's checks of argument names
// all read it here.
type Props struct {
	// List is the declared properties in the order the schema writes them.
	List []Prop
	// Required is the schema's "required" list as written; it may name
	// properties the schema does not declare.
	Required []string
}

// Prop is one declared property: the keywords a form reads.
type Prop struct {
	Name        string            `json:"-"`
	Type        json.RawMessage   `json:"type"` // a string or a list of strings, as written
	Enum        []json.RawMessage `json:"enum"`
	Format      string            `json:"format"`
	MaxLength   *int              `json:"maxLength"`
	Title       string            `json:"title"`
	Description string            `json:"description"`
}

// ReadProps reads the properties of an object schema. It returns an error
// when the schema is not a JSON object with readable "properties" and
// "required", or when a property's keywords are not of their JSON types
// (a "maxLength" that is text, a property schema that is true); List then
// still names every declared property, so a caller that needs only the
// names may use it.
func ReadProps(schema json.RawMessage) (Props, error) {
	var top struct {
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(schema, &top); err != nil {
		return Props{}, err
	}
	ps := Props{Required: top.Required}
	if len(top.Properties) == 0 {
		return ps, nil
	}
	names := objectKeys(top.Properties)
	var byName map[string]Prop
	err := json.Unmarshal(top.Properties, &byName)
	ps.List = make([]Prop, len(names))
	for i, name := range names {
		if err == nil {
			ps.List[i] = byName[name]
		}
		ps.List[i].Name = name
	}
	return ps, err
}

// Names are the declared properties' names in document order.
func (ps Props) Names() []string {
	names := make([]string, len(ps.List))
	for i, p := range ps.List {
		names[i] = p.Name
	}
	return names
}

// sortedNames are the declared names sorted, each once (for messages).
func (ps Props) sortedNames() []string {
	return slices.Compact(slices.Sorted(slices.Values(ps.Names())))
}

// Has reports whether the schema declares the property name.
func (ps Props) Has(name string) bool {
	return slices.ContainsFunc(ps.List, func(p Prop) bool { return p.Name == name })
}

// IsRequired reports whether name is in the schema's "required" list.
func (ps Props) IsRequired(name string) bool { return slices.Contains(ps.Required, name) }

// AllowsNull reports whether the type is a list that includes "null".
func (p Prop) AllowsNull() bool {
	var list []string
	return json.Unmarshal(p.Type, &list) == nil && slices.Contains(list, "null")
}

// TypeName is the property's type other than "null": the type when it is
// one string, the first non-null one of a list, empty when none is given.
func (p Prop) TypeName() string {
	var s string
	if json.Unmarshal(p.Type, &s) == nil {
		return s
	}
	var list []string
	if json.Unmarshal(p.Type, &list) == nil {
		for _, t := range list {
			if t != "null" {
				return t
			}
		}
	}
	return ""
}

// ArgType is the type a rule reads the property as: its one type other
// than null, approval.ArgAny when it allows null or several types, or
// names none.
func (p Prop) ArgType() approval.ArgType {
	var types []string
	var one string
	switch {
	case json.Unmarshal(p.Type, &one) == nil:
		types = []string{one}
	case json.Unmarshal(p.Type, &types) == nil:
	}
	if len(types) != 1 {
		return approval.ArgAny // none, several, or one of them null
	}
	switch types[0] {
	case "string":
		return approval.ArgString
	case "number", "integer":
		return approval.ArgNumber
	case "boolean":
		return approval.ArgBool
	case "array":
		return approval.ArgList
	case "object":
		return approval.ArgObject
	}
	return approval.ArgAny
}

// ArgTypes are the declared properties' types as rules read them.
func (ps Props) ArgTypes() map[string]approval.ArgType {
	out := make(map[string]approval.ArgType, len(ps.List))
	for _, p := range ps.List {
		out[p.Name] = p.ArgType()
	}
	return out
}

// objectKeys returns the keys of a JSON object in document order.
func objectKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return keys
		}
		k, _ := t.(string)
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}
