package auditreport_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval/auditreport"
)

func TestParseSince(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"24h", 24 * time.Hour, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"", 0, false},
		{"0s", 0, false},
		{"-1h", 0, false},
		{"d", 0, false},
		{"week", 0, false},
	}
	for _, tt := range tests {
		got, err := auditreport.ParseSince(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseSince(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		in     []float64
		q      float64
		wanted float64
	}{
		{[]float64{7}, 0.5, 7},
		{[]float64{7}, 0.9, 7},
		{[]float64{1, 2, 3}, 0.5, 2},
		{[]float64{2, 4, 6, 8}, 0.5, 5},
		{[]float64{2, 4, 6, 8}, 0.9, 7.4},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9, 9.1},
	}
	for _, tt := range tests {
		if got := auditreport.Quantile(tt.in, tt.q); math.Abs(got-tt.wanted) > 1e-9 {
			t.Errorf("Quantile(%v, %v) = %v, want %v", tt.in, tt.q, got, tt.wanted)
		}
	}
}

func TestArgDiff(t *testing.T) {
	tests := []struct {
		name, before, after string
		want                []string
	}{
		{"same", `{"a":1}`, `{"a":1}`, nil},
		{"changed", `{"a":1,"b":"x"}`, `{"a":2,"b":"x"}`, []string{"a: 1 → 2"}},
		{"nested", `{"o":{"n":1,"m":[1,2]}}`, `{"o":{"n":1,"m":[1,3]}}`, []string{"o.m: [1,2] → [1,3]"}},
		{"added and removed", `{"a":1}`, `{"b":2}`, []string{"a: removed (was 1)", "b: added 2"}},
		{"not an object", `[1]`, `[2]`, []string{"(arguments): [1] → [2]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range auditreport.ArgDiff(json.RawMessage(tt.before), json.RawMessage(tt.after)) {
				got = append(got, c.String())
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("ArgDiff(%s, %s) = %q, want %q", tt.before, tt.after, got, tt.want)
			}
		})
	}
}

func TestCleanControlCharacters(t *testing.T) {
	in := "ok\x1b[31mred\nnext\u202etxt"
	if got, want := auditreport.Clean(in, 0), `ok\u001b[31mred\nnext\u202etxt`; got != want {
		t.Errorf("Clean(%q) = %q, want %q", in, got, want)
	}
	if got := auditreport.Clean("abcdef", 3); got != "ab…" { // clip.Runes: 3 characters, the marker included
		t.Errorf("Clean(abcdef, 3) = %q", got)
	}
}

func TestStreamIDs(t *testing.T) {
	if got := auditreport.IDBefore("1700000000000-3"); got != "1700000000000-2" {
		t.Errorf("IDBefore(1700000000000-3) = %q", got)
	}
	if got := auditreport.IDBefore("1700000000000-0"); got != "1699999999999-18446744073709551615" {
		t.Errorf("IDBefore(1700000000000-0) = %q", got)
	}
	if got := auditreport.StreamIDBefore(time.UnixMilli(1700000000000)); got != "1699999999999-18446744073709551615" {
		t.Errorf("streamIDBefore = %q", got)
	}
}
