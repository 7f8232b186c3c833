package approval

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// briefSeeds are data the stream holds (written by encoding/json) and
// data it should not but might: other types, escapes, duplicate and
// case-folded names, nulls, whitespace.
var briefSeeds = []string{
	`{"call_id":"c1","args":{"to":"ops@example.com","n":[1,{"x":"}"}]},"digest":"d","deadline":"0001-01-01T00:00:00Z","quorum":1,"signals":null,"preview":{},"created":"2026-01-01T00:00:00Z","reason":"","confidence":0.8,"requester":"api:mailer","kind":"contact"}`,
	`{"verdict":"approve","digest":"d","status":"approved","created":"2026-01-01T00:00:00Z","decision_ms":20000}`,
	`{"verdict":"edit","args":{"a":1},"original_args":{"a":2},"decision_ms":-5}`,
	` { "requester" : "a" , "requester" : null , "confidence" : 1e-3 , "confidence" : null } `,
	`{"Requester":"folded"}`,
	`{"REQUESTER":"x","requester":"y"}`,
	`{"requester":"caf\u00e9"}`,
	`{"requester":"café"}`,
	`{"requester":"a\"b"}`,
	`{"req\u0075ester":"escaped name"}`,
	`{"decision_ms":1.5}`,
	`{"decision_ms":99999999999999999999}`,
	`{"decision_ms":"20"}`,
	`{"confidence":"high"}`,
	`{"confidence":1e400}`,
	`{"args":null}`,
	`{"args":"text"}`,
	`{"verdict":7}`,
	`{"kind":true}`,
	`{}`,
	`null`,
	`[1,2]`,
	`{"args":{"a":"b"}`,
	`{"args":1}x`,
	"{\"requester\":\"\xff\"}",
	`{"ſerdict":"long s folds to s"}`,
	`{"K` + "\u212a" + `ind":"kelvin"}`,
	`{"a":[1,-0.5e+3,true,false,null,"\u00e9\n",{}],"b":-01}`,
	`{"to":"ops@example.com","subject":"Nightly report 7","to":"x"}`, `{"a":{"b":[1,"]"]}, "c" : 2 }`,
	`{"a":01}`, `{"a":1.}`, `{"a":1e}`, `{"a":"\x"}`, `{"a":"\u12g4"}`, "{\"a\":\"\t\"}", `{"a" 1}`, `{"a":1,}`, `[1,]`, `{,}`, `tru`, `nul`, `-`,
	`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
}

// FuzzScanBrief: whatever scanBrief reads, json.Unmarshal reads the same;
// what validJSON accepts, json.Valid accepts.
func FuzzScanBrief(f *testing.F) {
	for _, s := range briefSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if validJSON(data) && !json.Valid(data) {
			t.Fatalf("validJSON(%q) = true, json.Valid says false", data)
		}
		// Below maxDepth (brackets in strings count too), they agree.
		if json.Valid(data) && !validJSON(data) && bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) <= maxDepth {
			t.Fatalf("validJSON(%q) = false, json.Valid says true", data)
		}
		checkMembers(t, data)
		got, ok := scanBrief(data)
		if !ok {
			return
		}
		var want Brief
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("scanBrief(%s) read %+v; json.Unmarshal fails: %v", data, got, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("scanBrief(%s) = %+v, json.Unmarshal reads %+v", data, got, want)
		}
	})
}

// TestDecodeBrief: a Brief holds what DecodeEvent reads of a request and
// a decision, for data written as the stream writes it and for data only
// decodable field by field.
func TestDecodeBrief(t *testing.T) {
	conf := 0.8
	req := RequestedEvent{CallID: "c1", Args: json.RawMessage(`{"to":"ops@example.com"}`), Quorum: 2, Requester: "api:mailer",
		Kind: KindContact, Confidence: &conf, Created: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Signals: []Signal{{Code: SignalWhenRule, Text: "x"}}}
	data, _ := json.Marshal(req)
	dec, _ := json.Marshal(DecidedEvent{Verdict: VerdictReject, DecisionMS: 20000, Text: "no"})
	tests := []struct {
		name string
		e    Entry
		want Brief
	}{
		{"request", Entry{Event: EventRequested, Data: data}, Brief{Args: req.Args, Requester: "api:mailer", Kind: KindContact, Confidence: &conf}},
		{"decision", Entry{Event: EventDecided, Data: dec}, Brief{Verdict: VerdictReject, DecisionMS: 20000}},
		{"vote", Entry{Event: EventApprovalVote, Data: dec}, Brief{Verdict: VerdictReject, DecisionMS: 20000}},
		// quorum of the wrong type: the whole does not decode, DecodeEvent
		// reads the rest field by field, and so does DecodeBrief.
		{"a field of another type", Entry{Event: EventRequested, Data: json.RawMessage(`{"quorum":"two","requester":"api:mailer","args":{}}`)},
			Brief{Args: json.RawMessage(`{}`), Requester: "api:mailer"}},
		{"a decision time of another type", Entry{Event: EventDecided, Data: json.RawMessage(`{"verdict":"approve","decision_ms":"20s"}`)},
			Brief{Verdict: VerdictApprove}},
		{"no data", Entry{Event: EventDecided}, Brief{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DecodeBrief(tc.e)
			if !ok || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DecodeBrief = %+v, %v; want %+v, true", got, ok, tc.want)
			}
		})
	}
	// The data the stream writes takes the quick path.
	for _, d := range [][]byte{data, dec} {
		if _, ok := scanBrief(d); !ok {
			t.Errorf("scanBrief(%s) not ok: every entry would be unmarshalled", d)
		}
	}
	if _, ok := DecodeBrief(Entry{Event: EventExecuting, Data: json.RawMessage(`{"args":{}}`)}); ok {
		t.Error("DecodeBrief(executing) ok; want false (DecodeEvent reads it)")
	}
}

// checkMembers: what Members gives, json.Unmarshal into a map reads (the
// last of a name given twice).
func checkMembers(t *testing.T, data []byte) {
	got := map[string]json.RawMessage{}
	if !Members(data, func(k string, v []byte) { got[k] = v }) {
		return
	}
	var want map[string]json.RawMessage
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("Members(%s) read %v; json.Unmarshal fails: %v", data, got, err)
	}
	if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("Members(%s) = %q, json.Unmarshal reads %q", data, got, want)
	}
}
