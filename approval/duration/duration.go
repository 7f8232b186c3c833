// Package duration is the one reader and writer of durations as people
// and the policy file write them: Go's durations ("90s", "1h30m")
// extended with a leading number of days ("7d", "1d12h", "1.5d").
// It imports only the standard library (a leaf, like approval/clip), so
// the policy file, the audit reports and the bot share it.
package duration

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// day is the length of the "d" unit: 24 hours (durations here are
// intervals, not calendar days).
const day = 24 * time.Hour

// Parse reads a Go duration ("90s", "1h30m", "-5m", "0") that may begin
// with a number of days: "7d", "1d12h", "1.5d". The days are written in
// decimal digits (a fraction allowed, no sign). The sign of the result is
// the caller's to judge: the policy file refuses a negative one, the
// audit's --since anything not positive.
func Parse(s string) (time.Duration, error) {
	in := s
	s = strings.TrimSpace(s)
	bad := func() (time.Duration, error) {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 90s, 30m, 24h, 7d, 1d12h)", in)
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, ok := decimal(s[:i])
		if !ok || n > float64(math.MaxInt64/int64(day)) {
			return bad()
		}
		days, s = time.Duration(n*float64(day)), s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	v, err := time.ParseDuration(s)
	if err != nil || (days > 0 && v < 0) {
		return bad()
	}
	if days > 0 && v > math.MaxInt64-days {
		return bad()
	}
	return days + v, nil
}

// decimal reads digits with at most one decimal point ("7", "1.5");
// nothing else (no sign, exponent, "inf" or hexadecimal).
func decimal(s string) (float64, bool) {
	digits, points := 0, 0
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			points++
		default:
			return 0, false
		}
	}
	if digits == 0 || points > 1 {
		return 0, false
	}
	n, err := strconv.ParseFloat(s, 64)
	return n, err == nil
}

// Format writes d for people and in the policy file's own notation,
// rounded to what a person reads (milliseconds under a second, tenths of
// a second under a minute, else seconds) without trailing zero units:
// "250ms", "1.5s", "45s", "90m" as "1h30m", "36h", "2h0m5s".
func Format(d time.Duration) string {
	switch {
	case d < time.Second && d > -time.Second:
		d = d.Round(time.Millisecond)
	case d < time.Minute && d > -time.Minute:
		d = d.Round(100 * time.Millisecond)
	default:
		d = d.Round(time.Second)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
