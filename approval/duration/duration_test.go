package duration_test

import (
	"testing"
	"time"

	"github.com/countersign/countersign/approval/duration"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"90s", 90 * time.Second, true},
		{"24h", 24 * time.Hour, true},
		{"1h30m", 90 * time.Minute, true},
		{"7d", 7 * 24 * time.Hour, true},
		{"1d12h", 36 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{" 2d ", 48 * time.Hour, true},
		{"0", 0, true},
		{"-5m", -5 * time.Minute, true},
		{"1x", 0, false},
		{"d", 0, false},
		{"-1d", 0, false},
		{"1d-1h", 0, false},
		{"1e3d", 0, false},
		{"infd", 0, false},
		{"1.2.3d", 0, false},
		{"999999999d", 0, false},
		{"week", 0, false},
		{"", 0, false},
	} {
		got, err := duration.Parse(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{250*time.Millisecond + 400*time.Microsecond, "250ms"},
		{1520 * time.Millisecond, "1.5s"},
		{45 * time.Second, "45s"},
		{90 * time.Minute, "1h30m"},
		{36 * time.Hour, "36h"},
		{2*time.Hour + 5*time.Second, "2h0m5s"},
		{10 * time.Minute, "10m"},
		{0, "0s"},
	} {
		if got := duration.Format(tt.in); got != tt.want {
			t.Errorf("Format(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestFormatParses: what Format writes, Parse reads back (to Format's
// rounding), so an error message's duration can be pasted into the file.
func TestFormatParses(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, 90 * time.Minute, 7 * 24 * time.Hour, 2*time.Hour + 5*time.Second} {
		got, err := duration.Parse(duration.Format(d))
		if err != nil || got != d {
			t.Errorf("Parse(Format(%v)) = %v, %v; want %v", d, got, err, d)
		}
	}
}
