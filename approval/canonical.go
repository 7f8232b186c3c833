package approval

// This file: JSON the audit and the digests meet, read the short way when
// it can be. Most arguments and every audit entry's data are compact JSON
// with plain strings: canonicalAsIs takes canonical JSON as it is, and
// decodeCompact decodes compact JSON without a json.Decoder. Each says no
// to what it is not sure of, and the long way (encoding/json) then does
// it; FuzzCanonicalAsIs and FuzzDecodeCompact hold the two ways to the
// same result.

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// canonicalAsIs reports whether raw is already what appendCanonicalJSON's
// long way (decode, keep numbers as written, encode with keys sorted)
// writes of it, so that it can be taken as it is: one JSON value, no
// insignificant space, each object's keys written without escapes and in
// strictly increasing byte order (so none twice), strings escaped only as
// encoding/json escapes them, valid UTF-8. It may say no to a canonical
// value (a key with an escape, say, or one nested deeper than
// maxAsIsDepth): the long way then writes the same bytes. Most arguments
// and every audit entry's data (Redact writes them canonical) are taken
// as they are: no decoder, no map, no encoder (FuzzCanonicalAsIs holds
// the two ways to the same bytes).
func canonicalAsIs(raw []byte) bool {
	end, ok := asIsValue(raw, 0, 0)
	return ok && end == len(raw)
}

// maxAsIsDepth bounds the nesting canonicalAsIs follows.
const maxAsIsDepth = 32

// asIsValue reads the canonical value at b[i:] and returns where it ends.
func asIsValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) || depth > maxAsIsDepth {
		return i, false
	}
	switch c := b[i]; {
	case c == '{':
		i++
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		var prev []byte
		for n := 0; ; n++ {
			end, ok, escaped := asIsString(b, i)
			if !ok || escaped {
				return i, false
			}
			key := b[i+1 : end-1]
			if n > 0 && bytes.Compare(prev, key) >= 0 {
				return i, false
			}
			prev, i = key, end
			if i >= len(b) || b[i] != ':' {
				return i, false
			}
			if i, ok = asIsValue(b, i+1, depth+1); !ok {
				return i, false
			}
			switch {
			case i < len(b) && b[i] == ',':
				i++
			case i < len(b) && b[i] == '}':
				return i + 1, true
			default:
				return i, false
			}
		}
	case c == '[':
		i++
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = asIsValue(b, i, depth+1); !ok {
				return i, false
			}
			switch {
			case i < len(b) && b[i] == ',':
				i++
			case i < len(b) && b[i] == ']':
				return i + 1, true
			default:
				return i, false
			}
		}
	case c == '"':
		end, ok, _ := asIsString(b, i)
		return end, ok
	case c == 't':
		return asIsLiteral(b, i, "true")
	case c == 'f':
		return asIsLiteral(b, i, "false")
	case c == 'n':
		return asIsLiteral(b, i, "null")
	case c == '-' || '0' <= c && c <= '9':
		return asIsNumber(b, i)
	}
	return i, false
}

func asIsLiteral(b []byte, i int, lit string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return i, false
	}
	return i + len(lit), true
}

// asIsNumber reads a JSON number (RFC 8259's grammar): kept as written.
func asIsNumber(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

// asIsString reads the string at b[i:] (b[i] must be '"') if it is
// written as encoding/json writes it without HTML escaping: printable
// ASCII as itself but for '"' and '\\'; \", \\, \b, \f, \n, \r, \t; other
// control characters as \u00xx; U+2028 and U+2029 as \u2028 and \u2029;
// other valid UTF-8 as itself. escaped says whether it holds an escape.
func asIsString(b []byte, i int) (end int, ok, escaped bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false, false
	}
	for i++; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return i, false, escaped
			}
			switch b[i+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !asIsEscape(string(b[i+2:i+6])) {
					return i, false, escaped
				}
				i += 6
			default:
				return i, false, escaped
			}
		case c < 0x20:
			return i, false, escaped
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return i, false, escaped
			}
			i += size
		}
	}
	return i, false, escaped
}

