package bot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/slack-go/slack"

	"github.com/countersign/countersign/bot"
)

// TestSlackOKParsing: the transport finds a reply's top-level "ok" in its
// head, even cut short, and nowhere else. (The calls it tells of, through
// the real slack-go client, are checked by the metrics' flow test,
// TestMetricsScrapeAfterFlow.)
func TestSlackOKParsing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body      string
		ok, found bool
	}{
		{`{"ok":true}`, true, true},
		{`{"ok":false,"error":"x"}`, false, true},
		{`{"warning":"w","response_metadata":{"ok":false},"ok":true}`, true, true},
		{`{"ok":fal`, false, false},
		{`{"channel":"C1","ok":false,"messages":[`, false, true}, // cut short after ok
		{`not json`, false, false},
	}
	for _, tt := range tests {
		ok, found := bot.SlackOK([]byte(tt.body))
		if ok != tt.ok || found != tt.found {
			t.Errorf("slackOK(%q) = %v, %v; want %v, %v", tt.body, ok, found, tt.ok, tt.found)
		}
	}
}

// TestWithoutMessage: the echo of a posted or updated message is taken
// out of a reply wherever it stands, strings holding brackets, quotes and
// escapes skipped whole; the reply's top-level "ok" is found, not one
// inside the echo; what is not one JSON object the walk can follow is
// left as it was.
func TestWithoutMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, out    string
		ok, walked bool
	}{
		{`{"ok":true,"channel":"C1","ts":"1.2","message":{"text":"a \"}]\" b","blocks":[{"type":"section"}]}}`,
			`{"ok":true,"channel":"C1","ts":"1.2"}`, true, true},
		{`{"message":{"x":[1,2]}, "ok":false,"error":"e"}`, `{ "ok":false,"error":"e"}`, false, true},
		{`{"ok":true,"message":{},"ts":"1"}`, `{"ok":true,"ts":"1"}`, true, true},
		{`{"message":"m"}`, `{}`, false, true},
		{`{"ok":true,"ts":"1"}`, `{"ok":true,"ts":"1"}`, true, true},
		{"{\n \"ok\" : true ,\n \"message\" : [ ] \n}\n", "{\n \"ok\" : true  \n}\n", true, true},
		{`{"message":{"ok":true},"ok":false}`, `{"ok":false}`, false, true},
		{`{"ok":true,"message":{"text":"a\\"},"ts":"1"}`, `{"ok":true,"ts":"1"}`, true, true},
		{`{"\u006fk":true,"m\u0065ssage":{"text":"x"}}`, `{"\u006fk":true}`, true, true},
		{`{"ok":true,"message":{"text":"unterminated}`, `{"ok":true,"message":{"text":"unterminated}`, false, false},
		{`{"ok":true,"message":{"a":1}`, `{"ok":true,"message":{"a":1}`, false, false},
		{`{"ok":true} {}`, `{"ok":true} {}`, false, false},
		{`{"ok":true,}`, `{"ok":true,}`, false, false},
		{`{"ok" true}`, `{"ok" true}`, false, false},
		{`[{"message":1}]`, `[{"message":1}]`, false, false},
		{`not json`, `not json`, false, false},
		{``, ``, false, false},
	}
	for _, tt := range tests {
		out, ok, walked := bot.WithoutMessage([]byte(tt.in))
		if string(out) != tt.out || ok != tt.ok || walked != tt.walked {
			t.Errorf("withoutMessage(%q) = %q, %v, %v; want %q, %v, %v", tt.in, out, ok, walked, tt.out, tt.ok, tt.walked)
		}
	}
}

