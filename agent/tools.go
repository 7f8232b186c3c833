package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// Tool is an action the model may propose. Implement it to embed
// Countersign as a library; HTTPTools builds tools from the policy file.
//
// Whether a call needs a human is decided by the gate (the policy file), not
// by the tool: Risk and Capabilities describe the tool for cards and for
// policies generated from code.
type Tool interface {
	// Name is the function name the model calls.
	Name() string
	// Description tells the model what the tool does.
	Description() string
	// Schema is the JSON Schema (an object schema) of the arguments. The
	// agent validates every call, and every approver's edit, against it.
	Schema() json.RawMessage
	// Risk is the tool's declared risk level.
	Risk() approval.Risk
	// Capabilities are the tool's declared capabilities, e.g. spend_money.
	Capabilities() []string
	// Preview returns what the call will do, as labelled facts read from
	// the system of record. A source that cannot be read is reported in
	// Preview.Error (with a nil error) or as an error; either way the
	// approval card still goes out, saying so.
	Preview(ctx context.Context, args json.RawMessage) (approval.Preview, error)
	// Run executes the call once. An error becomes an error result for the
	// model; the call is recorded as failed.
	Run(ctx context.Context, inv Invocation) (string, error)
}

// Invocation is one execution of a tool.
type Invocation struct {
	// RequestID identifies the call: the approval request id for gated
	// calls. Use it as the idempotency key of side effects.
	RequestID string
	// Args are the arguments to run with: validated against the schema,
	// without the agent's confidence and reason properties.
	Args json.RawMessage
}

// RetrySafe is implemented by tools whose Run may be repeated with the same
// Invocation.RequestID without repeating the side effect (an idempotency
// key the system of record honours). After a crash, such a call found
// claimed but without an outcome is run again; any other tool's outcome is
// reported as unknown and never re-run.
type RetrySafe interface {
	RetrySafe() bool
}

// Properties the agent adds to every schema offered to the model, stripped
// before validation and execution: the model's confidence and its reason.
// When a tool declares a property of the same name as its own argument, the
// next free candidate is used (e.g. "rationale" for a refund tool with its
// own "reason").
var (
	confidenceProps = []string{"confidence", "model_confidence", "countersign_confidence"}
	reasonProps     = []string{"reason", "rationale", "model_reason", "countersign_reason"}
)

// Descriptions of the agent's properties. agent/scripted recognises them by
// these prefixes.
const (
	ConfidenceDescription = "Optional: your confidence (0 to 1) that this call is correct and intended. Not passed to the tool."
	ReasonDescription     = "Optional: why you propose this call; shown to the approver as your reason. Not passed to the tool."
)

// agentProps names the agent's properties in one tool's schema.
type agentProps struct{ confidence, reason string }

var defaultProps = agentProps{confidence: confidenceProps[0], reason: reasonProps[0]}

// maxExactNumber bounds numbers in arguments: beyond 2^53 a float64 no
// longer holds every integer, so the value executed could differ from the
// value shown on the card.
const maxExactNumber = 1 << 53

// toolset is the tools the agent offers, with compiled schemas.
type toolset struct {
	byName  map[string]*boundTool
	offered []openai.Tool
}

type boundTool struct {
	Tool
	schema *policyfile.Schema
	props  agentProps
	valid  validMemo
}

// maxValid bounds the arguments a tool remembers as valid (validMemo).
const maxValid = 256

// validMemo remembers, by the SHA-256 of their bytes, arguments a tool's
// validate accepted. Validation is a pure function of those bytes (a
// tool's schema never changes), and the arguments of an approved call
// were validated when the model proposed them: the call after a click
// then skips a second decode and schema walk, a twentieth of the click's
// CPU (docs/performance.md). Only acceptances are kept (a refusal is
// worked out again, with its message); full, it starts over.
type validMemo struct {
	mu     sync.Mutex
	m      map[[sha256.Size]byte]struct{}
	misses int // validations run; tests read it
}

func (v *validMemo) has(k [sha256.Size]byte) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.m[k]
	if !ok {
		v.misses++
	}
	return ok
}

func (v *validMemo) add(k [sha256.Size]byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil || len(v.m) >= maxValid {
		v.m = make(map[[sha256.Size]byte]struct{})
	}
	v.m[k] = struct{}{}
}

func newToolset(tools []Tool) (*toolset, error) {
	ts := &toolset{byName: map[string]*boundTool{}}
	for i, t := range tools {
		name := t.Name()
		if name == "" {
			return nil, fmt.Errorf("tools[%d]: empty name", i)
		}
		if _, dup := ts.byName[name]; dup {
			return nil, fmt.Errorf("tools[%d]: duplicate tool %q", i, name)
		}
		sch, offered, props, err := compileSchema(name, t.Schema())
		if err != nil {
			return nil, fmt.Errorf("tools[%d] (%s): %w", i, name, err)
		}
		ts.byName[name] = &boundTool{Tool: t, schema: sch, props: props}
		ts.offered = append(ts.offered, openai.Tool{
			Type: openai.ToolTypeFunction,
			Function: &openai.FunctionDefinition{
				Name:        name,
				Description: t.Description(),
				Parameters:  offered,
			},
		})
	}
	return ts, nil
}

