package approval_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// canonicalAsWritten is Entry.Canonical as every entry so far was hashed
// (a bytes.Buffer and one fmt.Fprintf): Canonical must keep its bytes, or
// the verifier would report every existing entry as edited.
func canonicalAsWritten(e approval.Entry) []byte {
	data, err := canonicalJSONAsWritten(e.Data)
	if err != nil {
		data = e.Data
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d\n%s\n%q\n%q\n%q\n%q\n%q\n", e.Seq, e.Time.UTC().Format(time.RFC3339Nano),
		string(e.Event), e.RequestID, e.RunID, e.Actor, e.Tool)
	b.Write(data)
	if e.TraceID != "" {
		fmt.Fprintf(&b, "\ntrace_id %q", e.TraceID)
	}
	return b.Bytes()
}

// canonicalJSONAsWritten is approval.Canonical as every digest and entry
// so far was computed.
func canonicalJSONAsWritten(args json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return []byte("{}"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func hashAsWritten(prev string, e approval.Entry) string {
	h := sha256.New()
	h.Write([]byte(prev))
	h.Write(canonicalAsWritten(e))
	return hex.EncodeToString(h.Sum(nil))
}

// chainFormEntries are entries whose fields test the canonical form's
// edges: quotes, line breaks, invalid UTF-8, a zone other than UTC, a
// negative or zero seq, data that is not JSON, a trace id.
func chainFormEntries() []approval.Entry {
	at := time.Date(2026, 12, 2, 9, 0, 0, 123456789, time.FixedZone("CET", 3600))
	return []approval.Entry{
		{Seq: 1, Time: at, Event: approval.EventDecided, RequestID: "req_1", Actor: "U1", Tool: "refund",
			Data: json.RawMessage(`{"verdict":"approve","digest":"d","created":"2026-12-02T09:00:00Z","decision_ms":1}`)},
		{Seq: 0, Time: time.Time{}, Event: "", Data: nil},
		{Seq: -7, Time: at, Event: "x\"y", RequestID: "a\nb", RunID: "\xc0\xff", Actor: "é\u2028", Tool: "`t`",
			Data: json.RawMessage(`{ "b" : 1.50e3 , "a" : "<&>" }`), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"},
		{Seq: 1 << 62, Time: at.AddDate(-3000, 0, 0), Event: approval.EventAPIRefused, Data: json.RawMessage(`not json`),
			TraceID: "t\n\"q\""},
		{Seq: 42, Time: at, Event: approval.EventExecuted, Data: json.RawMessage(`[1,-0,2.50E+3,null,true,"\u00e9\ud800"]`)},
	}
}

// TestCanonicalAsWritten: Canonical and ChainHash give the bytes and
// hashes entries were always written with.
func TestCanonicalAsWritten(t *testing.T) {
	for i, e := range chainFormEntries() {
		if got, want := e.Canonical(), canonicalAsWritten(e); !bytes.Equal(got, want) {
			t.Errorf("entry %d: Canonical() = %q, want %q", i, got, want)
		}
		if got, want := approval.ChainHash("prev", e), hashAsWritten("prev", e); got != want {
			t.Errorf("entry %d: ChainHash = %s, want %s", i, got, want)
		}
	}
}

// TestChainHashGolden: the hashes of chainFormEntries, chained, as the
// code of every existing stream computed them.
func TestChainHashGolden(t *testing.T) {
	want := []string{
		"92c5d8fc56ab09b117d9258445a65678338aa0d54fec4685e40d8f12e370f793",
		"6cb7918069b50002ca459622e284ce35bb7d2288bdf71eb88402b444faa1e5a1",
		"8afecc5dc2bf5fe3636ca61cb0a3313ddc8a1d71f526c425e762899c2d122583",
		"a02a300b8b2998693554eaab8ae1378899e1587f9368504fe63774b2242e502d",
		"49e2295849b0b24f1fd1099cf2de17a7f49bc89a379f2e797ef616f8ddc9e206",
	}
	prev := ""
	var got []string
	for _, e := range chainFormEntries() {
		prev = approval.ChainHash(prev, e)
		got = append(got, prev)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("chained hashes = %q, want %q", got, want)
	}
}

// FuzzCanonicalAsWritten: whatever an entry holds, Canonical and
// ChainHash are what they always were.
func FuzzCanonicalAsWritten(f *testing.F) {
	for _, e := range chainFormEntries() {
		f.Add(e.Seq, e.Time.UnixNano(), string(e.Event), e.RequestID, e.RunID, e.Actor, e.Tool, []byte(e.Data), e.TraceID, "prev")
	}
	f.Fuzz(func(t *testing.T, seq, nanos int64, event, req, run, actor, tool string, data []byte, trace, prev string) {
		e := approval.Entry{Seq: seq, Time: time.Unix(0, nanos), Event: approval.Event(event), RequestID: req, RunID: run,
			Actor: actor, Tool: tool, Data: data, TraceID: trace}
		if got, want := e.Canonical(), canonicalAsWritten(e); !bytes.Equal(got, want) {
			t.Fatalf("Canonical() = %q, want %q", got, want)
		}
		if got, want := approval.ChainHash(prev, e), hashAsWritten(prev, e); got != want {
			t.Fatalf("ChainHash = %s, want %s", got, want)
		}
		got, err := approval.Canonical(data)
		want, werr := canonicalJSONAsWritten(data)
		if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("Canonical(%q) = %q, %v; want %q, %v", data, got, err, want, werr)
		}
	})
}
