package approval_test

import (
	"encoding/json"
	"testing"

	"github.com/countersign/countersign/approval"
)

func TestValueFormatApply(t *testing.T) {
	usd := approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "USD"}
	cents := approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "USD", MinorUnits: true}
	tests := []struct {
		name string
		f    approval.ValueFormat
		v    any
		want string
	}{
		{"dollars", usd, json.Number("1289"), "$1,289.00"},
		{"dollars with cents", usd, json.Number("64.5"), "$64.50"},
		{"cents", cents, json.Number("128900"), "$1,289.00"},
		{"negative", usd, json.Number("-5"), "-$5.00"},
		{"yen has no minor digits", approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "JPY", MinorUnits: true}, json.Number("1500"), "¥1,500"},
		{"other currency", approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "NOK"}, json.Number("12"), "12.00 NOK"},
		{"numeric text", usd, "64", "$64.00"},
		{"not a number stays", usd, "n/a", "n/a"},
		{"date text", approval.ValueFormat{Kind: approval.FormatDate}, "2026-12-02T14:05:00Z", "2 Dec 2026 14:05 UTC"},
		{"date only", approval.ValueFormat{Kind: approval.FormatDate}, "2026-12-02", "2 Dec 2026"},
		{"unix seconds", approval.ValueFormat{Kind: approval.FormatDate}, json.Number("1796220300"), "2 Dec 2026 14:05 UTC"},
		{"percent", approval.ValueFormat{Kind: approval.FormatPercent}, json.Number("0.15"), "15%"},
		{"bytes", approval.ValueFormat{Kind: approval.FormatBytes}, json.Number("1536"), "1.5 KiB"},
		{"few bytes", approval.ValueFormat{Kind: approval.FormatBytes}, json.Number("12"), "12 bytes"},
		{"no format", approval.ValueFormat{}, json.Number("64"), "64"},
	}
	for _, tt := range tests {
		if got := tt.f.Apply(tt.v); got != tt.want {
			t.Errorf("%s: %+v.Apply(%v) = %q, want %q", tt.name, tt.f, tt.v, got, tt.want)
		}
	}
}

func TestValueFormatCheck(t *testing.T) {
	for _, f := range []approval.ValueFormat{{Kind: "money"}, {Kind: approval.FormatCurrency, Currency: "usd"}, {Kind: approval.FormatDate, Currency: "USD"}} {
		if f.Check() == nil {
			t.Errorf("%+v.Check() = nil, want an error", f)
		}
	}
	if err := (approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "EUR", MinorUnits: true}).Check(); err != nil {
		t.Errorf("Check(EUR cents) = %v", err)
	}
}
