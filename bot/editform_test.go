package bot_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
)

// TestEditSchemaErrorsReadable submits edits that break each kind of
// schema rule and checks that the field says so in plain words, not in
// the validator's "minLength: got 2, want 3".
func TestEditSchemaErrorsReadable(t *testing.T) {
	levels := make([]string, 101) // more than a select holds: a text input
	for i := range levels {
		levels[i] = fmt.Sprintf("l%03d", i)
	}
	levelsJSON, _ := json.Marshal(levels)
	// Draft-07, so "format" is asserted, not just an annotation.
	schema := `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "subject": {"type": "string", "minLength": 3, "maxLength": 12, "pattern": "^[A-Z]"},
    "count":   {"type": "integer", "minimum": 0, "maximum": 1000},
    "ratio":   {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
    "email":   {"type": "string", "format": "email"},
    "level":   {"type": "string", "enum": ` + string(levelsJSON) + `},
    "tags":    {"type": "array", "maxItems": 2},
    "agree":   {"type": "boolean"}
  },
  "required": ["subject", "count", "agree"]
}`
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: func(f *policyfile.File) {
		f.Tools[0].Schema = json.RawMessage(schema)
	}})
	r := h.request(func(r *approval.Request) {
		r.Args = json.RawMessage(`{"subject":"Hello","count":1,"ratio":0.5,"email":"a@example.com","level":"l001","tags":[]}`)
	})
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	agree := map[string]any{"v": []string{"true"}} // block f6, required
	tests := []struct {
		name   string
		values map[string]map[string]any
		want   map[string]string
	}{
		{"too short", map[string]map[string]any{"f0": {"v": "Hi"}, "f6": agree},
			map[string]string{"f0": "At least 3 characters."}},
		{"too long", map[string]map[string]any{"f0": {"v": "Hello there, you"}, "f6": agree},
			map[string]string{"f0": "At most 12 characters."}},
		{"pattern", map[string]map[string]any{"f0": {"v": "hello"}, "f6": agree},
			map[string]string{"f0": "Doesn't match the required format (^[A-Z])."}},
		{"two rules on one field", map[string]map[string]any{"f0": {"v": "hi"}, "f6": agree},
			map[string]string{"f0": "At least 3 characters. Doesn't match the required format (^[A-Z])."}},
		{"maximum", map[string]map[string]any{"f1": {"v": "1001"}, "f6": agree},
			map[string]string{"f1": "Must be at most 1,000."}},
		{"minimum", map[string]map[string]any{"f1": {"v": "-1"}, "f6": agree},
			map[string]string{"f1": "Must be at least 0."}},
		{"exclusive minimum", map[string]map[string]any{"f2": {"v": "0"}, "f6": agree},
			map[string]string{"f2": "Must be more than 0."}},
		{"exclusive maximum", map[string]map[string]any{"f2": {"v": "1.5"}, "f6": agree},
			map[string]string{"f2": "Must be less than 1.5."}},
		{"email", map[string]map[string]any{"f3": {"v": "a@-example-"}, "f6": agree},
			map[string]string{"f3": "Enter a valid email address."}},
		{"enum", map[string]map[string]any{"f4": {"v": "nope"}, "f6": agree},
			map[string]string{"f4": "Choose one of: l000, l001, l002, l003, l004, l005, l006, l007, l008, l009, … (91 more)."}},
		{"type", map[string]map[string]any{"f5": {"v": `{"a":1}`}, "f6": agree},
			map[string]string{"f5": "Must be a list."}},
		{"max items", map[string]map[string]any{"f5": {"v": `[1,2,3]`}, "f6": agree},
			map[string]string{"f5": "At most 2 items."}},
		{"required", map[string]map[string]any{},
			map[string]string{"f6": "Required."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := h.ws.SubmitView(bob, v.ID, tt.values)
			if err != nil {
				t.Fatalf("SubmitView: %v", err)
			}
			if res.ResponseAction != "errors" || len(res.Errors) != len(tt.want) {
				t.Fatalf("SubmitView(%v) = %+v, want errors %v", tt.values, res, tt.want)
			}
			for block, want := range tt.want {
				if got := res.Errors[block]; got != want {
					t.Errorf("error on %s = %q, want %q", block, got, want)
				}
			}
			for block, got := range res.Errors {
				if strings.Contains(got, "got") && strings.Contains(got, "want") {
					t.Errorf("error on %s = %q, reads like the validator", block, got)
				}
			}
		})
	}
	if got := h.load(r.ID); got.Status != approval.StatusPending {
		t.Fatalf("status after refused edits = %s, want pending", got.Status)
	}
}

