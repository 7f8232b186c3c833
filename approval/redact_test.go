package approval_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name   string
		data   any
		secret []string
		want   string
	}{
		{"nil", nil, nil, `null`},
		{"empty bytes", []byte(""), nil, `null`},
		{"nil raw message", json.RawMessage(nil), nil, `null`},
		{"plain object kept, keys sorted, numbers as written", json.RawMessage(`{"b":1.50,"a":"hello","n":12345678901234567890}`), nil,
			`{"a":"hello","b":1.50,"n":12345678901234567890}`},
		{"secret property at any depth, case-insensitive", json.RawMessage(`{"x":{"API_KEY":"abc","list":[{"api_key":{"k":1}}]},"api-key":"z"}`), []string{"api_key"},
			`{"api-key":"[redacted]","x":{"API_KEY":"[redacted]","list":[{"api_key":"[redacted]"}]}}`},
		{"secret name given in other case", map[string]any{"Pin": "1234", "amount": 5}, []string{"PIN"},
			`{"Pin":"[redacted]","amount":5}`},
		{"sensitive names redacted whole", json.RawMessage(`{"password":"hunter2","client_secret":"s","access_token":"t","Authorization":"x","cookie":["a","b"],"apiKey":7,"max_tokens":100,"token_count":3}`), nil,
			`{"Authorization":"[redacted]","access_token":"[redacted]","apiKey":"[redacted]","client_secret":"[redacted]","cookie":"[redacted]","max_tokens":100,"password":"[redacted]","token_count":3}`},
		{"header name/value pairs", json.RawMessage(`{"headers":[{"name":"X-Api-Key","value":"k1"},{"name":"Accept","value":"json"}]}`), nil,
			`{"headers":[{"name":"X-Api-Key","value":"[redacted]"},{"name":"Accept","value":"json"}]}`},
		{"slack bot token in text", map[string]string{"note": "use xoxb-123-456-abc please"}, nil,
			`{"note":"use [redacted] please"}`},
		{"slack user, app and refresh tokens", "a xoxp-1-2-3 b xapp-1-A0-99-ff c xoxe.xoxp-1-abc", nil,
			`"a [redacted] b [redacted] c xoxe.[redacted]"`},
		{"openai key", "key sk-abcdefghijklmnopqrstuvwx1234 end", nil, `"key [redacted] end"`},
		{"short sk- is prose", "task-sk-12 and sk-short", nil, `"task-sk-12 and sk-short"`},
		{"aws access key id", "id AKIAIOSFODNN7EXAMPLE,", nil, `"id [redacted],"`},
		{"aws secret after its name", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nregion=eu", nil,
			"\"aws_secret_access_key = [redacted]\\nregion=eu\""},
		{"aws secret in cli form", "export AWS_SECRET_ACCESS_KEY wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", nil,
			`"export AWS_SECRET_ACCESS_KEY [redacted]"`},
		{"bearer token", "Authorization header was Bearer abc.def-123", nil, `"Authorization header was Bearer [redacted]"`},
		{"bearer prose kept", "the Bearer shoulders everything", nil, `"the Bearer shoulders everything"`},
		{"basic credentials", "send Basic dXNlcjpwYXNz now", nil, `"send Basic [redacted] now"`},
		{"basic prose kept", "Basic plan and basic usage", nil, `"Basic plan and basic usage"`},
		{"url password", "connect postgres://app:s3cr3t@db.internal:5432/x and https://example.com/a", nil,
			`"connect postgres://app:[redacted]@db.internal:5432/x and https://example.com/a"`},
		{"url password containing @", "redis://:p@ss@host:6379/0", nil, `"redis://:[redacted]@host:6379/0"`},
		{"query string secrets", "https://api.example.com/v1?user=bob&token=abc123&page=2", nil,
			`"https://api.example.com/v1?user=bob&token=[redacted]&page=2"`},
		{"header lines", "GET /\r\nCookie: session=abc; theme=dark\r\nAccept: */*", nil,
			"\"GET /\\r\\nCookie: [redacted]\\r\\nAccept: */*\""},
		{"key value in prose", `config: password: hunter2 user: bob`, nil, `"config: password: [redacted] user: bob"`},
		{"secret names from the record in text", `pin=1234 amount=5`, []string{"pin"}, `"pin=[redacted] amount=5"`},
		{"jwt", "tok eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.sig_nature-x end", nil, `"tok [redacted] end"`},
		{"github token", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", nil, `"[redacted]"`},
		{"stripe key", "sk_live_abcdefghijklmn", nil, `"[redacted]"`},
		{"pem private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nrest", nil, `"[redacted]\nrest"`},
		{"truncated pem", "x -----BEGIN PRIVATE KEY-----\nMIIE...", nil, `"x [redacted]"`},
		{"json inside a string", map[string]string{"body": `{"password":"p","q":1}`}, nil,
			`{"body":"{\"password\":\"[redacted]\",\"q\":1}"}`},
		{"json inside a string unchanged keeps its bytes", map[string]string{"body": `{ "q": 1 }`}, nil,
			`{"body":"{ \"q\": 1 }"}`},
		{"invalid json bytes are text", []byte(`{"api_key": "abc`), []string{"api_key"}, `"{\"api_key\": \"[redacted]\""`},
		{"trailing garbage is text", []byte(`{"a":1}} xoxb-1-2`), nil, `"{\"a\":1}} [redacted]"`},
		{"unmarshalable value", math.Inf(1), nil, `"[redacted: data could not be encoded as JSON]"`},
		{"no html escaping", "<a & b>", nil, `"<a & b>"`},
		{"numbers and bools kept", json.RawMessage(`[1,true,null,"x"]`), nil, `[1,true,null,"x"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(approval.Redact(tt.data, tt.secret))
			if got != tt.want {
				t.Errorf("Redact(%v, %q) =\n  %s\nwant\n  %s", tt.data, tt.secret, got, tt.want)
			}
			if !json.Valid([]byte(got)) {
				t.Errorf("Redact(%v) = %s, not valid JSON", tt.data, got)
			}
		})
	}
}

// TestRedactIdempotent checks that redacting already-redacted data changes
// nothing, so data can pass through more than one layer safely.
func TestRedactIdempotent(t *testing.T) {
	inputs := []string{
		`{"password":"x","note":"Bearer abc.def-123 and redis://u:p@h/0 and token=1 xoxb-1-2"}`,
		`"Authorization: Basic dXNlcjpwYXNz"`,
		`{"h":"Cookie: a=b"}`,
	}
	for _, in := range inputs {
		once := approval.Redact(json.RawMessage(in), nil)
		twice := approval.Redact(once, nil)
		if string(once) != string(twice) {
			t.Errorf("Redact(Redact(%s)) = %s, want %s", in, twice, once)
		}
	}
}

// TestRedactDoesNotMutateInput guards against a caller's value (a tool call's
// arguments) being changed by auditing it.
func TestRedactDoesNotMutateInput(t *testing.T) {
	args := json.RawMessage(`{"api_key":"abc","x":"xoxb-1-2-3"}`)
	before := string(args)
	got := approval.Redact(args, []string{"api_key"})
	if string(args) != before {
		t.Errorf("Redact changed its input to %s", args)
	}
	if strings.Contains(string(got), "abc") || strings.Contains(string(got), "xoxb") {
		t.Errorf("Redact = %s, secret left in", got)
	}
}

// FuzzRedact checks that Redact never panics and always returns valid JSON.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{`{"a":"xoxb-1-2"}`, `"Bearer abc.def-123"`, `password=x`, `{"h":[{"name":"cookie","value":1}]}`,
		`"redis://u:p@h"`, `{"s":"{\"token\":\"t\"}"}`, "-----BEGIN PRIVATE KEY-----", `[1,2.50e3,null]`} {
		f.Add([]byte(s), "api_key")
	}
	f.Fuzz(func(t *testing.T, data []byte, secret string) {
		got := approval.Redact(data, []string{secret})
		if !json.Valid(got) {
			t.Errorf("Redact(%q) = %s, not valid JSON", data, got)
		}
	})
}
