package policyfile_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/countersign/countersign/approval/policyfile"
)

func TestReadProps(t *testing.T) {
	tests := []struct {
		name      string
		schema    string
		wantNames []string
		wantReq   []string
		wantErr   bool
	}{
		{name: "document order", schema: `{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["a","ghost"]}`,
			wantNames: []string{"z", "a"}, wantReq: []string{"a", "ghost"}},
		{name: "no properties", schema: `{"type":"object"}`},
		{name: "not an object", schema: `true`, wantErr: true},
		{name: "unreadable keyword keeps the names", schema: `{"properties":{"a":{"maxLength":"ten"},"b":true}}`,
			wantNames: []string{"a", "b"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policyfile.ReadProps(json.RawMessage(tt.schema))
			if (err != nil) != tt.wantErr {
				t.Fatalf("ReadProps(%s) error = %v, want error %v", tt.schema, err, tt.wantErr)
			}
			if !slices.Equal(got.Names(), tt.wantNames) {
				t.Errorf("ReadProps(%s).Names() = %q, want %q", tt.schema, got.Names(), tt.wantNames)
			}
			if !slices.Equal(got.Required, tt.wantReq) {
				t.Errorf("ReadProps(%s).Required = %q, want %q", tt.schema, got.Required, tt.wantReq)
			}
		})
	}
}

func TestPropType(t *testing.T) {
	tests := []struct {
		typ          string
		wantName     string
		wantNullable bool
	}{
		{typ: `"string"`, wantName: "string"},
		{typ: `["null","integer"]`, wantName: "integer", wantNullable: true},
		{typ: `"null"`, wantName: "null"},
		{typ: ``, wantName: ""},
	}
	for _, tt := range tests {
		p := policyfile.Prop{Type: json.RawMessage(tt.typ)}
		if got := p.TypeName(); got != tt.wantName {
			t.Errorf("Prop{Type: %s}.TypeName() = %q, want %q", tt.typ, got, tt.wantName)
		}
		if got := p.AllowsNull(); got != tt.wantNullable {
			t.Errorf("Prop{Type: %s}.AllowsNull() = %v, want %v", tt.typ, got, tt.wantNullable)
		}
	}
}
