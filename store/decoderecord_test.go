package store_test

import (
	"context"
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

// TestDecisionReplyRecord: the record a decision's reply carries (a
// snapshot, read without a map) decodes as the same snapshot does when a
// hint carries it (decodeSnapshot, then decodeRecord), and as the record
// itself reads: edited, with original arguments, an empty field, the
// encoding's own characters in values.
func TestDecisionReplyRecord(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, func(r *approval.Request) {
		r.Args = json.RawMessage(`{"note":"*3:a:b\n12:","who":"Zoë ☃"}`)
		r.Reason = "line one\nline two: *1:x"
	})
	d := decision(r, approval.VerdictEdit, "U1")
	d.Args = json.RawMessage(`{"note":"edited","who":""}`)
	after, err := decide(ctx, f.s, d)
	if err != nil {
		t.Fatalf("decide = %v", err)
	}
	if len(after.OriginalArgs) == 0 || after.Decision == nil || len(after.Approvals) != 1 {
		t.Fatalf("decide = %+v; want an edited, decided request", after)
	}
	if err := f.rdb.HSet(ctx, f.prefix+":req:{"+r.ID+"}", "result", "", "odd:*9:", "12:x").Err(); err != nil {
		t.Fatal(err)
	}
	fields, err := f.rdb.HGetAll(ctx, f.prefix+":req:{"+r.ID+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	read, err := f.s.Request(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	direct, directOK, viaMap, mapOK, directErr, mapErr := store.DecodeSnapshotRecord(encodeSnapshot(fields))
	if !directOK || !mapOK || directErr != nil || mapErr != nil {
		t.Fatalf("DecodeSnapshotRecord = %v, %v, %v, %v; want both read", directOK, mapOK, directErr, mapErr)
	}
	if !reflect.DeepEqual(direct, viaMap) || !reflect.DeepEqual(direct, read) {
		t.Errorf("from the reply %+v\nfrom a hint %+v\nread %+v\nwant all equal", direct, viaMap, read)
	}
}

// FuzzDecisionReplyRecord: whatever a snapshot holds, reading it without a
// map takes it for a snapshot exactly when the hub does, and decodes the
// same request (or the same error).
func FuzzDecisionReplyRecord(f *testing.F) {
	f.Add(encodeSnapshot(map[string]string{"base": `{"id":"req_1","quorum":1}`, "status": "approved", "args": `{}`,
		"approvals": `[{"verdict":"approve"}]`, "decision": `{"verdict":"approve"}`, "original_args": "", "quorum": "2"}))
	f.Add(encodeSnapshot(map[string]string{"base": `{"id":"req_1"}`, "base ": "x", "card": `{"channel":"C1","ts":"1.2"}`, "grant": `{"id":"g"}`}))
	f.Add("*4:base2:{}4:base14:{\"id\":\"req_2\"}")
	f.Add("*")
	f.Add("*5:ab")
	f.Fuzz(func(t *testing.T, msg string) {
		direct, directOK, viaMap, mapOK, directErr, mapErr := store.DecodeSnapshotRecord(msg)
		if directOK != mapOK {
			t.Fatalf("snapshot read without a map: %v, by the hub: %v", directOK, mapOK)
		}
		if (directErr == nil) != (mapErr == nil) || (directErr != nil && directErr.Error() != mapErr.Error()) {
			t.Fatalf("errors %v and %v", directErr, mapErr)
		}
		if !reflect.DeepEqual(direct, viaMap) {
			t.Fatalf("without a map %+v, by the hub %+v", direct, viaMap)
		}
	})
}
