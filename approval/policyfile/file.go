// Package policyfile reads and validates Countersign's versioned policy and
// tools YAML file. Errors name the offending key path, e.g.
// "tools[2].review.when: undeclared reference 'arg'".
package policyfile

import (
	"encoding/json"
	"time"

	"github.com/countersign/countersign/approval"
)

// File is a parsed, validated policy file.
type File struct {
	Version int
	Slack   Slack
	Agent   Agent
	// Policy is what the gate applies (defaults already merged per tool).
	Policy approval.Policy
	// Tools are the tool declarations, in file order.
	Tools []Tool
}

// Slack holds workspace settings.
type Slack struct {
	// ApprovalsChannel is the channel id where cards are posted (required).
	ApprovalsChannel string
	// TaskChannels, when non-empty, is the allow-list of channels where
	// mentions start runs (DMs are always allowed).
	TaskChannels []string
}

// Agent holds agent loop settings.
type Agent struct {
	SystemPrompt    string
	MaxSteps        int // default 8
	StopOnRejection bool
	Templates       Templates
}

// Templates are the messages fed back to the model (text/template syntax,
// fields: .Tool .Approver .Reason .Response .Changes .Args).
type Templates struct {
	Rejected string
	Edited   string
	Expired  string
	Unknown  string
}

// Tool is one tool declaration.
type Tool struct {
	Name        string
	Description string
	// Schema is the JSON Schema of the arguments (an object schema).
	Schema  json.RawMessage
	HTTP    *HTTPSpec
	Preview *PreviewSpec
}

// HTTPSpec declares an HTTP tool. URL, header values and Body are
// text/template strings over .Args, .RequestID and env "NAME" (secrets,
// never logged or audited).
type HTTPSpec struct {
	Method       string
	URL          string
	Headers      map[string]string
	Body         string
	Timeout      time.Duration
	MaxBodyBytes int64
}

// PreviewSpec declares a system-of-record lookup for the card: an HTTP GET
// whose JSON response fills labelled fields.
type PreviewSpec struct {
	URL     string
	Headers map[string]string
	Timeout time.Duration
	Summary string // text/template over .Args and .Data
	// Fields map a label to a dotted path into the response JSON, e.g.
	// {"Customer": "customer.name"}, in file order.
	Fields []PreviewField
}

// PreviewField is one labelled value taken from the preview response.
type PreviewField struct {
	Label string
	Path  string
}
