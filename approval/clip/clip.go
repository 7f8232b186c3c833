// Package clip is the one truncation of the module: it cuts text that
// came from outside (arguments, tool output, Slack payloads, model text)
// to a bound, at a character boundary, and marks the cut with Marker.
//
// Every limit is the size of the result, marker included: Bytes counts
// bytes (what a log line, an audit entry, a wire limit or memory pays),
// Runes counts characters (what Slack and a terminal count). Neither ever
// splits a UTF-8 character. The package imports only the standard
// library so that every package may use it, the domain and the API's Go
// client included (TestArchitecture keeps it a leaf).
package clip

import "unicode/utf8"

// Marker ends every cut string: the one sign, everywhere, that text was
// cut.
const Marker = "…"

// Bytes returns s unchanged when it holds at most n bytes; else the
// longest prefix of s that, followed by Marker, holds at most n bytes,
// cut before a character (never inside one). With n smaller than Marker
// it returns the longest such prefix alone, so the result never exceeds
// n bytes; n <= 0 returns "".
func Bytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	mark := Marker
	if n < len(Marker) {
		mark = ""
	}
	return s[:boundary(s, n-len(mark))] + mark
}

// boundary returns the largest i <= n at which s can be cut without
// splitting a character: a valid UTF-8 sequence holds at most
// utf8.UTFMax-1 continuation bytes, so looking back that far suffices
// (bytes of invalid UTF-8 are cut as they are).
func boundary(s string, n int) int {
	for i := 0; i < utf8.UTFMax-1 && n > 0 && n < len(s) && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return n
}

// Runes returns s unchanged when it holds at most n characters; else its
// first n-1 characters followed by Marker (one character), so the result
// holds exactly n characters; n <= 0 returns "".
func Runes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n || utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n-1 {
			return s[:pos] + Marker
		}
		i++
	}
	return s
}
