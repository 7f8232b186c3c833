package approval

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ValueFormat says how a value reads for people: money with its unit, a
// date, a percentage, a size. The zero value shows a value as it is.
type ValueFormat struct {
	// Kind is FormatCurrency, FormatDate, FormatPercent or FormatBytes.
	Kind string `json:"kind,omitempty"`
	// Currency is the ISO 4217 code of a currency value (USD, EUR, JPY).
	Currency string `json:"currency,omitempty"`
	// MinorUnits says a currency value is in the currency's minor unit
	// (cents): 6400 is $64.00.
	MinorUnits bool `json:"minor_units,omitempty"`
}

// Value formats.
const (
	FormatCurrency = "currency"
	FormatDate     = "date"    // RFC 3339 text, or Unix seconds
	FormatPercent  = "percent" // a fraction: 0.15 is 15%
	FormatBytes    = "bytes"   // a count of bytes: 1536 is 1.5 KiB
)

// currencies are the symbols and minor-unit digits of common currencies;
// any other ISO code is written after the amount with two decimals.
var currencies = map[string]struct {
	symbol string
	digits int
}{
	"USD": {"$", 2}, "EUR": {"€", 2}, "GBP": {"£", 2}, "JPY": {"¥", 0}, "CAD": {"CA$", 2},
	"AUD": {"A$", 2}, "CHF": {"CHF ", 2}, "INR": {"₹", 2}, "CNY": {"CN¥", 2}, "SEK": {"SEK ", 2},
}

// Check reports a format that cannot be applied: an unknown kind, or a
// currency that is not a three-letter code.
func (f ValueFormat) Check() error {
	switch f.Kind {
	case "", FormatDate, FormatPercent, FormatBytes:
		if f.Currency != "" || f.MinorUnits {
			return fmt.Errorf("currency and minor_units only go with the currency format")
		}
		return nil
	case FormatCurrency:
		if len(f.Currency) != 3 || strings.ToUpper(f.Currency) != f.Currency {
			return fmt.Errorf("currency must be a three-letter ISO 4217 code such as USD, got %q", f.Currency)
		}
		return nil
	}
	return fmt.Errorf("must be currency, date, percent or bytes, got %q", f.Kind)
}

// Apply renders v (a decoded JSON value: json.Number, float64, string, …)
// in the format. A value the format cannot read is shown as it is, so a
// mismatch never hides the value.
func (f ValueFormat) Apply(v any) string {
	plain := plainValue(v)
	switch f.Kind {
	case FormatCurrency:
		n, ok := number(v)
		if !ok {
			return plain
		}
		c, known := currencies[f.Currency]
		if !known {
			c.digits = 2
		}
		if f.MinorUnits {
			n /= math.Pow10(c.digits)
		}
		amount := groupThousands(strconv.FormatFloat(math.Abs(n), 'f', c.digits, 64))
		sign := ""
		if n < 0 {
			sign = "-"
		}
		if !known {
			return sign + amount + " " + f.Currency
		}
		return sign + c.symbol + amount
	case FormatDate:
		if n, ok := number(v); ok {
			return time.Unix(int64(n), 0).UTC().Format("2 Jan 2006 15:04 UTC")
		}
		if s, ok := v.(string); ok {
			if t, err := time.Parse(time.RFC3339, s); err == nil {
				return t.UTC().Format("2 Jan 2006 15:04 UTC")
			}
			if t, err := time.Parse(time.DateOnly, s); err == nil {
				return t.Format("2 Jan 2006")
			}
		}
		return plain
	case FormatPercent:
		n, ok := number(v)
		if !ok {
			return plain
		}
		return strconv.FormatFloat(n*100, 'f', -1, 64) + "%"
	case FormatBytes:
		n, ok := number(v)
		if !ok || n < 0 {
			return plain
		}
		units := []string{"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"}
		i := 0
		for n >= 1024 && i < len(units)-1 {
			n /= 1024
			i++
		}
		if i == 0 {
			return strconv.FormatFloat(n, 'f', -1, 64) + " bytes"
		}
		return strconv.FormatFloat(math.Round(n*10)/10, 'f', -1, 64) + " " + units[i]
	}
	return plain
}

// number reads a JSON number (or a numeric string).
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil
	}
	return 0, false
}

// plainValue is v as people read it without a format: text as it is,
// anything else as JSON.
func plainValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case nil:
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// groupThousands puts commas between groups of three digits of a decimal
// number's integer part: 1289.5 reads 1,289.5.
func groupThousands(s string) string {
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}
