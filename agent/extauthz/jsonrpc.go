package extauthz

// This file: reading the forwarded MCP body, by exact keys, in one pass
// each (jsontext: what Countersign shows and what the upstream runs must
// be one value).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// rpc is one JSON-RPC message of the MCP body, read by exact key (see
// members).
type rpc struct {
	ID     json.RawMessage
	Method string
	Params json.RawMessage
}

// CallParams are a tools/call's params.
type CallParams struct {
	Name      string
	Arguments json.RawMessage
	Reason    string // _meta.reason
}

// Reading options. encoding/json matches struct fields case-insensitively,
// so {"method":"tools/call","Method":"tools/list"} would read as
// tools/list while the upstream runs tools/call: keys are compared exactly
// (jsontext compares names as written, unescaped), and an object holding
// a key twice is refused (parsers disagree on which one counts).
//
// The body's top level is read leniently: only its own keys are checked,
// for a message Countersign lets through unread (initialize, a response)
// is the upstream's business. The params of a gated method are read
// strictly (RFC 7493): no object in them holds a key twice, at any depth,
// and their text is UTF-8, so no two readers can see two calls in them.
var (
	lenient = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}
	strict  = []jsontext.Options{jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)}
)

// members calls fn with each member of the JSON object raw, in order: its
// name (unescaped) and its value (raw's own bytes), read with opts (lenient
// or strict). A key twice in the object itself is refused whatever opts
// say; so is anything after the object.
func members(raw []byte, opts []jsontext.Options, fn func(name string, v []byte) error) error {
	r := readers.Get().(*reader)
	defer r.put()
	// A bytes.Buffer is read in place: the values are raw's bytes, found
	// by their offsets.
	r.buf = *bytes.NewBuffer(raw)
	d := r.d
	d.Reset(&r.buf, opts...)
	if d.PeekKind() != '{' {
		return errors.New("not a JSON object")
	}
	if _, err := d.ReadToken(); err != nil {
		return readError(err)
	}
	var names []string // this object's, for lenient (strict refuses a key twice itself)
	for d.PeekKind() != '}' {
		tok, err := d.ReadToken()
		if err != nil {
			return readError(err)
		}
		name := tok.String()
		if slices.Contains(names, name) {
			return fmt.Errorf("key %q appears twice", name)
		}
		names = append(names, name)
		v, err := d.ReadValue()
		if err != nil {
			return readError(err)
		}
		end := int(d.InputOffset())
		if err := fn(name, raw[end-len(v):end:end]); err != nil {
			return err
		}
	}
	if _, err := d.ReadToken(); err != nil {
		return readError(err)
	}
	if _, err := d.ReadToken(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}

// reader is a decoder and the buffer it reads, kept for the next body
// (readers): a check reads two or three objects.
type reader struct {
	buf bytes.Buffer
	d   *jsontext.Decoder
}

var readers = sync.Pool{New: func() any {
	r := new(reader)
	r.d = jsontext.NewDecoder(&r.buf)
	return r
}}

// put returns r to readers, holding nothing of what it read.
func (r *reader) put() {
	r.buf = bytes.Buffer{}
	r.d.Reset(&r.buf)
	readers.Put(r)
}

// readError says what is wrong with a body or params jsontext could not
// read: a key twice as "key … appears twice", as members says it.
func readError(err error) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) && se.Err == jsontext.ErrDuplicateName {
		return fmt.Errorf("key %q appears twice", se.JSONPointer.LastToken())
	}
	return err
}

// str reads a member that must be a JSON string when present (null reads
// as absent, as encoding/json reads it).
func str(v []byte, key string) (string, error) {
	switch jsontext.Value(v).Kind() {
	case 'n':
		return "", nil
	case '"':
		s, err := jsontext.AppendUnquote(nil, v)
		return string(s), err
	}
	return "", fmt.Errorf("%s is not a string", key)
}

// readRPC reads one JSON-RPC message (its top level leniently: see
// lenient).
func readRPC(raw []byte) (m rpc, err error) {
	err = members(raw, lenient, func(name string, v []byte) (err error) {
		switch name {
		case "id":
			m.ID = v
		case "method":
			m.Method, err = str(v, "method")
		case "params":
			m.Params = v
		}
		return err
	})
	return m, err
}

// ReadCall reads a tools/call's params by their exact keys, refusing an
// object that holds a key twice anywhere in them, or text that is not
// UTF-8 (strict).
func ReadCall(raw json.RawMessage) (p CallParams, err error) {
	err = members(raw, strict, func(name string, v []byte) (err error) {
		switch name {
		case "name":
			p.Name, err = str(v, "name")
		case "arguments":
			p.Arguments = v
		case "_meta":
			_ = members(v, strict, func(name string, v []byte) error {
				if name == "reason" {
					p.Reason, _ = str(v, "reason")
				}
				return nil
			})
		}
		return err
	})
	return p, err
}

// ReadResource reads a resources/read's params (strictly, by exact keys):
// its uri, "" when absent.
func ReadResource(raw json.RawMessage) (uri string, err error) {
	err = members(raw, strict, func(name string, v []byte) (err error) {
		if name == "uri" {
			uri, err = str(v, "uri")
		}
		return err
	})
	return uri, err
}

// ReadPrompt reads a prompts/get's params (strictly, by exact keys): its
// name ("" when absent) and arguments, an object of strings.
func ReadPrompt(raw json.RawMessage) (name string, args map[string]string, err error) {
	err = members(raw, strict, func(key string, v []byte) (err error) {
		switch key {
		case "name":
			name, err = str(v, "name")
		case "arguments":
			if string(v) != "null" && json.Unmarshal(v, &args) != nil {
				err = errors.New("arguments is not an object of strings")
			}
		}
		return err
	})
	return name, args, err
}
