package approval_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// chain builds n correctly chained entries.
func chain(n int) []approval.Entry {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	var out []approval.Entry
	prev := ""
	for i := 1; i <= n; i++ {
		e := approval.Entry{
			ID:       fmt.Sprintf("%d-0", i),
			Seq:      int64(i),
			Time:     t0.Add(time.Duration(i) * time.Second),
			Event:    approval.EventProposed,
			Actor:    "U1",
			Tool:     "refund",
			Data:     json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
			PrevHash: prev,
		}
		e.Hash = approval.ChainHash(prev, e)
		prev = e.Hash
		out = append(out, e)
	}
	return out
}

func verify(entries []approval.Entry) (int, error) {
	var v approval.ChainVerifier
	for _, e := range entries {
		if err := v.Next(e); err != nil {
			return v.Checked(), err
		}
	}
	return v.Checked(), nil
}

func TestChainVerifier(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func([]approval.Entry) []approval.Entry
		wantIndex int // -1: intact
	}{
		{"intact", func(e []approval.Entry) []approval.Entry { return e }, -1},
		{"empty", func([]approval.Entry) []approval.Entry { return nil }, -1},
		{"trimmed start (MAXLEN) is intact", func(e []approval.Entry) []approval.Entry { return e[2:] }, -1},
		{"edited data", func(e []approval.Entry) []approval.Entry {
			e[3].Data = json.RawMessage(`{"n":999}`)
			return e
		}, 3},
		{"edited actor", func(e []approval.Entry) []approval.Entry { e[2].Actor = "U2"; return e }, 2},
		{"edited time", func(e []approval.Entry) []approval.Entry { e[4].Time = e[4].Time.Add(time.Nanosecond); return e }, 4},
		{"deleted middle", func(e []approval.Entry) []approval.Entry { return append(e[:2], e[3:]...) }, 2},
		{"reordered", func(e []approval.Entry) []approval.Entry { e[1], e[2] = e[2], e[1]; return e }, 1},
		{"inserted", func(e []approval.Entry) []approval.Entry {
			x := e[1]
			x.Data = json.RawMessage(`{"n":"forged"}`)
			x.Hash = approval.ChainHash(x.PrevHash, x)
			return append(e[:2], append([]approval.Entry{x}, e[2:]...)...)
		}, 2},
		{"first entry seq 1 with a prev hash", func(e []approval.Entry) []approval.Entry {
			e[0].PrevHash = "ab"
			return e
		}, 0},
		{"first entry without prev hash after a trim", func(e []approval.Entry) []approval.Entry {
			e[1].PrevHash = ""
			return e[1:]
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entries := tt.mutate(chain(6))
			checked, err := verify(entries)
			if tt.wantIndex < 0 {
				if err != nil {
					t.Fatalf("verify = %v, want intact", err)
				}
				if checked != len(entries) {
					t.Errorf("checked = %d, want %d", checked, len(entries))
				}
				return
			}
			var ce *approval.ChainError
			if !errors.As(err, &ce) {
				t.Fatalf("verify = %v, want *ChainError", err)
			}
			if ce.Index != tt.wantIndex {
				t.Errorf("ChainError.Index = %d (%v), want %d", ce.Index, ce, tt.wantIndex)
			}
		})
	}
}

// TestCanonicalFieldBoundaries checks that text cannot be moved from one
// field to the next without changing the hash.
func TestCanonicalFieldBoundaries(t *testing.T) {
	a := approval.Entry{Seq: 1, Event: "x", Actor: "a\nb", Tool: "c"}
	b := approval.Entry{Seq: 1, Event: "x", Actor: "a", Tool: "b\nc"}
	if approval.ChainHash("", a) == approval.ChainHash("", b) {
		t.Errorf("ChainHash equal for Actor %q/Tool %q and Actor %q/Tool %q", a.Actor, a.Tool, b.Actor, b.Tool)
	}
}

// TestCanonicalDataForm checks that the hash does not depend on how the
// data JSON is spaced or ordered, only on its content.
func TestCanonicalDataForm(t *testing.T) {
	a := approval.Entry{Seq: 1, Event: "x", Data: json.RawMessage(`{"b":1,"a":[1, 2]}`)}
	b := approval.Entry{Seq: 1, Event: "x", Data: json.RawMessage(`{"a":[1,2],"b":1}`)}
	if approval.ChainHash("", a) != approval.ChainHash("", b) {
		t.Errorf("ChainHash differs for equal data %s and %s", a.Data, b.Data)
	}
	c := approval.Entry{Seq: 1, Event: "x", Data: json.RawMessage(`{"a":[1,2],"b":1.0}`)}
	if approval.ChainHash("", a) == approval.ChainHash("", c) {
		t.Errorf("ChainHash equal for %s and %s, numbers must be kept as written", a.Data, c.Data)
	}
}

// TestChainTraceID: entries written before trace ids existed hash as they
// did then (their hashes, computed by that code, are pinned here), and a
// trace id is covered by the hash once an entry has one.
func TestChainTraceID(t *testing.T) {
	// Hashes of chain(3) as written by the code before trace ids.
	before := []string{
		"d2bdaa39f765bf79d8cc42ec319c7901c3215afc3fd9f9d5c06c2b84a805bfb7",
		"ba4fb307c21c1addc0d776747d68889f56d4a4a51485f7f26c58ad6d0803e838",
		"1a2e3fa3b01dfaa377245d5ee39e95b2b38e6cc09067743c751c30a2ccf244c9",
	}
	old := chain(3)
	for i, e := range old {
		if e.Hash != before[i] {
			t.Errorf("hash of entry %d without a trace id = %s, want %s (as before trace ids)", e.Seq, e.Hash, before[i])
		}
	}
	// A newer entry with a trace id continues the old chain.
	traced := old[2]
	traced.Seq, traced.PrevHash, traced.ID = 4, old[2].Hash, "4-0"
	traced.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	traced.Hash = approval.ChainHash(traced.PrevHash, traced)
	if traced.Hash == approval.ChainHash(traced.PrevHash, approval.Entry{Seq: 4, Time: traced.Time, Event: traced.Event,
		Actor: traced.Actor, Tool: traced.Tool, Data: traced.Data}) {
		t.Errorf("the trace id does not change the hash")
	}
	tests := []struct {
		name      string
		mutate    func(*approval.Entry)
		wantIndex int // -1: intact
	}{
		{"intact", func(*approval.Entry) {}, -1},
		{"trace id edited", func(e *approval.Entry) { e.TraceID = "00000000000000000000000000000001" }, 3},
		{"trace id removed", func(e *approval.Entry) { e.TraceID = "" }, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := traced
			tc.mutate(&e)
			_, err := verify(append(chain(3), e))
			var ce *approval.ChainError
			switch {
			case tc.wantIndex < 0 && err != nil:
				t.Errorf("verify = %v, want intact", err)
			case tc.wantIndex >= 0 && (!errors.As(err, &ce) || ce.Index != tc.wantIndex):
				t.Errorf("verify = %v, want a break at %d", err, tc.wantIndex)
			}
		})
	}
}