// FuzzWithoutMessage: for any JSON object, the reply handed on decodes to
// the same members less "message", and "ok" is what a decoder reads; for
// anything else the walk either gives up, leaving the bytes as they were,
// or hands on bytes the caller's decoder then judges.
func FuzzWithoutMessage(f *testing.F) {
	for _, s := range []string{`{"ok":true,"message":{"blocks":[{"t":"a\"}"}]},"ts":"1"}`, `{"message":1}`,
		`{"ok":false,"error":"x","message":null}`, `{"ok":true,"message":{"ok":false}}`, `{"a":[1,{"b":"\\"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := bytes.Clone(in)
		out, ok, walked := bot.WithoutMessage(in)
		if !walked {
			if !bytes.Equal(out, orig) {
				t.Fatalf("not walked, yet %q became %q", orig, out)
			}
			return
		}
		var want map[string]json.RawMessage
		if json.Unmarshal(orig, &want) != nil {
			return // not JSON: the caller's decoder refuses what is left
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q became %q, not JSON: %v", orig, out, err)
		}
		var wantOK bool
		_ = json.Unmarshal(want["ok"], &wantOK)
		if ok != wantOK {
			t.Errorf("ok = %v for %q, a decoder reads %v", ok, orig, wantOK)
		}
		delete(want, "message")
		delete(got, "message") // a second "message", or one spelt with escapes, stays: harmless
		if len(got) != len(want) {
			t.Fatalf("%q became %q: members %v, want %v", orig, out, got, want)
		}
		for k, v := range want {
			if !bytes.Equal(bytes.TrimSpace(got[k]), bytes.TrimSpace(v)) {
				t.Fatalf("%q became %q: %s = %s, want %s", orig, out, k, got[k], v)
			}
		}
	})
}

// recordedCalls is a SlackCalls that counts what it is told.
type recordedCalls struct {
	mu                        sync.Mutex
	requests, errors, limited []string
}

func (c *recordedCalls) SlackRequest(method, status string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = append(c.requests, method+" "+status)
}

func (c *recordedCalls) SlackError(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errors = append(c.errors, method)
}

func (c *recordedCalls) SlackRateLimited(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limited = append(c.limited, method)
}

// echoReply is a Slack reply to chat.postMessage or chat.update for a
// message with blocks: the message echoed whole, as Slack does.
func echoReply(ok bool, blocks string) string {
	if !ok {
		return `{"ok":false,"error":"channel_not_found"}`
	}
	return `{"ok":true,"channel":"C0APPROV1","ts":"1700000000.000100","text":"card","message":{"type":"message","user":"U0BOT0001",` +
		`"text":"card","ts":"1700000000.000100","bot_id":"B0BOT0001","blocks":` + blocks + `}}`
}

// echoServer answers every Web API call with reply, as JSON.
func echoServer(t testing.TB, reply func(method string) string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, reply(path.Base(r.URL.Path)))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// seen is a client-side RoundTripper over next that keeps the reply
// bodies slack-go gets.
type seen struct {
	next   http.RoundTripper
	mu     sync.Mutex
	bodies []string
}

func (s *seen) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	s.mu.Lock()
	s.bodies = append(s.bodies, string(body))
	s.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), iotest.ErrReader(err)))
	}
	return resp, nil
}

// TestSlackTransportTrimsEchoes, through the real slack-go client: the
// replies of chat.postMessage and chat.update reach slack-go without the
// message they echo, and it still returns their channel, ts and text; an
// "ok": false is still an error, told once; a reply longer than the trim
// reads whole, and the replies of other methods, reach it as they came.
func TestSlackTransportTrimsEchoes(t *testing.T) {
	t.Parallel()
	blocks := `[{"type":"section","text":{"type":"mrkdwn","text":"refund \"}\" $60"}}]`
	long := `[{"type":"section","text":{"type":"mrkdwn","text":"` + strings.Repeat("x", bot.MaxTrim) + `"}}]`
	srv := echoServer(t, func(method string) string {
		switch method {
		case "chat.postMessage":
			return echoReply(true, blocks)
		case "chat.update":
			return echoReply(true, long)
		case "chat.postEphemeral":
			return `{"ok":true,"message_ts":"1700000000.000200"}`
		}
		return echoReply(false, "")
	})
	calls := &recordedCalls{}
	tap := &seen{next: bot.Transport(nil, calls)}
	api := slack.New("xoxb-test", slack.OptionAPIURL(srv.URL+"/api/"), slack.OptionHTTPClient(&http.Client{Transport: tap}))
	ctx := context.Background()

	ch, ts, err := api.PostMessageContext(ctx, "C0APPROV1", slack.MsgOptionText("card", false))
	if err != nil || ch != "C0APPROV1" || ts != "1700000000.000100" {
		t.Fatalf("PostMessage = %q, %q, %v", ch, ts, err)
	}
	ch, ts, text, err := api.UpdateMessageContext(ctx, "C0APPROV1", "1700000000.000100", slack.MsgOptionText("card", false))
	if err != nil || ch != "C0APPROV1" || ts != "1700000000.000100" || text != "card" {
		t.Fatalf("UpdateMessage (a reply over the trim's bound) = %q, %q, %q, %v", ch, ts, text, err)
	}
	if _, err := api.PostEphemeralContext(ctx, "C0APPROV1", "U0ALICE01", slack.MsgOptionText("hi", false)); err != nil {
		t.Fatalf("PostEphemeral: %v", err)
	}
	if _, _, err := api.DeleteMessageContext(ctx, "C0APPROV1", "1"); err == nil || !strings.Contains(err.Error(), "channel_not_found") {
		t.Fatalf("chat.delete answered ok: false, slack-go says %v", err)
	}
	srvFail := echoServer(t, func(string) string { return echoReply(false, "") })
	failing := slack.New("xoxb-test", slack.OptionAPIURL(srvFail.URL+"/api/"), slack.OptionHTTPClient(&http.Client{Transport: tap}))
	if _, _, err := failing.PostMessageContext(ctx, "C0NOPE", slack.MsgOptionText("x", false)); err == nil || !strings.Contains(err.Error(), "channel_not_found") {
		t.Fatalf("chat.postMessage answered ok: false, slack-go says %v", err)
	}

	want := []string{
		`{"ok":true,"channel":"C0APPROV1","ts":"1700000000.000100","text":"card"}`,
		echoReply(true, long),
		`{"ok":true,"message_ts":"1700000000.000200"}`,
		echoReply(false, ""),
		echoReply(false, ""),
	}
	if len(tap.bodies) != len(want) {
		t.Fatalf("slack-go got %d replies, want %d", len(tap.bodies), len(want))
	}
	for i, w := range want {
		if tap.bodies[i] != w {
			t.Errorf("reply %d reached slack-go as %.200q, want %.200q", i, tap.bodies[i], w)
		}
	}
	if want := []string{"chat.delete", "chat.postMessage"}; !slices.Equal(calls.errors, want) {
		t.Errorf("errors told: %v, want %v", calls.errors, want)
	}
	if len(calls.requests) != 5 {
		t.Errorf("calls told: %v, want 5", calls.requests)
	}
}

// TestSlackTransportTrimKeepsAReadError: a reply cut off mid-read fails
// slack-go's read with that error, as it did before the trim read it.
func TestSlackTransportTrimKeepsAReadError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, `{"ok":true,"channel":"C1","ts":"1","message":{"text":`)
	}))
	t.Cleanup(srv.Close)
	api := slack.New("xoxb-test", slack.OptionAPIURL(srv.URL+"/api/"),
		slack.OptionHTTPClient(&http.Client{Transport: bot.Transport(nil, &recordedCalls{})}))
	if _, _, err := api.PostMessageContext(context.Background(), "C1", slack.MsgOptionText("x", false)); err == nil ||
		!strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("a reply cut short: slack-go says %v, want unexpected EOF", err)
	}
}

// BenchmarkSlackCardRedraw is one chat.update of a pending refund card, as
// the bot's client makes it: slack-go through the transport serve wires,
// to a server answering as Slack does, with the card echoed whole.
//
//	go test ./bot -run '^$' -bench SlackCardRedraw -benchmem
func BenchmarkSlackCardRedraw(b *testing.B) {
	h := newHarness(b, harnessConfig{delivery: slacksim.SocketMode, noSocket: true})
	r := h.request(nil)
	card := h.card(r)
	srv := echoServer(b, func(string) string { return echoReply(true, string(card.Blocks)) })
	api := slack.New("xoxb-test", slack.OptionAPIURL(srv.URL+"/api/"),
		slack.OptionHTTPClient(&http.Client{Transport: bot.Transport(nil, &recordedCalls{})}))
	var blocks slack.Blocks
	if err := json.Unmarshal(card.Blocks, &blocks); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		if _, _, _, err := api.UpdateMessageContext(ctx, card.Channel, card.TS, slack.MsgOptionBlocks(blocks.BlockSet...)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(card.Blocks)), "card-bytes")
}