// compileSchema compiles a tool's argument schema and returns the schema
// offered to the model: the same, plus optional confidence and reason
// properties under names the tool does not use.
func compileSchema(name string, raw json.RawMessage) (*policyfile.Schema, json.RawMessage, agentProps, error) {
	var none agentProps
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage(`{"type":"object"}`)
	}
	sch, err := policyfile.CompileSchema(name, raw)
	if err != nil {
		return nil, nil, none, fmt.Errorf("schema: %w", err)
	}
	declared, _ := policyfile.ReadProps(raw) // names only: the compiled schema vouches for the rest
	free := func(candidates []string) (string, error) {
		for _, c := range candidates {
			if !declared.Has(c) {
				return c, nil
			}
		}
		return "", fmt.Errorf("schema: properties %s are all taken; one is needed for the agent", strings.Join(candidates, ", "))
	}
	var ap agentProps
	var err2 error
	if ap.confidence, err2 = free(confidenceProps); err2 != nil {
		return nil, nil, none, err2
	}
	if ap.reason, err2 = free(reasonProps); err2 != nil {
		return nil, nil, none, err2
	}
	// The offered schema is the tool's, written again with the two extra
	// properties.
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, nil, none, fmt.Errorf("schema must be a JSON object: %w", err)
	}
	props, _ := obj["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
	}
	props[ap.confidence] = map[string]any{
		"type": "number", "minimum": 0, "maximum": 1, "description": ConfidenceDescription,
	}
	props[ap.reason] = map[string]any{"type": "string", "description": ReasonDescription}
	obj["properties"] = props
	if _, ok := obj["type"]; !ok {
		obj["type"] = "object"
	}
	offered, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, none, err
	}
	return sch, offered, ap, nil
}

// refusal is why a proposed call may not run, told to the model.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

func refuse(format string, a ...any) error { return &refusal{why: fmt.Sprintf(format, a...)} }

// parseCall splits the model's arguments into the tool arguments
// (canonical JSON, confidence and reason removed) and the agent's
// properties. It refuses anything that is not a JSON object, a confidence
// that is not a number in [0,1], and numbers that are not finite or too
// large to be exact.
func parseCall(raw string, props agentProps) (args json.RawMessage, reason string, confidence *float64, err error) {
	if strings.TrimSpace(raw) == "" {
		raw = "{}"
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, "", nil, refuse("the arguments are not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, "", nil, refuse("the arguments are not a JSON object: trailing data after the object")
	}
	if obj == nil {
		return nil, "", nil, refuse("the arguments are not a JSON object: null")
	}
	if v, ok := obj[props.confidence]; ok {
		n, isNum := v.(json.Number)
		f, ferr := n.Float64()
		if !isNum || ferr != nil || math.IsNaN(f) || f < 0 || f > 1 {
			return nil, "", nil, refuse("%s must be a number between 0 and 1, got %s", props.confidence, compact(v))
		}
		confidence = &f
		delete(obj, props.confidence)
	}
	if v, ok := obj[props.reason]; ok {
		s, isStr := v.(string)
		if !isStr {
			return nil, "", nil, refuse("%s must be a string, got %s", props.reason, compact(v))
		}
		reason = s
		delete(obj, props.reason)
	}
	if err := checkNumbers(obj, "$"); err != nil {
		return nil, "", nil, err
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, "", nil, refuse("the arguments cannot be encoded: %v", err)
	}
	canon, err := approval.Canonical(b)
	if err != nil {
		return nil, "", nil, refuse("the arguments cannot be encoded: %v", err)
	}
	return canon, reason, confidence, nil
}

// checkNumbers refuses numbers that are not finite or beyond ±2^53.
func checkNumbers(v any, path string) error {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > maxExactNumber {
			return refuse("number %s at %s is out of range (must be finite and at most 2^53 in magnitude)", x.String(), path)
		}
	case map[string]any:
		for k, e := range x {
			if err := checkNumbers(e, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range x {
			if err := checkNumbers(e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// validate checks args against the tool's schema, and the number bounds.
func (t *boundTool) validate(args json.RawMessage) error {
	k := sha256.Sum256(args)
	if t.valid.has(k) {
		return nil
	}
	if err := t.validateNew(args); err != nil {
		return err
	}
	t.valid.add(k)
	return nil
}

// validateNew is validate for arguments not known to be valid.
func (t *boundTool) validateNew(args json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return refuse("the arguments are not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return refuse("the arguments are not valid JSON: trailing data")
	}
	if _, ok := v.(map[string]any); !ok {
		return refuse("the arguments are not a JSON object")
	}
	if err := checkNumbers(v, "$"); err != nil {
		return err
	}
	if err := t.schema.Validate(args); err != nil {
		var ae *policyfile.ArgsError
		if errors.As(err, &ae) {
			return refuse("the arguments do not match the %s schema: %s", t.Name(), oneLine(ae.Error()))
		}
		return refuse("the arguments do not match the %s schema: %v", t.Name(), err)
	}
	return nil
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	return strings.Join(strings.Fields(s), " ")
}

func isRetrySafe(t Tool) bool {
	rs, ok := t.(RetrySafe)
	return ok && rs.RetrySafe()
}