// asIsEscape reports whether \u followed by hex is how encoding/json
// writes a character: a control character without a short escape, in
// lower-case hex, or U+2028, U+2029.
func asIsEscape(hex string) bool {
	switch hex {
	case "2028", "2029":
		return true
	case "0008", "0009", "000a", "000c", "000d":
		return false // written \b, \t, \n, \f, \r
	}
	return (hex[:3] == "000" || hex[:3] == "001") && isLowerHex(hex[3])
}

func isLowerHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// decodeCompact decodes raw as decodeJSON's long way does (numbers kept as
// written, json.Number; an object's key twice: the last one counts) when
// raw is compact JSON: one value, no insignificant space, nested at most
// maxAsIsDepth deep. A string with an escape or a byte that is not UTF-8
// is decoded by encoding/json itself; ok is false for anything else,
// which the long way then reads (or refuses).
func decodeCompact(raw []byte) (v any, ok bool) {
	v, end, ok := compactValue(raw, 0, 0)
	return v, ok && end == len(raw)
}

// compactValue decodes the compact value at b[i:] and returns where it
// ends.
func compactValue(b []byte, i, depth int) (any, int, bool) {
	if i >= len(b) || depth > maxAsIsDepth {
		return nil, i, false
	}
	switch c := b[i]; {
	case c == '{':
		m := map[string]any{}
		i++
		if i < len(b) && b[i] == '}' {
			return m, i + 1, true
		}
		for {
			k, end, ok := compactString(b, i)
			if !ok || end >= len(b) || b[end] != ':' {
				return nil, i, false
			}
			var v any
			if v, i, ok = compactValue(b, end+1, depth+1); !ok {
				return nil, i, false
			}
			m[k] = v
			switch {
			case i < len(b) && b[i] == ',':
				i++
			case i < len(b) && b[i] == '}':
				return m, i + 1, true
			default:
				return nil, i, false
			}
		}
	case c == '[':
		a := []any{}
		i++
		if i < len(b) && b[i] == ']' {
			return a, i + 1, true
		}
		for {
			v, end, ok := compactValue(b, i, depth+1)
			if !ok {
				return nil, i, false
			}
			a, i = append(a, v), end
			switch {
			case i < len(b) && b[i] == ',':
				i++
			case i < len(b) && b[i] == ']':
				return a, i + 1, true
			default:
				return nil, i, false
			}
		}
	case c == '"':
		s, end, ok := compactString(b, i)
		return s, end, ok
	case c == 't':
		end, ok := asIsLiteral(b, i, "true")
		return true, end, ok
	case c == 'f':
		end, ok := asIsLiteral(b, i, "false")
		return false, end, ok
	case c == 'n':
		end, ok := asIsLiteral(b, i, "null")
		return nil, end, ok
	case c == '-' || '0' <= c && c <= '9':
		end, ok := asIsNumber(b, i)
		return json.Number(b[i:end]), end, ok
	}
	return nil, i, false
}

// compactString decodes the string at b[i:]: its bytes as they are when
// they are printable and UTF-8 with no escape (as encoding/json takes
// them), else by encoding/json.
func compactString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	plain := true
	for j := i + 1; j < len(b); {
		switch c := b[j]; {
		case c == '"':
			if plain {
				return string(b[i+1 : j]), j + 1, true
			}
			var s string
			if json.Unmarshal(b[i:j+1], &s) != nil {
				return "", i, false
			}
			return s, j + 1, true
		case c == '\\':
			plain = false
			j += 2 // the escaped byte cannot end the string
		case c < 0x20:
			return "", i, false // not JSON: the long way says so
		case c < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && size == 1 {
				plain = false // encoding/json reads it as U+FFFD
			}
			j += size
		}
	}
	return "", i, false
}
