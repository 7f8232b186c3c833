package auditreport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// memLog is an audit stream in memory: entries in order, ids "1-0", "2-0"…
// Verify answers verifyErr; Follow delivers followed, then ends with
// context.Canceled as Ctrl-C would.
type memLog struct {
	entries   []approval.Entry
	followed  []approval.Entry
	verifyErr error
}

func (l *memLog) Range(_ context.Context, afterID string, count int64) ([]approval.Entry, error) {
	var out []approval.Entry
	for _, e := range l.entries {
		if (afterID == "" || streamLess(afterID, e.ID)) && int64(len(out)) < count {
			out = append(out, e)
		}
	}
	return out, nil
}

func (l *memLog) RevRange(_ context.Context, beforeID string, count int64) ([]approval.Entry, error) {
	var out []approval.Entry
	for _, e := range slices.Backward(l.entries) {
		if (beforeID == "" || streamLess(e.ID, beforeID)) && int64(len(out)) < count {
			out = append(out, e)
		}
	}
	return out, nil
}

func (l *memLog) Verify(context.Context) (int, error) { return len(l.entries), l.verifyErr }

func (l *memLog) Follow(_ context.Context, _ string, fn func(approval.Entry) error) error {
	for _, e := range l.followed {
		if err := fn(e); err != nil {
			return err
		}
	}
	return context.Canceled
}

// streamLess orders the test's ids "<n>-0" (and IDBefore's "<n>-<max>").
func streamLess(a, b string) bool {
	ms := func(id string) string { s, _, _ := strings.Cut(id, "-"); return s }
	if len(ms(a)) != len(ms(b)) {
		return len(ms(a)) < len(ms(b))
	}
	if ms(a) != ms(b) {
		return ms(a) < ms(b)
	}
	return len(a) < len(b) || len(a) == len(b) && a < b
}

func entry(n int, ev approval.Event, req string) approval.Entry {
	id := strconv.Itoa(n) + "-0"
	return approval.Entry{ID: id, Seq: int64(n), Time: time.Date(2026, 12, 3, 10, n, 0, 0, time.UTC), Event: ev,
		RequestID: req, Tool: "refund", Actor: "U1"}
}

// TestTail: the last n entries oldest first, then followed ones; JSON is
// one object a line.
func TestTail(t *testing.T) {
	log := &memLog{
		entries:  []approval.Entry{entry(1, approval.EventRequested, "req_a"), entry(2, approval.EventDecided, "req_a"), entry(3, approval.EventExecuted, "req_a")},
		followed: []approval.Entry{entry(4, approval.EventRequested, "req_b")},
	}
	var out bytes.Buffer
	if err := auditreport.Tail(context.Background(), log, &out, 2, false, true); err != nil {
		t.Fatalf("Tail: %v", err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e approval.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("Tail --json line %q: %v", line, err)
		}
		ids = append(ids, e.ID)
	}
	if want := []string{"2-0", "3-0"}; !slices.Equal(ids, want) {
		t.Errorf("Tail -n 2 --json ids = %v, want %v", ids, want)
	}
	out.Reset()
	err := auditreport.Tail(context.Background(), log, &out, 1, true, false)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Tail -f = %v, want the follow's end (context.Canceled)", err)
	}
	if got := strings.Count(out.String(), "\n"); got != 2 || !strings.Contains(out.String(), "req_b") {
		t.Errorf("Tail -n 1 -f printed %q, want the last entry and the followed one", out.String())
	}
}

