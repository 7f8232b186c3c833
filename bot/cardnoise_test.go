package bot_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
)

// cardBlocks is a card's blocks with their texts, in order.
type cardBlock struct {
	typ  string
	text string
}

func cardBlocksOf(t *testing.T, raw json.RawMessage) []cardBlock {
	t.Helper()
	var blocks []json.RawMessage
	if err := json.Unmarshal(raw, &blocks); err != nil {
		t.Fatal(err)
	}
	out := make([]cardBlock, 0, len(blocks))
	for _, b := range blocks {
		var head struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(b, &head)
		out = append(out, cardBlock{typ: head.Type, text: allText(json.RawMessage("[" + string(b) + "]"))})
	}
	return out
}

// TestCardSaysEachThingOnce (issue 47, the card's noise): the request id
// and the arguments' digest are in one small context line at the card's
// foot, nowhere else; the arguments come in the order the tool's schema
// declares them, the short ones first (an email's to and subject before
// its body); the facts are named by the system of record's label, not by
// a URL; a signal reads as words.
func TestCardSaysEachThingOnce(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	note := "Line one of a long note.\nLine two."
	args, _ := json.Marshal(map[string]any{"note": note, "email": "a@example.com", "amount": 64, "order_id": "1234", "reason": "damaged"})
	r := h.request(func(r *approval.Request) {
		r.Args = args
		r.Preview.Source = "the order system"
	})
	blocks := cardBlocksOf(t, h.card(r).Blocks)
	last := blocks[len(blocks)-1]
	digest := h.load(r.ID).Digest[:12]
	if last.typ != "context" || last.text != "Request `"+r.ID+"` · arguments sha256 `"+digest+"`" {
		t.Errorf("card's last block = %s %q, want the context line with the request id and the digest", last.typ, last.text)
	}
	for _, b := range blocks[:len(blocks)-1] {
		if strings.Contains(b.text, r.ID) || strings.Contains(b.text, digest) || strings.Contains(b.text, "sha256") {
			t.Errorf("%s block repeats the request id or the digest: %q", b.typ, b.text)
		}
	}

	text := allText(h.card(r).Blocks)
	order := []string{"order_id: \"1234\"", "amount: 64", "reason: \"damaged\"", "email: \"a@example.com\"", "`note`", "Line one of a long note."}
	at := -1
	for _, want := range order {
		i := strings.Index(text, want)
		if i < at {
			t.Errorf("arguments out of order: %q comes before what precedes it in %q\n%s", want, order, text)
		}
		at = i
	}
	if !strings.Contains(text, "\nFacts from the order system\n") || strings.Contains(text, "GET ") {
		t.Errorf("facts not named by their system's label:\n%s", text)
	}

	// The status line says when a cancel window ends and how many
	// approvals a call has: the small print does not say it again.
	after := h.request(func(r *approval.Request) {
		r.Mode, r.Decisions = approval.ModeAfter, []approval.Verdict{approval.VerdictCancel, approval.VerdictRunNow}
	})
	two := h.request(func(r *approval.Request) { r.Quorum = 2 })
	for name, tt := range map[string]struct {
		r    *approval.Request
		once string
	}{
		"the cancel window's end": {after, "<!date^" + strconv.FormatInt(after.Deadline.Unix(), 10) + "^"},
		"the quorum":              {two, "0 of 2 approvals"},
	} {
		if n := strings.Count(allText(h.card(tt.r).Blocks), tt.once); n != 1 {
			t.Errorf("the card says %s (%q) %d times, want once:\n%s", name, tt.once, n, allText(h.card(tt.r).Blocks))
		}
	}
}

// TestBashCardShowsTheCommandOnce (issue 47): a coding agent's shell
// command through the API (the Claude Code hook sends it as an argument
// and again as a "Command" fact) is on its card once: in the arguments,
// neither in the "What will happen" sentence nor among the caller's facts;
// the caller's other facts stay.
func TestBashCardShowsTheCommandOnce(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true, policy: externalPolicy})
	const command = "rm -rf build && make release"
	r := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared = "Bash", true
		r.Caller, r.Requester, r.Origin = approval.Caller{Kind: approval.CallerAPI, Name: "claude-code"}, "api:claude-code", approval.Origin{}
		r.Args = json.RawMessage(`{"command":"rm -rf build \u0026\u0026 make release","description":"Clean and release"}`)
		r.Reason = ""
		r.Preview = approval.Preview{CallerFacts: []approval.Fact{{Label: "Command", Value: command}, {Label: "Working directory", Value: "/repo"}}}
	})
	text := allText(h.card(r).Blocks)
	if n := strings.Count(text, "rm -rf build"); n != 1 {
		t.Errorf("the command is on the card %d times, want once:\n%s", n, text)
	}
	if !strings.Contains(text, `command: "rm -rf build &amp;&amp; make release"`) || !strings.Contains(text, "*Working directory*\n/repo") {
		t.Errorf("card lacks the command argument or the working directory:\n%s", text)
	}
}

// TestEditModalShowsJSONAsWritten (issue 47): the Edit modal of a tool the
// policy does not declare shows the arguments as indented JSON with every
// character as itself: "&&", not "\u0026\u0026" (how a caller's encoder
// may have escaped it); a nested value of a declared tool's JSON field
// reads the same way.
func TestEditModalShowsJSONAsWritten(t *testing.T) {
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, policy: func(f *policyfile.File) {
		externalPolicy(f)
	}})
	r := h.request(func(r *approval.Request) {
		r.Tool, r.Undeclared = "Bash", true
		r.Caller, r.Requester, r.Origin = approval.Caller{Kind: approval.CallerAPI, Name: "claude-code"}, "api:claude-code", approval.Origin{}
		r.Args = json.RawMessage(`{"command":"rm -rf build \u0026\u0026 make release","cwd":"/repo \u003csrc\u003e"}`)
	})
	want := "{\n  \"command\": \"rm -rf build && make release\",\n  \"cwd\": \"/repo <src>\"\n}"
	if got := initialValue(t, h.editModalOf(bob, r), "args_json"); got != want {
		t.Errorf("edit modal's JSON = %q, want %q", got, want)
	}

	declared := h.request(func(r *approval.Request) {
		r.Args = json.RawMessage(`{"order_id":"1234","amount":64,"meta":{"note":"a \u0026 b","tags":["x"]}}`)
	})
	want = "{\n  \"note\": \"a & b\",\n  \"tags\": [\n    \"x\"\n  ]\n}"
	if got := initialValue(t, h.editModalOf(bob, declared), "f6"); got != want {
		t.Errorf("edit modal's meta field = %q, want %q", got, want)
	}
}

// initialValue is the initial value of the input in block blockID of v.
func initialValue(t *testing.T, v slacksim.View, blockID string) string {
	t.Helper()
	var blocks []struct {
		BlockID string `json:"block_id"`
		Element struct {
			InitialValue string `json:"initial_value"`
		} `json:"element"`
	}
	if err := json.Unmarshal(v.Blocks, &blocks); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		if b.BlockID == blockID {
			return b.Element.InitialValue
		}
	}
	t.Fatalf("no block %s in the modal: %s", blockID, v.Blocks)
	return ""
}
