package hook_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/countersign/countersign/agent/hook"
	"github.com/countersign/countersign/approval/clip"
)

// TestHookDiff: an Edit's change shows the lines that differ, old then new,
// with the lines around them once.
func TestHookDiff(t *testing.T) {
	for _, tc := range []struct{ name, old, new, want string }{
		{"one line", "a = 1", "a = 2", "- a = 1\n+ a = 2"},
		{"context", "x\na = 1\ny", "x\na = 2\ny", "  x\n- a = 1\n+ a = 2\n  y"},
		{"insert", "x\ny", "x\nz\ny", "  x\n+ z\n  y"},
	} {
		if got := hook.Diff(tc.old, tc.new); got != tc.want {
			t.Errorf("%s: Diff = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestHookFactsFitTheAPI: a Write's long content is cut at a character
// boundary within the API's 2,000-byte limit on a fact, saying so.
func TestHookFactsFitTheAPI(t *testing.T) {
	content := strings.Repeat("é", 3000)
	facts := hook.Facts(hook.Input{ToolName: "Write", Cwd: "/w", SessionID: "s", PermissionMode: "acceptEdits",
		ToolInput: []byte(`{"file_path":"/w/a.txt","content":"` + content + `"}`)})
	got := map[string]string{}
	for _, f := range facts {
		got[f.Label] = f.Value
		if len(f.Value) > 2000 || !utf8.ValidString(f.Value) {
			t.Errorf("fact %s: %d bytes, valid UTF-8 %v; want at most 2000, valid", f.Label, len(f.Value), utf8.ValidString(f.Value))
		}
	}
	if got["File"] != "/w/a.txt" || got["Working directory"] != "/w" || got["Claude Code session"] != "s" || got["Permission mode"] != "acceptEdits" {
		t.Errorf("facts = %v", got)
	}
	if !strings.HasSuffix(got["Content"], clip.Marker) {
		t.Errorf("Content fact does not say it was cut: %q", got["Content"][len(got["Content"])-40:])
	}
}

// TestHookDirKeepsOneClaim: a claim kept by PreToolUse is taken once by
// PostToolUse.
func TestHookDirKeepsOneClaim(t *testing.T) {
	d := hook.Dir(t.TempDir() + "/claims")
	if err := d.Put("toolu_1", "req_1", "cst_abc"); err != nil {
		t.Fatal(err)
	}
	id, tok, ok, err := d.Take("toolu_1")
	if err != nil || !ok || id != "req_1" || tok != "cst_abc" {
		t.Fatalf("Take = %q, %q, %v, %v; want req_1, cst_abc", id, tok, ok, err)
	}
	if _, _, ok, err := d.Take("toolu_1"); ok || err != nil {
		t.Errorf("second Take = %v, %v; want nothing", ok, err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

// TestHookRunAnswersOrExits2: input that is no hook JSON is denied (an
// answer, exit 0); only an answer that cannot be written exits 2, with
// the reason on stderr (Claude Code blocks the call on exit 2).
func TestHookRunAnswersOrExits2(t *testing.T) {
	var out, errOut strings.Builder
	if code := hook.Run(context.Background(), strings.NewReader("not json"), &out, &errOut, hook.Options{}); code != 0 ||
		!strings.Contains(out.String(), `"permissionDecision":"deny"`) {
		t.Errorf("Run(not json) = %d, stdout %q; want 0 and a deny", code, out.String())
	}
	errOut.Reset()
	in := `{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_use_id":"t","tool_input":{"command":"ls"}}`
	if code := hook.Run(context.Background(), strings.NewReader(in), failingWriter{}, &errOut, hook.Options{Problem: "COUNTERSIGN_API_KEY: required"}); code != 2 ||
		!strings.Contains(errOut.String(), "blocking the call") {
		t.Errorf("Run(stdout failing) = %d, stderr %q; want 2 and why", code, errOut.String())
	}
}