// TestVerify: an intact chain says how many entries it checked; a broken
// one says BROKEN and names the first bad entry (intact false, no error);
// a stream that cannot be read is an error.
func TestVerify(t *testing.T) {
	entries := []approval.Entry{entry(1, approval.EventRequested, "req_a"), entry(2, approval.EventDecided, "req_a")}
	for _, tt := range []struct {
		name       string
		verifyErr  error
		asJSON     bool
		wantIntact bool
		wantErr    bool
		want       []string
	}{
		{name: "intact", wantIntact: true, want: []string{"audit chain intact: 2 entries"}},
		{name: "broken", verifyErr: &approval.ChainError{Index: 1, ID: "2-0", Seq: 2, Why: "hash mismatch"},
			want: []string{"audit chain BROKEN", "hash mismatch", "first bad entry:", "req_a"}},
		{name: "broken json", verifyErr: &approval.ChainError{Index: 1, ID: "2-0", Seq: 2, Why: "hash mismatch"}, asJSON: true,
			want: []string{`"intact":false`, `"break":`, `"entry":{`}},
		{name: "unreadable", verifyErr: errors.New("connection refused"), wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			intact, err := auditreport.Verify(context.Background(), &memLog{entries: entries, verifyErr: tt.verifyErr}, &out, tt.asJSON)
			if intact != tt.wantIntact || (err != nil) != tt.wantErr {
				t.Fatalf("Verify = %v, %v, want intact %v, error %v", intact, err, tt.wantIntact, tt.wantErr)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("Verify printed %q, want it to contain %q", out.String(), w)
				}
			}
		})
	}
}

// TestEmpty: an empty stream says so; one entry is enough not to be.
func TestEmpty(t *testing.T) {
	for _, tt := range []struct {
		name string
		log  *memLog
		want bool
	}{
		{"empty", &memLog{}, true},
		{"one entry", &memLog{entries: []approval.Entry{entry(1, approval.EventRequested, "req_a")}}, false},
	} {
		if got, err := auditreport.Empty(context.Background(), tt.log); got != tt.want || err != nil {
			t.Errorf("Empty(%s) = %v, %v, want %v", tt.name, got, err, tt.want)
		}
	}
}

// TestCommandRun: each command name runs its command; ok is false only
// for a request show does not find and a broken chain; an unknown name is
// an error.
func TestCommandRun(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	entries := []approval.Entry{entry(1, approval.EventRequested, "req_a"), entry(2, approval.EventDecided, "req_a")}
	broken := &approval.ChainError{Index: 1, ID: "2-0", Seq: 2, Why: "hash mismatch"}
	// The test's stream ids ("1-0") are milliseconds after 1970: export
	// and stats read back that far.
	for _, tt := range []struct {
		name   string
		c      auditreport.Command
		log    *memLog
		wantOK bool
		want   string
	}{
		{"tail", auditreport.Command{Name: "tail", N: 1}, &memLog{entries: entries}, true, "2-0"},
		{"show", auditreport.Command{Name: "show", RequestID: "req_a"}, &memLog{entries: entries}, true, "req_a"},
		{"show missing", auditreport.Command{Name: "show", RequestID: "req_b"}, &memLog{entries: entries}, false, ""},
		{"verify", auditreport.Command{Name: "verify"}, &memLog{entries: entries}, true, "intact"},
		{"verify broken", auditreport.Command{Name: "verify"}, &memLog{entries: entries, verifyErr: broken}, false, "BROKEN"},
		{"export", auditreport.Command{Name: "export", Since: now.Sub(time.Unix(0, 0))}, &memLog{entries: entries}, true, `"req_a"`},
		{"stats", auditreport.Command{Name: "stats", Since: now.Sub(time.Unix(0, 0)), JSON: true}, &memLog{entries: entries}, true, "{"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			ok, err := tt.c.Run(context.Background(), tt.log, &out, now)
			if err != nil || ok != tt.wantOK || !strings.Contains(out.String(), tt.want) {
				t.Errorf("Run = %v, %v, printed %q; want ok %v, printing %q", ok, err, out.String(), tt.wantOK, tt.want)
			}
		})
	}
	if _, err := (auditreport.Command{Name: "bogus"}).Run(context.Background(), &memLog{}, &bytes.Buffer{}, now); err == nil {
		t.Error(`Run(Name "bogus") = nil error, want one`)
	}
}
