package store_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestDecodeRecordApprovals: a record's approvals decode to what the
// field holds, whether its one approval is the decision itself (decoded
// once) or not, and the request's approvals share no memory with its
// decision.
func TestDecodeRecordApprovals(t *testing.T) {
	approve := `{"request_id":"req_1","verdict":"approve","approver":"U1","at":"2026-12-02T09:00:00Z","digest":"d1"}`
	approve2 := `{"request_id":"req_1","verdict":"approve","approver":"U2","at":"2026-12-02T09:01:00Z","digest":"d1"}`
	edit := `{"request_id":"req_1","verdict":"edit","args":{"amount":5},"approver":"U1","at":"2026-12-02T09:00:00Z","digest":"d2","quorum":1,"signals":[{"code":"c","text":"t"}]}`
	for _, tc := range []struct {
		name                string
		approvals, decision string
	}{
		{"one approval, the decision", "[" + approve + "]", approve},
		{"an edit, the decision", "[" + edit + "]", edit},
		{"a quorum of two", "[" + approve + "," + approve2 + "]", approve2},
		{"spaced", "[ " + approve + "]", approve},
		{"another approval", "[" + approve + "]", approve2},
		{"approvals, no decision", "[" + approve + "]", ""},
		{"a decision, no approvals", "", approve},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := map[string]string{"base": `{"id":"req_1","tool":"refund"}`, "status": "approved", "args": `{}`}
			var want approval.Request
			if tc.approvals != "" {
				f["approvals"] = tc.approvals
				if err := json.Unmarshal([]byte(tc.approvals), &want.Approvals); err != nil {
					t.Fatal(err)
				}
			}
			if tc.decision != "" {
				f["decision"] = tc.decision
				want.Decision = new(approval.Decision)
				if err := json.Unmarshal([]byte(tc.decision), want.Decision); err != nil {
					t.Fatal(err)
				}
			}
			got, err := store.DecodeRecord(f)
			if err != nil {
				t.Fatalf("DecodeRecord = %v", err)
			}
			if !reflect.DeepEqual(got.Approvals, want.Approvals) || !reflect.DeepEqual(got.Decision, want.Decision) {
				t.Fatalf("DecodeRecord = approvals %+v, decision %+v; want %+v, %+v", got.Approvals, got.Decision, want.Approvals, want.Decision)
			}
			for i := range got.Approvals {
				a := &got.Approvals[i]
				if len(a.Args) > 0 && got.Decision != nil && len(got.Decision.Args) > 0 && &a.Args[0] == &got.Decision.Args[0] {
					t.Errorf("approval %d's arguments share memory with the decision's", i)
				}
				if len(a.Signals) > 0 && got.Decision != nil && len(got.Decision.Signals) > 0 && &a.Signals[0] == &got.Decision.Signals[0] {
					t.Errorf("approval %d's signals share memory with the decision's", i)
				}
			}
		})
	}
}

// TestDecodeRecordBadApprovals: a record whose one approval is its
// decision, malformed, is refused as its approvals are, first.
func TestDecodeRecordBadApprovals(t *testing.T) {
	bad := `{"request_id":1}`
	f := map[string]string{"base": `{"id":"req_1"}`, "status": "approved", "approvals": "[" + bad + "]", "decision": bad}
	if _, err := store.DecodeRecord(f); err == nil || !strings.Contains(err.Error(), "decode record approvals") {
		t.Fatalf("DecodeRecord = %v, want an approvals error", err)
	}
}
