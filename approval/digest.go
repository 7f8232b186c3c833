package approval

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Compact returns raw without insignificant space, checked valid: the one
// json.Compact of the module (the arguments a request keeps, the caller's
// state, what the audit prints on one line). Unlike Canonical it keeps
// keys in their order.
func Compact(raw json.RawMessage) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Canonical returns args as compact JSON with object keys sorted and numbers
// kept exactly as written, so equal arguments always give equal bytes.
func Canonical(args json.RawMessage) ([]byte, error) { return appendCanonicalJSON(nil, args) }

// appendCanonicalJSON appends Canonical(args) to dst; on an error it
// returns dst as it was.
func appendCanonicalJSON(dst []byte, args json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return append(dst, "{}"...), nil
	}
	if canonicalAsIs(args) {
		return append(dst, args...), nil // what the long way would write
	}
	return appendCanonicalLong(dst, args)
}

// appendCanonicalLong is appendCanonicalJSON the long way: decoded,
// numbers kept as written, encoded with object keys sorted.
func appendCanonicalLong(dst []byte, args json.RawMessage) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return dst, fmt.Errorf("canonical arguments: %w: %v", ErrInvalidArgs, err)
	}
	if dec.More() {
		return dst, fmt.Errorf("canonical arguments: %w: trailing data", ErrInvalidArgs)
	}
	buf := bytes.NewBuffer(dst) // the encoder writes after dst's bytes
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // map keys are sorted by encoding/json
		return dst, fmt.Errorf("canonical arguments: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Digest is the hex SHA-256 of Canonical(args). An approval is bound to it.
func Digest(args json.RawMessage) (string, error) {
	c, err := Canonical(args)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], sum[:])
	return string(h[:]), nil
}

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
