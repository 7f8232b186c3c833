package bot_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/bot/slacksim"
)

// cardClickPayload is a block_actions payload as Slack sends it for a click
// on a card: the message clicked comes whole, blocks and all.
func cardClickPayload(blocks json.RawMessage) []byte {
	p, _ := json.Marshal(map[string]any{
		"type": "block_actions", "user": map[string]any{"id": "U0BOB0001", "team_id": "T0DEMO001", "name": "bob"},
		"api_app_id": "A0APP0001", "token": "t", "trigger_id": "1.2.abc",
		"container": map[string]any{"type": "message", "message_ts": "1700000000.000100", "channel_id": "G0APPROV1", "is_ephemeral": false},
		"team":      map[string]any{"id": "T0DEMO001", "domain": "demo"}, "channel": map[string]any{"id": "G0APPROV1", "name": "approvals"},
		"state": map[string]any{"values": map[string]any{}}, "response_url": "https://hooks.slack.com/actions/x",
		"message": map[string]any{"type": "message", "ts": "1700000000.000100", "bot_id": "B0BOT0001", "text": "card",
			"blocks": blocks, "attachments": []any{map[string]any{"text": "a \"}\" ]"}},
			"metadata": map[string]any{"event_type": "countersign_card", "event_payload": map[string]any{"request_id": "req_1"}}},
		"actions": []any{map[string]any{"action_id": "cs_approve", "block_id": "decide", "value": "req_1", "type": "button"}},
	})
	return p
}

// TestWithoutBlocks: a click's payload is read without the blocks of the
// card it carries, and what the bot reads of it is the same as from the
// whole payload; the payload itself is left as it came.
func TestWithoutBlocks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	card := h.card(h.request(func(*approval.Request) {}))
	full := cardClickPayload(card.Blocks)
	orig := bytes.Clone(full)
	out := bot.WithoutBlocks(full)
	if !bytes.Equal(full, orig) {
		t.Fatal("withoutBlocks changed the payload it was given")
	}
	if bytes.Contains(out, []byte(`"blocks"`)) || bytes.Contains(out, []byte(`"attachments"`)) || len(out) >= len(full)-len(card.Blocks) {
		t.Errorf("the card's blocks are still there (%d of %d bytes):\n%s", len(out), len(full), out)
	}
	whole, err := bot.DecodeInteraction(full, false)
	if err != nil {
		t.Fatal(err)
	}
	trimmed, err := bot.DecodeInteraction(full, true)
	if err != nil {
		t.Fatalf("the payload without blocks does not decode: %v\n%s", err, out)
	}
	if !reflect.DeepEqual(whole, trimmed) {
		t.Errorf("read without blocks: %+v\nwhole: %+v", trimmed, whole)
	}
	for _, p := range []string{`{"type":"view_submission","view":{"id":"V1"}}`, `{"message":"x"}`, `{"message":{"blocks":[}`, `[]`} {
		if got := bot.WithoutBlocks([]byte(p)); string(got) != p {
			t.Errorf("withoutBlocks(%s) = %s, want it unchanged", p, got)
		}
	}
}

// FuzzWithoutBlocks: whatever the payload, what the bot reads of it
// without the message's blocks is what it reads of it whole, whenever the
// whole decodes; and the payload given is never changed.
func FuzzWithoutBlocks(f *testing.F) {
	f.Add(cardClickPayload(json.RawMessage(`[{"type":"section","text":{"type":"mrkdwn","text":"x \"}\""}}]`)))
	f.Add([]byte(`{"type":"block_actions","message":{"blocks":[],"ts":"1","blocks":[1]},"message":{"bot_id":"B"}}`))
	f.Add([]byte(`{"message":{"\u0062locks":{},"ts":"1"}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		orig := bytes.Clone(payload)
		whole, err := bot.DecodeInteraction(payload, false)
		trimmed, terr := bot.DecodeInteraction(payload, true)
		if !bytes.Equal(payload, orig) {
			t.Fatalf("the payload changed: %q became %q", orig, payload)
		}
		if err != nil {
			return // the whole is refused; the trimmed may be read: only a forged payload is malformed JSON
		}
		if terr != nil {
			t.Fatalf("%q decodes whole, not without its blocks (%q): %v", orig, bot.WithoutBlocks(payload), terr)
		}
		if !reflect.DeepEqual(whole, trimmed) {
			t.Fatalf("%q: read without blocks %+v, whole %+v", orig, trimmed, whole)
		}
	})
}

// BenchmarkClickPayload reads a click's payload as onInteraction does
// (trimmed: without the card's blocks) and as it did (whole).
//
//	go test ./bot -run '^$' -bench ClickPayload -benchmem
func BenchmarkClickPayload(b *testing.B) {
	h := newHarness(b, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	payload := cardClickPayload(h.card(h.request(func(*approval.Request) {})).Blocks)
	for _, trim := range []bool{true, false} {
		name := map[bool]string{true: "trimmed", false: "whole"}[trim]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := bot.DecodeInteraction(payload, trim); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(payload)), "payload-bytes")
		})
	}
}
