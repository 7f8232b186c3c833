package approval_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
)

func TestDiffArgs(t *testing.T) {
	for _, tt := range []struct {
		name, before, after string
		depth               int
		want                string // path:before>after, joined by " | "
	}{
		{name: "same, other order", before: `{"a":1,"b":{"x":1,"y":2}}`, after: `{"b":{"y":2,"x":1},"a":1}`, depth: 0, want: ""},
		{name: "top level", before: `{"amount":64,"note":"x","gone":true}`, after: `{"amount":40,"note":"x","new":"y"}`, depth: 1,
			want: `amount:64>40 | gone:true> | new:>"y"`},
		{name: "nested at depth 1", before: `{"o":{"a":1,"b":2}}`, after: `{"o":{"a":1,"b":3}}`, depth: 1, want: `o:{"a":1,"b":2}>{"a":1,"b":3}`},
		{name: "nested, no limit", before: `{"o":{"a":1,"b":2}}`, after: `{"o":{"a":1,"b":3}}`, depth: 0, want: `o.b:2>3`},
		{name: "numbers as written", before: `{"n":1.50}`, after: `{"n":1.5}`, depth: 0, want: `n:1.50>1.5`},
		{name: "not objects", before: `[1]`, after: `[2]`, depth: 0, want: `:[1]>[2]`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var parts []string
			for _, c := range approval.DiffArgs(json.RawMessage(tt.before), json.RawMessage(tt.after), tt.depth) {
				parts = append(parts, c.Path+":"+string(c.Before)+">"+string(c.After))
			}
			if got := strings.Join(parts, " | "); got != tt.want {
				t.Errorf("DiffArgs(%s, %s, %d) = %q, want %q", tt.before, tt.after, tt.depth, got, tt.want)
			}
		})
	}
}
