package approval

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Redacted is what a secret is replaced with in audit data.
const Redacted = "[redacted]"

// Redact returns data as compact JSON with secrets replaced by Redacted.
// It is what the audit stream stores, so it fails closed: it never returns
// an error and never returns data it could not inspect.
//
// data may be JSON text ([]byte or json.RawMessage) or any value that
// encoding/json can marshal. Empty bytes are null; bytes that are not valid
// JSON are treated as one string. A value that cannot be marshalled becomes a JSON string
// saying so, without its content.
//
// What is redacted:
//   - the whole value of any object property whose name is in secret
//     (case-insensitive, ignoring '_', '-', '.' and spaces, at any depth),
//     or whose name looks sensitive: password, passwd, passphrase, secret,
//     authorization, cookie, credential, api_key, private_key, and names
//     ending in token, access_key, secret_key or session_id;
//   - the "value" of a {"name": ..., "value": ...} pair (HTTP headers,
//     form fields) whose name is sensitive in the same way;
//   - within any string: Slack tokens (xoxb-, xoxp-, xapp- ...), OpenAI-style
//     sk- keys, GitHub, Stripe and Google API keys, AWS access key ids and
//     the 40-character secret after an aws_secret_access_key-like name, JWTs,
//     PEM private keys, "Bearer <token>", "Basic <base64 user:pass>", the
//     password in a URL (scheme://user:[redacted]@host), header lines such
//     as "Cookie: ...", and key=value or "key": "value" pairs whose key is
//     sensitive;
//   - strings that hold a JSON object or array are redacted as JSON.
//
// Object keys come out sorted and numbers exactly as written.
func Redact(data any, secret []string) json.RawMessage {
	var raw []byte
	switch d := data.(type) {
	case nil:
		return json.RawMessage("null")
	case json.RawMessage:
		raw = d
	case []byte:
		raw = d
	default:
		b, err := json.Marshal(d)
		if err != nil {
			return encodeJSON("[redacted: data could not be encoded as JSON]")
		}
		raw = b
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null")
	}
	r := redactor{secret: normaliseNames(secret)}
	v, canonical, ok := decodeJSONCanonical(raw)
	if !ok {
		// Not JSON: keep it as text, with every token shape removed.
		return encodeJSON(r.text(string(raw)))
	}
	out, changed := r.value(v, 0)
	if !changed && canonical {
		return bytes.Clone(raw) // what encoding it again would write
	}
	return encodeJSON(out)
}

// maxEmbeddedDepth bounds how deeply JSON held inside JSON strings is
// unpacked; anything deeper is redacted as plain text.
const maxEmbeddedDepth = 4

type redactor struct {
	secret []string // normalised names from Record.Secret
}

// value redacts v and reports whether anything changed.
func (r redactor) value(v any, embedded int) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		changed := false
		pairName := ""
		for _, k := range []string{"name", "key", "header"} {
			if s, ok := x[k].(string); ok && r.sensitive(s) {
				pairName = k
				break
			}
		}
		for k, e := range x {
			if r.sensitive(k) || (pairName != "" && k != pairName && isPairValue(k)) {
				if s, ok := e.(string); ok && s == Redacted {
					continue
				}
				x[k] = Redacted
				changed = true
				continue
			}
			ne, c := r.value(e, embedded)
			if c {
				x[k] = ne
				changed = true
			}
		}
		return x, changed
	case []any:
		changed := false
		for i, e := range x {
			ne, c := r.value(e, embedded)
			if c {
				x[i] = ne
				changed = true
			}
		}
		return x, changed
	case string:
		if embedded < maxEmbeddedDepth {
			if t := strings.TrimSpace(x); len(t) > 1 && (t[0] == '{' || t[0] == '[') {
				if inner, ok := decodeJSON([]byte(t)); ok {
					out, c := r.value(inner, embedded+1)
					if !c {
						return x, false
					}
					return string(encodeJSON(out)), true
				}
			}
		}
		out := r.text(x)
		return out, out != x
	default:
		return v, false // numbers, booleans, null
	}
}

func isPairValue(k string) bool {
	switch strings.ToLower(k) {
	case "value", "values", "val":
		return true
	}
	return false
}

// sensitive reports whether a property or key named name holds a secret.
func (r redactor) sensitive(name string) bool {
	n := normaliseName(name)
	if n == "" {
		return false
	}
	for _, s := range r.secret {
		if n == s {
			return true
		}
	}
	return sensitiveName(n)
}

