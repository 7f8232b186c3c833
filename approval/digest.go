package approval

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
	return hex.EncodeToString(sum[:]), nil
}
