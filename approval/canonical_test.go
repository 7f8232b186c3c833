package approval_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/countersign/countersign/approval"
)

// canonicalSeeds are values the audit and the digests meet, and the
// corners of JSON's text: escapes, numbers, UTF-8, key order.
var canonicalSeeds = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-7`, `1E+2`, `true`, `false`, `null`,
	`{"q":"1234"}`, `{"amount":5000,"order_id":"1"}`, `{"order_id":"1","amount":5000}`,
	`{"a":{"b":[1,2,{"c":null}]},"d":"x"}`, `{"a":1,"a":2}`, `{"":1,"a":2}`, `{"a":1,"":2}`,
	`{"s":"tab\there"}`, `{"s":"\u0009"}`, `{"s":"\b\f\n\r\t\"\\"}`, `{"s":"\u0008\u000c"}`,
	`{"s":"\u001f\u0000\u007f"}`, `{"s":"\u001F"}`, `{"s":"\/"}`, `{"s":"\u0041"}`,
	`{"s":"<&>"}`, `{"s":"\u003c"}`, `{"s":"\u2028\u2029"}`, "{\"s\":\"\u2028\"}",
	"{\"s\":\"\x7f\"}", "{\"s\":\"\xff\"}", "{\"s\":\"\xed\xa0\x80\"}", `{"s":"\ud800"}`, `{"s":"\ud83d\ude00"}`,
	"{\"s\":\"\U0001F600 é\"}", `{"s":"\ufffd"}`, "{\"s\":\"\xef\xbf\xbd\"}",
	`{"a":1 }`, ` {"a":1}`, `{"a":1}]`, `{"a":1}}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`,
	`[1,2,]`, `[,1]`, `{"a":1,}`, `{"b":1,"a":{"z":1,"y":2}}`, `{"a\u0062":1}`, `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	`"x" "y"`, `nul`, `truex`,
}

// FuzzCanonicalAsIs: a value canonicalAsIs takes as it is is exactly what
// the long way (decode, encode with keys sorted) writes of it, so the
// audit chain's hashes and the approvals' digests are those they were.
func FuzzCanonicalAsIs(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	check := func(t *testing.T, raw []byte) {
		if !approval.CanonicalAsIs(raw) {
			return
		}
		long, err := approval.CanonicalLong(raw)
		if err != nil {
			t.Fatalf("%q is taken as it is, but the long way refuses it: %v", raw, err)
		}
		if !bytes.Equal(long, raw) {
			t.Fatalf("%q is taken as it is, but the long way writes %q", raw, long)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		check(t, raw)
		// What the long way writes is canonical by definition: its
		// escapes and orders are those the short way must know.
		if long, err := approval.CanonicalLong(raw); err == nil {
			check(t, long)
		}
	})
}

// TestCanonicalAsIs: what the audit and the digests usually meet is taken
// as it is (the short way is the usual one), what is not canonical is
// not, and Canonical gives the same bytes either way.
func TestCanonicalAsIs(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		asIs bool
	}{
		{`{"q":"1234"}`, true},
		{`{"amount":5000,"order_id":"1","reason":"duplicate charge \u0026 more"}`, false}, // \u0026: the long way writes &
		{`{"amount":5000,"order_id":"1","reason":"line\nbreak, <b> & \"quotes\""}`, true},
		{`{"arguments":{"q":"1234"},"tool":"lookup","why":"é \u2028"}`, true},
		{`{"order_id":"1","amount":5000}`, false},
		{`{"a":1,"a":2}`, false},
		{`{"a": 1}`, false},
		{`[1,2,3]`, true},
		{"\"\xff\"", false},
		{`{"n":-0.5e+10}`, true},
	} {
		if got := approval.CanonicalAsIs([]byte(tt.raw)); got != tt.asIs {
			t.Errorf("CanonicalAsIs(%s) = %v, want %v", tt.raw, got, tt.asIs)
		}
		c, err := approval.Canonical([]byte(tt.raw))
		long, lerr := approval.CanonicalLong([]byte(tt.raw))
		if !bytes.Equal(c, long) || (err == nil) != (lerr == nil) {
			t.Errorf("Canonical(%s) = %q, %v; the long way %q, %v", tt.raw, c, err, long, lerr)
		}
	}
}