// sensitiveName applies the built-in name heuristics to a normalised name.
func sensitiveName(n string) bool {
	for _, w := range sensitiveContains {
		if strings.Contains(n, w) {
			return true
		}
	}
	for _, w := range sensitiveSuffixes {
		if strings.HasSuffix(n, w) {
			return true
		}
	}
	switch n {
	case "pwd", "pass", "auth":
		return true
	}
	return false
}

var (
	sensitiveContains = []string{"password", "passwd", "passphrase", "secret", "authorization",
		"cookie", "credential", "apikey", "privatekey"}
	sensitiveSuffixes = []string{"token", "accesskey", "secretkey", "sessionid", "signingkey"}
)

// normaliseName lower-cases name and drops the separators people put in
// names, so "API-Key", "api_key" and "apiKey" compare equal.
func normaliseName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for _, c := range name {
		switch c {
		case '_', '-', '.', ' ':
			continue
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

func normaliseNames(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n := normaliseName(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// textRule replaces one token shape inside a string.
type textRule struct {
	// hints are lower-case substrings of which a match must contain at
	// least one: a cheap test that skips the regexp for most strings.
	hints []string
	re    *regexp.Regexp
	// repl is a regexp template; when keep is set it is called on each match
	// instead and returns the replacement.
	repl string
	keep func(r redactor, s string, m []int) (string, bool)
}

var textRules = []textRule{
	// PEM private keys, up to the END line or the end of the string.
	{hints: []string{"-----begin "}, re: regexp.MustCompile(`(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)`), repl: Redacted},
	// scheme://user:password@host → scheme://user:[redacted]@host
	{hints: []string{"://"}, re: regexp.MustCompile(`(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@"'<>]*):[^\s/?#"'<>]+@`), repl: "${1}:" + Redacted + "@"},
	// Slack bot, user, app-level, refresh and config tokens.
	{hints: []string{"xox"}, re: regexp.MustCompile(`\bxox[abposre]-[A-Za-z0-9\-]+`), repl: Redacted},
	{hints: []string{"xapp-"}, re: regexp.MustCompile(`\bxapp-[A-Za-z0-9\-]+`), repl: Redacted},
	// OpenAI-style (and Anthropic-style) secret keys.
	{hints: []string{"sk-"}, re: regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{20,}`), repl: Redacted},
	// GitHub tokens.
	{hints: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"}, re: regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`), repl: Redacted},
	// Stripe secret and restricted keys.
	{hints: []string{"k_live_", "k_test_"}, re: regexp.MustCompile(`\b[sr]k_(?:live|test)_[A-Za-z0-9]{10,}`), repl: Redacted},
	// Google API keys.
	{hints: []string{"aiza"}, re: regexp.MustCompile(`\bAIza[0-9A-Za-z_\-]{35}`), repl: Redacted},
	// AWS access key ids (long-term and temporary).
	{hints: []string{"akia", "asia"}, re: regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`), repl: Redacted},
	// JWTs.
	{hints: []string{"eyj"}, re: regexp.MustCompile(`\beyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*`), repl: Redacted},
	// Bearer <token>: redacted when the word after it looks like a token
	// (has a digit or token punctuation), so prose survives.
	{hints: []string{"bearer"}, re: regexp.MustCompile(`(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/=\-]{8,})`), keep: func(_ redactor, s string, m []int) (string, bool) {
		tok := s[m[6]:m[7]]
		if !strings.ContainsAny(tok, "0123456789._~+/=-") {
			return "", false
		}
		return s[m[2]:m[3]] + s[m[4]:m[5]] + Redacted, true
	}},
	// Basic <base64 of user:password>.
	{hints: []string{"basic"}, re: regexp.MustCompile(`(?i)\b(basic)(\s+)([A-Za-z0-9+/]{4,}={0,2})`), keep: func(_ redactor, s string, m []int) (string, bool) {
		if !isBasicCredential(s[m[6]:m[7]]) {
			return "", false
		}
		return s[m[2]:m[3]] + s[m[4]:m[5]] + Redacted, true
	}},
	// The 40-character AWS secret after an aws_secret_access_key-like name,
	// in any config syntax (=, :, quotes, spaces).
	{hints: []string{"secret"}, re: regexp.MustCompile(`(?i)(\b(?:aws_?)?secret_?(?:access_?)?key\b)([\s"':=]{1,6})[A-Za-z0-9/+]{40}`), repl: "${1}${2}" + Redacted},
	// Header lines: the whole value after "Authorization:", "Cookie:" ...
	{hints: []string{"authorization", "cookie", "api-key", "auth-token"}, re: regexp.MustCompile(`(?i)\b(proxy-authorization|authorization|set-cookie|cookie|x-api-key|api-key|x-auth-token)([ \t]*:[ \t]*)([^\r\n"]+)`), keep: func(_ redactor, s string, m []int) (string, bool) {
		if s[m[6]:m[7]] == Redacted {
			return "", false
		}
		return s[m[2]:m[3]] + s[m[4]:m[5]] + Redacted, true
	}},
	// key=value, key: value, "key": "value" with a sensitive key (query
	// strings, form bodies, logs, config files, JSON fragments).
	{hints: []string{":", "="}, re: regexp.MustCompile(`([A-Za-z0-9_.\-]*[A-Za-z0-9])(["']?[ \t]*[:=][ \t]*)("(?:[^"\\]|\\.)*"?|'[^']*'?|[^\s&,;"'}\]\[]+)`), keep: func(r redactor, s string, m []int) (string, bool) {
		key, val := s[m[2]:m[3]], s[m[6]:m[7]]
		if !r.sensitive(key) || strings.HasPrefix(strings.Trim(val, `"'`), Redacted) {
			return "", false
		}
		if strings.HasPrefix(s[m[4]:m[5]], ":") && strings.HasPrefix(val, "//") {
			return "", false // a URL such as https://..., not a key: value
		}
		q := ""
		if val != "" && (val[0] == '"' || val[0] == '\'') {
			q = val[:1]
		}
		return key + s[m[4]:m[5]] + q + Redacted + q, true
	}},
}

// text applies every text rule to s.
func (r redactor) text(s string) string {
	lower := strings.ToLower(s)
	for _, rule := range textRules {
		if !containsAny(lower, rule.hints) {
			continue
		}
		var out string
		if rule.keep == nil {
			out = rule.re.ReplaceAllString(s, rule.repl)
		} else {
			out = r.replaceKept(rule, s)
		}
		if out != s {
			s, lower = out, strings.ToLower(out)
		}
	}
	return s
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// replaceKept replaces the matches of rule in s that rule.keep accepts. A
// rejected match is searched again from the end of its first group, so a
// non-sensitive "config: password: x" does not swallow the "password: x"
// inside it.
func (r redactor) replaceKept(rule textRule, s string) string {
	var b strings.Builder
	pos, last := 0, 0
	for pos <= len(s) {
		m := rule.re.FindStringSubmatchIndex(s[pos:])
		if m == nil {
			break
		}
		for i := range m {
			if m[i] >= 0 {
				m[i] += pos
			}
		}
		repl, ok := rule.keep(r, s, m)
		if !ok {
			next := m[1]
			if len(m) > 3 && m[3] > pos {
				next = m[3]
			}
			pos = max(next, pos+1)
			continue
		}
		b.WriteString(s[last:m[0]])
		b.WriteString(repl)
		last = m[1]
		pos = max(m[1], pos+1)
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// isBasicCredential reports whether tok is base64 of "user:password".
func isBasicCredential(tok string) bool {
	var dec []byte
	var err error
	if strings.HasSuffix(tok, "=") || len(tok)%4 == 0 {
		dec, err = base64.StdEncoding.DecodeString(tok)
	} else {
		dec, err = base64.RawStdEncoding.DecodeString(tok)
	}
	if err != nil || !utf8.Valid(dec) {
		return false
	}
	i := bytes.IndexByte(dec, ':')
	if i < 0 {
		return false
	}
	for _, c := range string(dec) {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// decodeJSON decodes exactly one JSON value, keeping numbers as written.
func decodeJSON(raw []byte) (any, bool) {
	v, _, ok := decodeJSONCanonical(raw)
	return v, ok
}

// decodeJSONCanonical is decodeJSON, also reporting whether raw is
// already what encodeJSON writes of the value (then Redact, having
// changed nothing, returns it as it is). Compact JSON, as every entry's
// marshalled data and compacted arguments are, is decoded the short way
// (decodeCompact), anything else by encoding/json.
func decodeJSONCanonical(raw []byte) (v any, canonical, ok bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, false, false
	}
	if v, canonical, ok := decodeCompact(raw); ok {
		return v, canonical, true // as the long way below reads it
	}
	v, ok = decodeJSONLong(raw)
	return v, false, ok
}

// decodeJSONLong is decodeJSON by encoding/json.
func decodeJSONLong(raw []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	return v, true
}

// encodeJSON encodes v compactly without HTML escaping. v holds only what
// decodeJSON produces (or strings), so encoding cannot fail.
func encodeJSON(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return json.RawMessage(`"[redacted: data could not be encoded as JSON]"`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// MaxField is how many bytes of an untrusted single-line value (a user,
// team, request or event id from a Slack payload) reach a log line or an
// audit entry; clip.Bytes cuts the rest, its marker included.
const MaxField = 128

// decodeCompact decodes raw as decodeJSONLong does (numbers kept as
// written, json.Number; an object's key twice: the last one counts) when
// raw is compact JSON: one value, no insignificant space, nested at most
// maxAsIsDepth deep. A string with an escape or a byte that is not UTF-8
// is decoded by encoding/json itself; ok is false for anything else,
// which the long way then reads (or refuses). canonical reports whether
// raw is also what encodeJSON writes of the value: keys without escapes
// in strictly increasing byte order, strings without escapes, U+2028 or
// U+2029 (it may say no to a canonical value). FuzzDecodeCompact holds
// both to the long way.
func decodeCompact(raw []byte) (v any, canonical, ok bool) {
	c := compactReader{b: raw, canonical: true}
	v, end, ok := c.value(0, 0)
	return v, c.canonical, ok && end == len(raw)
}

// compactReader is one decodeCompact.
type compactReader struct {
	b         []byte
	canonical bool // as far as read
}

// value decodes the compact value at b[i:] and returns where it ends.
func (c *compactReader) value(i, depth int) (any, int, bool) {
	b := c.b
	if i >= len(b) || depth > maxAsIsDepth {
		return nil, i, false
	}
	switch ch := b[i]; {
	case ch == '{':
		m := map[string]any{}
		i++
		if i < len(b) && b[i] == '}' {
			return m, i + 1, true
		}
		var prev string
		for n := 0; ; n++ {
			k, end, ok := c.str(i)
			if !ok || end >= len(b) || b[end] != ':' {
				return nil, i, false
			}
			if n > 0 && prev >= k {
				c.canonical = false // out of order, or twice (an escaped key: str says so)
			}
			prev = k
			var v any
			if v, i, ok = c.value(end+1, depth+1); !ok {
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
	case ch == '[':
		a := []any{}
		i++
		if i < len(b) && b[i] == ']' {
			return a, i + 1, true
		}
		for {
			v, end, ok := c.value(i, depth+1)
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
	case ch == '"':
		return c.str(i)
	case bytes.HasPrefix(b[i:], []byte("true")):
		return true, i + 4, true
	case bytes.HasPrefix(b[i:], []byte("false")):
		return false, i + 5, true
	case bytes.HasPrefix(b[i:], []byte("null")):
		return nil, i + 4, true
	case ch == '-' || '0' <= ch && ch <= '9':
		end := i
		for end < len(b) && bytes.IndexByte([]byte("+-.0123456789Ee"), b[end]) >= 0 {
			end++
		}
		if !json.Valid(b[i:end]) {
			return nil, i, false
		}
		return json.Number(b[i:end]), end, true
	}
	return nil, i, false
}

// str decodes the string at b[i:]: its bytes as they are when they are
// printable and UTF-8 with no escape (as encoding/json takes them), else
// by encoding/json (and then not canonical: see decodeCompact).
func (c *compactReader) str(i int) (string, int, bool) {
	b := c.b
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	plain := true
	for j := i + 1; j < len(b); {
		switch ch := b[j]; {
		case ch == '"':
			if plain {
				return string(b[i+1 : j]), j + 1, true
			}
			c.canonical = false
			var s string
			if json.Unmarshal(b[i:j+1], &s) != nil {
				return "", i, false
			}
			return s, j + 1, true
		case ch == '\\':
			plain = false
			j += 2 // the escaped byte cannot end the string
		case ch < 0x20:
			return "", i, false // not JSON: the long way says so
		case ch < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(b[j:])
			switch {
			case r == utf8.RuneError && size == 1:
				plain = false // encoding/json reads it as U+FFFD
			case r == '\u2028' || r == '\u2029':
				c.canonical = false // encodeJSON escapes them
			}
			j += size
		}
	}
	return "", i, false
}
