package bot

// This file: walking the members of a JSON object without decoding them,
// to take out what a reader would decode only to drop: the message a
// Slack reply echoes (withoutMessage, for the transport), the blocks of
// the message an interactive payload carries (withoutBlocks, for
// onInteraction).

import (
	"bytes"
	"encoding/json"
)

// withoutMessage takes the top-level "message" member out of reply, one
// JSON object, in place, and finds its top-level "ok" (true only when it
// is true). walked is false when reply is not one object whose members it
// could walk (findMember): then out is reply, unchanged. What stays is
// decoded by the caller, which refuses what is not JSON.
func withoutMessage(reply []byte) (out []byte, ok, walked bool) {
	m, found, walked := findMember(reply, "message")
	if !walked {
		return reply, false, false
	}
	if found {
		reply = m.cut(reply)
	}
	if v, found, _ := findMember(reply, "ok"); found {
		ok = string(reply[v.valueAt:v.valueEnd]) == "true"
	}
	return reply, ok, true
}

// withoutBlocks returns an interactive payload without the blocks and
// attachments of the message it carries (the card clicked), leaving
// payload as it was. The bot reads the message's ts, bot and metadata
// only (interaction); decoding a card's blocks only to skip them was most
// of the cost of reading a click. A payload the walk cannot follow
// (findMember) is returned as it came, for the decoder to judge.
func withoutBlocks(payload []byte) []byte {
	msg, found, walked := findMember(payload, "message")
	if !found || !walked {
		return payload
	}
	inner := payload[msg.valueAt:msg.valueEnd]
	var cut []byte // payload's copy, once something is cut
	for _, key := range [...]string{"blocks", "attachments"} {
		m, found, walked := findMember(inner, key)
		if !found || !walked {
			continue
		}
		if cut == nil {
			cut = bytes.Clone(payload)
			inner = cut[msg.valueAt:msg.valueEnd]
		}
		inner = m.cut(inner)
	}
	if cut == nil {
		return payload
	}
	return append(cut[:msg.valueAt+len(inner)], cut[msg.valueEnd:]...)
}

// member is where a member of a JSON object lies in it.
type member struct {
	valueAt, valueEnd int // its value
	cutFrom, cutTo    int // the member with one comma beside it: what cut takes out
}

// cut returns b without m, in place.
func (m member) cut(b []byte) []byte { return append(b[:m.cutFrom], b[m.cutTo:]...) }

// findMember walks the JSON object b and returns its top-level member
// named key, read as a decoder reads keys (escapes decoded), the last one
// when there are several, as a decoder keeps the last. found reports
// whether there is one; walked whether b is one object the walk could
// follow to its end. The walk checks strings and nesting, not every token:
// what stays is for a decoder to judge.
func findMember(b []byte, key string) (m member, found, walked bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return member{}, false, false
	}
	i++
	prevComma := -1 // the comma before the member being read
	for n := 0; ; n++ {
		i = skipSpace(b, i)
		if i >= len(b) {
			return member{}, false, false
		}
		if b[i] == '}' {
			break
		}
		if n > 0 {
			if b[i] != ',' {
				return member{}, false, false
			}
			prevComma = i
			i = skipSpace(b, i+1)
		}
		keyAt := i
		keyEnd, good := skipString(b, i)
		if !good {
			return member{}, false, false
		}
		k := b[keyAt+1 : keyEnd-1]
		if bytes.IndexByte(k, '\\') >= 0 { // spelt with escapes: read as a decoder reads it
			var s string
			if json.Unmarshal(b[keyAt:keyEnd], &s) != nil {
				return member{}, false, false
			}
			k = []byte(s)
		}
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return member{}, false, false
		}
		valueAt := skipSpace(b, i+1)
		valueEnd, good := skipValue(b, valueAt)
		if !good {
			return member{}, false, false
		}
		if string(k) == key {
			found = true
			m = member{valueAt: valueAt, valueEnd: valueEnd, cutFrom: keyAt, cutTo: valueEnd}
			if n > 0 {
				m.cutFrom = prevComma // the comma before it goes with it
			} else if c := skipSpace(b, valueEnd); c < len(b) && b[c] == ',' {
				m.cutTo = c + 1 // the first member: the comma after it
			}
		}
		i = valueEnd
	}
	if skipSpace(b, i+1) != len(b) {
		return member{}, false, false
	}
	return m, found, true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string starting at b[i].
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return len(b), false
}

// skipValue returns the index after the JSON value starting at b[i]: a
// string, an object or array (to its closing bracket, strings inside
// skipped whole), or a number or literal (to the next delimiter).
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, good := skipString(b, i)
				if !good {
					return i, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return i, false
	case '}', ']', ',', ':':
		return i, false
	}
	j := i
	for ; j < len(b); j++ {
		if c := b[j]; c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t' {
			break
		}
	}
	return j, j > i
}