// BenchmarkChainHash: hashing an audit entry whose data is canonical, as
// every entry's is once redacted (taken as it is), and one whose keys are
// out of order (the long way).
//
//	go test ./approval -run '^$' -bench ChainHash
func BenchmarkChainHash(b *testing.B) {
	for _, data := range []string{
		`{"arguments":{"amount":5000,"order_id":"1"},"decision":"auto","risk":"low","rule":"lookup never reviewed"}`,
		`{"rule":"lookup never reviewed","risk":"low","decision":"auto","arguments":{"order_id":"1","amount":5000}}`,
	} {
		name := "canonical"
		if !approval.CanonicalAsIs([]byte(data)) {
			name = "unsorted"
		}
		b.Run(name, func(b *testing.B) {
			e := approval.Entry{Seq: 42, Event: approval.EventAssessed, RequestID: "req_1", Actor: "agent", Tool: "lookup", Data: []byte(data)}
			b.ReportAllocs()
			for b.Loop() {
				approval.ChainHash("prev", e)
			}
		})
	}
}

// FuzzDecodeCompact: a value decodeCompact decodes is what encoding/json
// decodes of it (numbers as written), so Redact and BoundData see the
// same values either way.
func FuzzDecodeCompact(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"call_id":"c1","needs_human":false,"signals":null,"quorum":0}`))
	f.Add([]byte(`{"a":"x\"y","a":2,"b":[{},[],"\u00e9"]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, canonical, ok := approval.DecodeCompact(raw)
		if !ok {
			return
		}
		long, lok := approval.DecodeJSONLong(raw)
		if !lok {
			t.Fatalf("%q decodes the short way to %#v, but the long way refuses it", raw, v)
		}
		if !reflect.DeepEqual(v, long) {
			t.Fatalf("%q decodes the short way to %#v, the long way to %#v", raw, v, long)
		}
		if enc := approval.EncodeJSON(long); canonical && !bytes.Equal(enc, raw) {
			t.Fatalf("%q is said canonical, but encoding its value writes %q", raw, enc)
		}
	})
}

// TestDecodeCompact: an audit entry's data and compact arguments are
// decoded the short way.
func TestDecodeCompact(t *testing.T) {
	for _, raw := range []string{
		`{"call_id":"c1","needs_human":false,"signals":["refund over 1,000 EUR"],"quorum":2}`,
		`{"order_id":"1","amount":5000,"note":"é \"quoted\" \u2028"}`,
		`[1,-2.5e3,true,false,null,"x"]`,
	} {
		v, _, ok := approval.DecodeCompact([]byte(raw))
		long, _ := approval.DecodeJSONLong([]byte(raw))
		if !ok || !reflect.DeepEqual(v, long) {
			t.Errorf("DecodeCompact(%s) = %#v, %v; want %#v, true", raw, v, ok, long)
		}
	}
	for _, tt := range []struct {
		raw       string
		canonical bool
	}{
		{`{"call_id":"c1","needs_human":false,"quorum":2,"signals":["x"]}`, true},
		{`{"needs_human":false,"call_id":"c1"}`, false},
		{`{"a":1,"a":2}`, false},
		{`{"s":"\u00e9"}`, false},
		{`[1,"é",null,{"":true}]`, true},
	} {
		if _, canonical, ok := approval.DecodeCompact([]byte(tt.raw)); !ok || canonical != tt.canonical {
			t.Errorf("DecodeCompact(%s) canonical = %v, %v; want %v, true", tt.raw, canonical, ok, tt.canonical)
		}
	}
	for _, raw := range []string{`{"a": 1}`, ` [1]`, `{"a":1}x`, `{"a":01}`, "\"\x01\""} {
		if _, _, ok := approval.DecodeCompact([]byte(raw)); ok {
			t.Errorf("DecodeCompact(%q) decoded it; want the long way to", raw)
		}
	}
}