// TestEditErrorsLandOnAnInput: when the first property is too long to edit
// (a read-only note in the modal, not an input), an error about the whole
// object or about a property not in the form goes on an input that is
// there: Slack refuses an "errors" answer naming any other block and shows
// the approver a generic failure instead.
func TestEditErrorsLandOnAnInput(t *testing.T) {
	schema := `{
  "type": "object",
  "properties": {
    "body": {"type": "string"},
    "cc":   {"type": "string"},
    "bcc":  {"type": "string"}
  },
  "dependentRequired": {"cc": ["bcc"]}
}`
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, policy: func(f *policyfile.File) {
		f.Tools[0].Schema = json.RawMessage(schema)
	}})
	r := h.request(func(r *approval.Request) {
		r.Args = json.RawMessage(`{"body":"` + strings.Repeat("b", 4000) + `"}`)
	})
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	if strings.Contains(string(v.Blocks), `"block_id":"f0","element"`) {
		t.Fatalf("the 4000-char body is an input; the test needs it shown read-only: %s", v.Blocks)
	}
	res, err := h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "x@example.com"}})
	if err != nil {
		t.Fatalf("SubmitView(cc without bcc) = %v, want field errors Slack accepts", err)
	}
	if res.ResponseAction != "errors" || !strings.Contains(res.Errors["f1"], "bcc") {
		t.Fatalf("cc without bcc = %+v, want an error on f1 (cc) naming bcc", res)
	}
	res, err = h.ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "x@example.com"}, "f2": {"v": "y@example.com"}})
	if err != nil || !res.Closed {
		t.Fatalf("valid edit = %+v, %v; want closed", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	var args map[string]string
	_ = json.Unmarshal(got.Args, &args)
	if args["body"] != strings.Repeat("b", 4000) || args["cc"] != "x@example.com" || args["bcc"] != "y@example.com" {
		t.Errorf("edited args = %.200s…, want the body kept and cc, bcc set", got.Args)
	}
}

// TestEditNullableNumber: a nullable number holding null opens as an empty
// number input (Slack refuses "null" as its initial value), and submitting
// the modal unchanged keeps the null: an approval of the same arguments.
func TestEditNullableNumber(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.HTTP, policy: func(f *policyfile.File) {
		f.Tools[0].Schema = json.RawMessage(`{"type":"object","properties":{
			"order_id":{"type":"string"},"amount":{"type":["integer","null"]}},"required":["order_id","amount"]}`)
	}})
	r := h.request(func(r *approval.Request) { r.Args = json.RawMessage(`{"amount":null,"order_id":"1234"}`) })
	if err := h.ws.Click(bob, approvals, r.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	v := h.openView(bob, "cs_edit")
	if strings.Contains(string(v.Blocks), `"initial_value":"null"`) {
		t.Errorf("number input pre-filled with null: %s", v.Blocks)
	}
	res, err := h.ws.SubmitView(bob, v.ID, nil)
	if err != nil || !res.Closed {
		t.Fatalf("unchanged submit = %+v, %v; want closed", res, err)
	}
	got := h.waitStatus(r.ID, approval.StatusApproved)
	if got.Decision.Verdict != approval.VerdictApprove || !strings.Contains(string(got.Args), `"amount":null`) {
		t.Errorf("decision %s with args %s, want an approval of the same arguments", got.Decision.Verdict, got.Args)
	}

	// Emptying a nullable number sets it to null.
	r2 := h.request(func(r *approval.Request) { r.Args = json.RawMessage(`{"amount":5,"order_id":"1234"}`) })
	if err := h.ws.Click(bob, approvals, r2.Card.TS, "cs_edit"); err != nil {
		t.Fatal(err)
	}
	var v2 slacksim.View
	h.waitWS("second edit modal", func() bool {
		for _, x := range h.ws.OpenViews(bob) {
			if x.CallbackID == "cs_edit" && strings.Contains(x.PrivateMetadata, r2.ID) {
				v2 = x
				return true
			}
		}
		return false
	})
	res, err = h.ws.SubmitView(bob, v2.ID, map[string]map[string]any{"f1": {"v": ""}})
	if err != nil || !res.Closed {
		t.Fatalf("emptied amount = %+v, %v; want closed", res, err)
	}
	got = h.waitStatus(r2.ID, approval.StatusApproved)
	if got.Decision.Verdict != approval.VerdictEdit || !strings.Contains(string(got.Args), `"amount":null`) {
		t.Errorf("decision %s with args %s, want an edit setting amount to null", got.Decision.Verdict, got.Args)
	}
}
