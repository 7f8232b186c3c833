package auditreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
)

// Clean makes untrusted text (model output, arguments, Slack text) safe for
// a terminal: control characters (escape sequences, newlines) become
// visible escapes, after s is cut to max characters by clip.Runes (its
// marker included; 0 = no limit).
func Clean(s string, max int) string {
	if max > 0 {
		s = clip.Runes(s, max)
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(" ")
		case r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// CompactJSON returns raw on one line, or "" when raw is empty or null.
func CompactJSON(raw json.RawMessage) string {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return ""
	}
	c, err := approval.Compact(raw)
	if err != nil {
		return string(raw)
	}
	return string(c)
}

// ResultText renders a result that may be a JSON string or any JSON value.
func ResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return CompactJSON(raw)
}

// shortID keeps the first n characters of a digest.
func shortID(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// FormatTime is the time format of every table and line.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// FormatStamp renders a time written as RFC 3339 text in the data (deadline,
// created) like every other time of the CLI; other text is shown cleaned.
func FormatStamp(s string) string {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return FormatTime(t)
	}
	return Clean(s, 40)
}

// ParseSince reads --since: a positive duration as duration.Parse reads
// it (24h, 7d, 1d12h, 1.5d).
func ParseSince(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	return d, nil
}
